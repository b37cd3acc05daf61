package optim

import (
	"math"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// textbook is Adam, AdamW, SGD and momentum as written in their papers
// (weight decay as Loshchilov and Hutter's AdamW, or as L2 added to the
// gradient), on one scalar parameter, for comparison.
func textbook(o Spec, p float64, grads []float64) float64 {
	var m, v, buf float64
	for t, g := range grads {
		if o.Name == "adamw" {
			p -= o.LR * o.WeightDecay * p
		} else {
			g += o.WeightDecay * p
		}
		switch {
		case o.Name == "adam" || o.Name == "adamw":
			m = o.Beta1*m + (1-o.Beta1)*g
			v = o.Beta2*v + (1-o.Beta2)*g*g
			mh := m / (1 - math.Pow(o.Beta1, float64(t+1)))
			vh := v / (1 - math.Pow(o.Beta2, float64(t+1)))
			p -= o.LR * mh / (math.Sqrt(vh) + o.Eps)
		case o.Momentum > 0:
			buf = o.Momentum*buf + g
			p -= o.LR * buf
		default:
			p -= o.LR * g
		}
	}
	return p
}

func TestOptimizersMatchTextbook(t *testing.T) {
	grads := []float64{0.5, -0.25, 0.125, 1.5, -2, 0.01, 0}
	cases := []Spec{
		{Name: "sgd", LR: 0.1},
		{Name: "sgd", LR: 0.1, Momentum: 0.9},
		{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		{Name: "adam", LR: 0.001, Beta1: 0.5, Beta2: 0.9, Eps: 1e-3},
		{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
		{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
		{Name: "sgd", LR: 0.1, Momentum: 0.9, WeightDecay: 0.05},
		{Name: "sgd", LR: 0.1, WeightDecay: 0.05},
	}
	for _, c := range cases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			// A 1x1 linear weight: decayed by default.
			o, err := NewNamed(c, dt, []string{"fc0.weight"}, []tensor.Shape{{1, 1}})
			if err != nil {
				t.Fatal(err)
			}
			p := tensor.New(tensor.Of(dt), tensor.WithShape(1, 1))
			g := tensor.New(tensor.Of(dt), tensor.WithShape(1, 1))
			p.Set(0, cast(dt, 0.3))
			for _, x := range grads {
				g.Set(0, cast(dt, x))
				if err := o.Step([]*tensor.Dense{p}, []*tensor.Dense{g}); err != nil {
					t.Fatal(err)
				}
				if v := asFloat(g.Get(0)); v != 0 {
					t.Fatalf("%+v: gradient not zeroed after the step: %v", c, v)
				}
			}
			want, got := textbook(c, 0.3, grads), asFloat(p.Get(0))
			tol := 1e-12
			if dt == tensor.Float32 {
				tol = 1e-5
			}
			if math.Abs(got-want) > tol*math.Max(1, math.Abs(want)) {
				t.Errorf("%s (weight decay %v) %v: %.15g after %d steps, textbook %.15g", c.Name, c.WeightDecay, dt, got, len(grads), want)
			}
			if o.Steps() != int64(len(grads)) {
				t.Errorf("Steps() = %d, want %d", o.Steps(), len(grads))
			}
		}
	}
}

// TestStateRestores checks that an optimizer rebuilt from another's step count
// and buffers continues with the same bits, with and without weight decay
// (which keeps no state of its own).
func TestStateRestores(t *testing.T) {
	for _, c := range []Spec{
		{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
		{Name: "sgd", LR: 0.01, Momentum: 0.9, WeightDecay: 0.1},
	} {
		stateRestores(t, c)
	}
}

func stateRestores(t *testing.T, c Spec) {
	names := []string{"fc.weight", "fc.bias"}
	shapes := []tensor.Shape{{2, 3}, {3}}
	run := func(o *Optimizer, ps []*tensor.Dense, from, to int) {
		for s := from; s < to; s++ {
			gs := []*tensor.Dense{
				tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, -2, 3, float32(s), 0.5, -0.5})),
				tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{float32(s) / 3, 2, -1})),
			}
			if err := o.Step(ps, gs); err != nil {
				t.Fatal(err)
			}
		}
	}
	params := func() []*tensor.Dense {
		return []*tensor.Dense{tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(2, 3)), tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(3))}
	}
	a, _ := NewNamed(c, tensor.Float32, names, shapes)
	pa := params()
	run(a, pa, 0, 5)

	b, _ := NewNamed(c, tensor.Float32, names, shapes)
	pb := params()
	run(b, pb, 0, 3)
	r, _ := NewNamed(c, tensor.Float32, names, shapes)
	r.SetSteps(b.Steps())
	for _, name := range b.SlotNames() {
		for i := range shapes {
			src, _ := b.Slot(name, i)
			dst, err := r.Slot(name, i)
			if err != nil {
				t.Fatal(err)
			}
			copy(dst.Data().([]float32), src.Data().([]float32))
		}
	}
	run(r, pb, 3, 5)
	for i := range pa {
		x, y := pa[i].Data().([]float32), pb[i].Data().([]float32)
		for j := range x {
			if x[j] != y[j] {
				t.Fatalf("%s: param %d[%d]: %v straight through, %v restored", c.Name, i, j, x[j], y[j])
			}
		}
	}
	if _, err := r.Slot("momentum", 0); err == nil && c.Name != "sgd" {
		t.Errorf("%s reported a momentum slot", c.Name)
	}
}

