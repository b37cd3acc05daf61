package stages

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

func smallMLP(t *testing.T, dtype string) *models.Model {
	t.Helper()
	m, err := models.Build(models.Spec{Name: "mlp", DType: dtype, Input: 6, Hidden: []int{5, 4}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randInput(r *rand.Rand, batch, dim int) (*tensor.Dense, []int) {
	x := make([]float64, batch*dim)
	for i := range x {
		x[i] = r.Float64()*2 - 1
	}
	y := make([]int, batch)
	for i := range y {
		y[i] = r.IntN(3)
	}
	return tensor.New(tensor.WithShape(batch, dim), tensor.WithBacking(x)), y
}

// symbolicGrads trains nothing: it builds the whole model and its loss in one plain
// graph, differentiates it with G.Grad and returns loss and gradients by parameter name.
func symbolicGrads(t *testing.T, m *models.Model, x *tensor.Dense, y []int, seed uint64) (float64, map[string][]float64) {
	t.Helper()
	g := G.NewGraph()
	batch := x.Shape()[0]
	in := G.NewMatrix(g, m.DType, G.WithShape(x.Shape()...), G.WithValue(x))
	h := in
	var params G.Nodes
	for _, l := range m.Layers {
		var ps []*G.Node
		var err error
		if h, ps, err = l.Build(g, h, seed); err != nil {
			t.Fatal(err)
		}
		params = append(params, ps...)
	}
	oh := make([]float64, batch*m.Classes)
	for i, c := range y {
		oh[i*m.Classes+c] = 1
	}
	targets := G.NewMatrix(g, m.DType, G.WithShape(batch, m.Classes), G.WithValue(tensor.New(tensor.WithShape(batch, m.Classes), tensor.WithBacking(oh))))
	loss, err := models.SoftmaxCrossEntropy(h, targets)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := G.Grad(loss, params...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(params...))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, p := range params {
		gv, err := p.Grad()
		if err != nil {
			t.Fatal(err)
		}
		out[p.Name()] = append([]float64(nil), gv.Data().([]float64)...)
	}
	return loss.Value().Data().(float64), out
}

func engineGrads(t *testing.T, es []*Engine) map[string][]float64 {
	t.Helper()
	out := map[string][]float64{}
	for _, e := range es {
		for _, p := range e.Params() {
			gv, err := p.Grad()
			if err != nil {
				t.Fatalf("%s: %v", p.Name(), err)
			}
			out[p.Name()] = append([]float64(nil), gv.Data().([]float64)...)
		}
	}
	return out
}

// runPipeline pushes micro-batches through engines split at the given layer
// boundaries: all forwards, then all backwards in micro-batch order (GPipe order),
// so several micro-batches are in flight on every engine at once.
func runPipeline(t *testing.T, m *models.Model, cuts []int, xs []*tensor.Dense, ys [][]int, seed uint64) ([]*Engine, []float64) {
	t.Helper()
	var es []*Engine
	for i := 0; i+1 < len(cuts); i++ {
		e, err := NewEngine(m, cuts[i], cuts[i+1], xs[0].Shape()[0], seed)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	losses := make([]float64, len(xs))
	for k, x := range xs {
		h := x
		for _, e := range es {
			out, err := e.Forward(k, h, ys[k])
			if err != nil {
				t.Fatal(err)
			}
			h = out
		}
		losses[k] = h.Data().([]float64)[0]
	}
	for k := range xs {
		var g G.Value = es[len(es)-1].LossScale(len(xs))
		for i := len(es) - 1; i >= 0; i-- {
			dx, err := es[i].Backward(k, g)
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 && dx == nil {
				t.Fatalf("stage %d returned no input gradient", i)
			}
			g = dx
		}
	}
	return es, losses
}

func TestEngineMatchesSymbolicGradient(t *testing.T) {
	const seed = 7
	m := smallMLP(t, "float64")
	r := rand.New(rand.NewPCG(1, 2))
	var xs []*tensor.Dense
	var ys [][]int
	for range 3 {
		x, y := randInput(r, 4, 6)
		xs, ys = append(xs, x), append(ys, y)
	}
	// The expected gradient of the mean loss over micro-batches, micro-batch by micro-batch.
	want := map[string][]float64{}
	var wantLoss []float64
	for k := range xs {
		l, g := symbolicGrads(t, m, xs[k], ys[k], seed)
		wantLoss = append(wantLoss, l)
		for name, v := range g {
			if want[name] == nil {
				want[name] = make([]float64, len(v))
			}
			for i := range v {
				want[name][i] += v[i] / float64(len(xs))
			}
		}
	}
	for _, cuts := range [][]int{{0, 3}, {0, 1, 3}, {0, 2, 3}, {0, 1, 2, 3}} {
		es, losses := runPipeline(t, m, cuts, xs, ys, seed)
		for k := range losses {
			if losses[k] != wantLoss[k] {
				t.Errorf("cuts %v: micro-batch %d loss %v, symbolic %v", cuts, k, losses[k], wantLoss[k])
			}
		}
		got := engineGrads(t, es)
		if len(got) != len(want) {
			t.Fatalf("cuts %v: %d gradients, want %d", cuts, len(got), len(want))
		}
		for name, w := range want {
			for i := range w {
				if d := math.Abs(got[name][i] - w[i]); d > 1e-12*(1+math.Abs(w[i])) {
					t.Fatalf("cuts %v: %s[%d] = %v, symbolic %v", cuts, name, i, got[name][i], w[i])
				}
			}
		}
		for i, e := range es {
			if e.PeakInFlight() != len(xs) || e.InFlight() != 0 {
				t.Errorf("cuts %v stage %d: peak in flight %d (want %d), left %d", cuts, i, e.PeakInFlight(), len(xs), e.InFlight())
			}
		}
	}
}

// TestEngineFiniteDifferences checks the engine's gradients against the loss itself,
// independently of gorgonia's differentiation.
func TestEngineFiniteDifferences(t *testing.T) {
	const seed = 3
	m := smallMLP(t, "float64")
	x, y := randInput(rand.New(rand.NewPCG(5, 6)), 4, 6)
	es, _ := runPipeline(t, m, []int{0, 1, 3}, []*tensor.Dense{x}, [][]int{y}, seed)
	grads := engineGrads(t, es)

	lossAt := func() float64 {
		h := x
		for i, e := range es {
			out, err := e.Forward(100, h, y)
			if err != nil {
				t.Fatal(err)
			}
			e.Discard(100)
			h = out
			_ = i
		}
		return h.Data().([]float64)[0]
	}
	const eps = 1e-6
	for _, e := range es {
		for _, p := range e.Params() {
			w := p.Value().Data().([]float64)
			for i := range w {
				orig := w[i]
				w[i] = orig + eps
				up := lossAt()
				w[i] = orig - eps
				down := lossAt()
				w[i] = orig
				fd := (up - down) / (2 * eps)
				if d := math.Abs(fd - grads[p.Name()][i]); d > 1e-6 {
					t.Fatalf("%s[%d]: engine gradient %v, finite difference %v", p.Name(), i, grads[p.Name()][i], fd)
				}
			}
		}
	}
}

func TestEngineRejectsMisuse(t *testing.T) {
	m := smallMLP(t, "float32")
	e, err := NewEngine(m, 1, 3, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Backward(0, e.LossScale(1)); err == nil {
		t.Error("backward without forward accepted")
	}
	in := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(2, 5))
	if _, err := e.Forward(0, in, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Forward(0, in, []int{0, 1}); err == nil {
		t.Error("second forward of an in-flight micro-batch accepted")
	}
	if err := e.Step(G.NewVanillaSolver()); err == nil {
		t.Error("optimizer step with a micro-batch in flight accepted")
	}
	if _, err := NewEngine(m, 2, 2, 2, 1); err == nil {
		t.Error("empty layer range accepted")
	}
}