func TestStepRejectsMismatchedShapes(t *testing.T) {
	o, _ := New(Spec{Name: "sgd", LR: 1}, tensor.Float32, []tensor.Shape{{2}})
	p := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(3))
	if err := o.Step([]*tensor.Dense{p}, []*tensor.Dense{p}); err == nil || !strings.Contains(err.Error(), "parameter 0 has shape (3) and gradient (3), want (2)") {
		t.Errorf("a (3) parameter for a (2) slot: err = %v, want one naming parameter 0 and both shapes", err)
	}
	if err := o.Step([]*tensor.Dense{p, p}, []*tensor.Dense{p}); err == nil || !strings.Contains(err.Error(), "2 parameters and 1 gradients for 1 shapes") {
		t.Errorf("two parameters, one gradient, one slot: err = %v, want one counting each", err)
	}
	if _, err := New(Spec{Name: "lion"}, tensor.Float32, nil); err == nil || !strings.Contains(err.Error(), `unknown optimizer "lion" (known: `) {
		t.Errorf("unknown optimizer: err = %v, want one naming it and the known ones", err)
	}
}

func cast(dt tensor.Dtype, x float64) any {
	if dt == tensor.Float32 {
		return float32(x)
	}
	return x
}

func asFloat(v any) float64 {
	if f, ok := v.(float32); ok {
		return float64(f)
	}
	return v.(float64)
}

// TestWorkersGiveTheSameBits: an update shared among goroutines equals the
// one-goroutine update bit for bit, and leaves every gradient zero, for a
// parameter large enough to be shared and one too small to be.
func TestWorkersGiveTheSameBits(t *testing.T) {
	shapes := []tensor.Shape{{parallelMin + 7}, {3, 5}}
	for _, spec := range []Spec{{Name: "sgd", LR: 0.1}, {Name: "sgd", LR: 0.1, Momentum: 0.9}, {Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, DecayExclude: []string{"none"}}} {
		var results [][]float32
		for _, workers := range []int{1, 3} {
			o, err := NewNamed(spec, tensor.Float32, []string{"big", "small"}, shapes)
			if err != nil {
				t.Fatal(err)
			}
			o.SetWorkers(workers)
			params := []*tensor.Dense{tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shapes[0]...)), tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shapes[1]...))}
			for step := range 3 {
				grads := make([]*tensor.Dense, len(shapes))
				for i, s := range shapes {
					g := make([]float32, s.TotalSize())
					for j := range g {
						g[j] = float32(math.Sin(float64(j*(step+1)+i))) * 0.3
					}
					grads[i] = tensor.New(tensor.WithShape(s...), tensor.WithBacking(g))
				}
				if err := o.Step(params, grads); err != nil {
					t.Fatal(err)
				}
				for i, g := range grads {
					for j, v := range g.Data().([]float32) {
						if v != 0 {
							t.Fatalf("%s, %d workers: gradient %d[%d] is %v after the step, want 0", spec.Name, workers, i, j, v)
						}
					}
				}
			}
			var all []float32
			for _, p := range params {
				all = append(all, p.Data().([]float32)...)
			}
			results = append(results, all)
		}
		for j := range results[0] {
			if math.Float32bits(results[0][j]) != math.Float32bits(results[1][j]) {
				t.Fatalf("%s (momentum %v): element %d is %v with one worker, %v with three", spec.Name, spec.Momentum, j, results[0][j], results[1][j])
			}
		}
	}
}

// TestDecaysChoosesLinearWeights: by default weight decay reaches the
// weights of linear and convolution layers alone, not biases, norms or
// embeddings (the tied head.tok included); decay_exclude replaces that
// rule by its patterns.
func TestDecaysChoosesLinearWeights(t *testing.T) {
	params := []struct {
		name string
		dims int
	}{
		{"fc0.weight", 2}, {"fc0.bias", 1}, {"embed.tok", 2}, {"embed.pos", 2},
		{"block0.ln1.gain", 1}, {"block0.ln1.bias", 1}, {"block0.attn.q.weight", 2},
		{"head.ln.gain", 1}, {"head.weight", 2}, {"head.tok", 2}, {"conv0.weight", 4},
		{"norm.weight", 1}, {"weight", 2},
	}
	decayed := func(s Spec) []string {
		var out []string
		for _, p := range params {
			if s.Decays(p.name, p.dims) {
				out = append(out, p.name)
			}
		}
		return out
	}
	if got, want := decayed(Spec{}), []string{"fc0.weight", "block0.attn.q.weight", "head.weight", "conv0.weight", "weight"}; !slices.Equal(got, want) {
		t.Errorf("default: decays %v, want %v", got, want)
	}
	if got, want := decayed(Spec{DecayExclude: []string{"*.bias", "block?.*"}}), []string{"fc0.weight", "embed.tok", "embed.pos", "head.ln.gain", "head.weight", "head.tok", "conv0.weight", "norm.weight", "weight"}; !slices.Equal(got, want) {
		t.Errorf("decay_exclude *.bias, block?.*: decays %v, want %v", got, want)
	}
}

// TestWeightDecayNeedsNames: decay without the parameters' names, or with
// a pattern path.Match refuses, is refused by name; decayed parameters
// report their decay and the others 0.
func TestWeightDecayNeedsNames(t *testing.T) {
	shapes := []tensor.Shape{{2, 3}, {3}}
	spec := Spec{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	if _, err := New(spec, tensor.Float32, shapes); err == nil || !strings.Contains(err.Error(), "weight decay needs the name of each of the 2 parameters, got 0") {
		t.Errorf("New with weight decay: err = %v, want one asking for the names", err)
	}
	bad := spec
	bad.DecayExclude = []string{"*.bias", "[x"}
	if _, err := NewNamed(bad, tensor.Float32, []string{"fc.weight", "fc.bias"}, shapes); err == nil || !strings.Contains(err.Error(), `decay_exclude[1] "[x"`) {
		t.Errorf("a malformed pattern: err = %v, want one naming decay_exclude[1]", err)
	}
	o, err := NewNamed(spec, tensor.Float32, []string{"fc.weight", "fc.bias"}, shapes)
	if err != nil {
		t.Fatal(err)
	}
	if o.Decay(0) != 0.1 || o.Decay(1) != 0 {
		t.Errorf("Decay: %v and %v, want 0.1 for fc.weight and 0 for fc.bias", o.Decay(0), o.Decay(1))
	}
	if _, err := New(Spec{Name: "sgd", LR: 0.1}, tensor.Float32, shapes); err != nil {
		t.Errorf("New without weight decay needs no names: %v", err)
	}
}

// TestSetLRDrivesTheStep: a step after SetLR moves the parameter by the
// new rate, and the rate stays for the steps after it.
func TestSetLRDrivesTheStep(t *testing.T) {
	o, err := New(Spec{Name: "sgd", LR: 0.5}, tensor.Float64, []tensor.Shape{{1}})
	if err != nil {
		t.Fatal(err)
	}
	p := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{4}))
	for _, lr := range []float64{0.5, 0.25, 0.25} {
		if lr != o.LR() {
			o.SetLR(lr)
		}
		g := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{1}))
		before := p.Data().([]float64)[0]
		if err := o.Step([]*tensor.Dense{p}, []*tensor.Dense{g}); err != nil {
			t.Fatal(err)
		}
		if moved := before - p.Data().([]float64)[0]; moved != lr {
			t.Errorf("lr %v: the parameter moved by %v", lr, moved)
		}
	}
}
