package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
)

func smallMLP(t *testing.T, dtype string) *models.Model {
	t.Helper()
	m, err := models.Build(models.Spec{Name: "mlp", DType: dtype, Input: 6, Hidden: []int{5, 4}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// randInputs is n micro-batches of randInput.
func randInputs(r *rand.Rand, n, batch, dim int) ([]*tensor.Dense, [][]int) {
	var xs []*tensor.Dense
	var ys [][]int
	for range n {
		x, y := randInput(r, batch, dim)
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
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
		b, err := l.Build(g, h, seed)
		if err != nil {
			t.Fatal(err)
		}
		h, params = b.Out, append(params, b.Params...)
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
		gs, err := e.Gradients()
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range e.Params() {
			out[p.Name()] = append([]float64(nil), gs[i].Value.Data().([]float64)...)
		}
	}
	return out
}

// runPipeline pushes micro-batches through engines split at the given layer
// boundaries: all forwards, then all backwards in micro-batch order (GPipe order),
// so several micro-batches are in flight on every engine at once.
func runPipeline(t *testing.T, m *models.Model, cuts []int, xs []*tensor.Dense, ys [][]int, seed uint64, split bool) ([]*Engine, []float64) {
	t.Helper()
	var es []*Engine
	for i := 0; i+1 < len(cuts); i++ {
		e, err := NewEngine(m, cuts[i], cuts[i+1], xs[0].Shape()[0], seed, Options{Split: split})
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	losses := runMicroBatches(t, es, xs, ys)
	return es, losses
}

func TestEngineMatchesSymbolicGradient(t *testing.T) {
	const seed = 7
	m := smallMLP(t, "float64")
	r := rand.New(rand.NewPCG(1, 2))
	xs, ys := randInputs(r, 3, 4, 6)
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
	for _, tc := range []struct {
		cuts  []int
		split bool
	}{{[]int{0, 3}, false}, {[]int{0, 1, 3}, false}, {[]int{0, 2, 3}, false}, {[]int{0, 1, 2, 3}, false},
		{[]int{0, 3}, true}, {[]int{0, 1, 3}, true}, {[]int{0, 1, 2, 3}, true}} {
		cuts := tc.cuts
		es, losses := runPipeline(t, m, cuts, xs, ys, seed, tc.split)
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
					t.Fatalf("cuts %v split %v: %s[%d] = %v, symbolic %v", cuts, tc.split, name, i, got[name][i], w[i])
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
	es, _ := runPipeline(t, m, []int{0, 1, 3}, []*tensor.Dense{x}, [][]int{y}, seed, false)
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

// TestSplitGPTFiniteDifferences checks the weight gradients a split GPT
// pipeline computes in its weight passes, from each part's stashed input and
// tap gradient, against central differences of the mean loss: every part
// kind (embedding, LayerNorm, affine, the head's matrix, tied or not) on a
// spread of entries of every parameter.
func TestSplitGPTFiniteDifferences(t *testing.T) {
	const seed, perParam, step = 3, 6, 1e-5
	for _, tied := range []bool{false, true} {
		m := smallGPT(t, "float64", tied)
		r := rand.New(rand.NewPCG(5, 6))
		var xs []*tensor.Dense
		var ys [][]int
		for range 2 {
			x, y := gptBatch(r, m, 2)
			xs, ys = append(xs, x), append(ys, y)
		}
		var es []*Engine
		for _, c := range [][2]int{{0, 2}, {2, 4}} {
			e, err := NewEngine(m, c[0], c[1], 2, seed, Options{Split: true})
			if err != nil {
				t.Fatal(err)
			}
			// Larger weights than the 0.02 init, so attention is far from
			// uniform and every path carries a sizeable gradient.
			for _, p := range e.Params() {
				for i := range p.Value().Data().([]float64) {
					p.Value().Data().([]float64)[i] += r.NormFloat64() * 0.3
				}
			}
			es = append(es, e)
		}
		for k := range xs {
			h, err := es[0].Forward(k, xs[k], nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := es[1].Forward(k, h, ys[k]); err != nil {
				t.Fatal(err)
			}
		}
		for k := range xs {
			dx, err := es[1].Input(k, es[1].LossScale(len(xs)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := es[0].Input(k, dx); err != nil {
				t.Fatal(err)
			}
		}
		for k := range xs {
			for _, e := range es {
				if err := e.Weight(k); err != nil {
					t.Fatal(err)
				}
			}
		}
		loss := func() float64 {
			var sum float64
			for k := range xs {
				h, err := es[0].Forward(100, xs[k], nil)
				if err != nil {
					t.Fatal(err)
				}
				out, err := es[1].Forward(100, h, ys[k])
				if err != nil {
					t.Fatal(err)
				}
				es[0].Discard(100)
				es[1].Discard(100)
				sum += out.Data().([]float64)[0]
			}
			return sum / float64(len(xs))
		}
		for _, e := range es {
			grads, err := e.Gradients()
			if err != nil {
				t.Fatal(err)
			}
			for j, p := range e.Params() {
				w, g := p.Value().Data().([]float64), grads[j].Value.Data().([]float64)
				for n := range perParam {
					i := n * len(w) / perParam
					orig := w[i]
					w[i] = orig + step
					up := loss()
					w[i] = orig - step
					down := loss()
					w[i] = orig
					fd := (up - down) / (2 * step)
					if d := math.Abs(fd - g[i]); d > 1e-6*max(math.Abs(fd), math.Abs(g[i]), 1e-4) {
						t.Errorf("tied=%v %s[%d]: weight pass %v, central difference %v", tied, p.Name(), i, g[i], fd)
					}
				}
			}
		}
	}
}

func TestEngineRejectsMisuse(t *testing.T) {
	m := smallMLP(t, "float32")
	e, err := NewEngine(m, 1, 3, 2, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Backward(0, e.LossScale(1))
	refused(t, "backward without forward", err, "micro-batch 0: backward without a forward")
	in := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(2, 5))
	if _, err := e.Forward(0, in, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	_, err = e.Forward(0, in, []int{0, 1})
	refused(t, "second forward of an in-flight micro-batch", err, "micro-batch 0: forward run twice before its backward")
	sgd, err := e.NewOptimizer(optim.Spec{Name: "sgd", LR: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	refused(t, "optimizer step with a micro-batch in flight", e.Step(sgd), "optimizer step with 1 micro-batches still in flight")
	_, err = NewEngine(m, 2, 2, 2, 1, Options{})
	refused(t, "empty layer range", err, "layer range [2, 2) is not within the model's")
}

// refused requires err to be the refusal that says want, not some other
// error the same call could return.
func refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: err = %v, want one saying %q", what, err, want)
	}
}

// smallGPT is a GPT of embed, two blocks and head (4 layers).
func smallGPT(t *testing.T, dtype string, tied bool) *models.Model {
	t.Helper()
	m, err := models.Build(models.Spec{Name: "gpt", DType: dtype, Layers: 2, Width: 8, Heads: 2, Context: 4, Vocab: 11, TieEmbeddings: tied})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// gptBatch is a micro-batch of batch sequences: token ids, as float64s, and
// the next token of every position.
func gptBatch(r *rand.Rand, m *models.Model, batch int) (*tensor.Dense, []int) {
	context := m.Example[0]
	ids := make([]float64, batch*context)
	for i := range ids {
		ids[i] = float64(r.IntN(m.Classes))
	}
	y := make([]int, batch*context)
	for i := range y {
		y[i] = r.IntN(m.Classes)
	}
	return tensor.New(tensor.WithShape(batch, context), tensor.WithBacking(ids)), y
}

// TestSplitBackwardIsBitIdentical runs the same micro-batches through fused and
// split engines, the split ones with weight gradients deferred and interleaved as a
// zero-bubble schedule does: input gradients, weight gradients and the weights after
// an Adam step must be identical bits. The GPT's layers split into several
// parts each (a block into eight), tied or not.
func TestSplitBackwardIsBitIdentical(t *testing.T) {
	const seed = 5
	for _, dtype := range []string{"float32", "float64"} {
		t.Run("mlp/"+dtype, func(t *testing.T) {
			m := smallMLP(t, dtype)
			r := rand.New(rand.NewPCG(8, 9))
			xs, ys := randInputs(r, 3, 4, 6)
			checkSplitBitIdentical(t, m, [][2]int{{0, 1}, {1, 3}}, xs, ys, seed)
		})
		for _, tied := range []bool{false, true} {
			for _, cuts := range [][][2]int{{{0, 2}, {2, 4}}, {{0, 1}, {1, 3}, {3, 4}}} {
				t.Run(fmt.Sprintf("gpt/%s/tied=%v/%v", dtype, tied, cuts), func(t *testing.T) {
					m := smallGPT(t, dtype, tied)
					r := rand.New(rand.NewPCG(8, 9))
					var xs []*tensor.Dense
					var ys [][]int
					for range 3 {
						x, y := gptBatch(r, m, 3)
						xs, ys = append(xs, x), append(ys, y)
					}
					checkSplitBitIdentical(t, m, cuts, xs, ys, seed)
				})
			}
		}
	}
}

// checkSplitBitIdentical runs micro-batches xs through fused and split engines
// of the stages cuts: the last stage runs its weight passes one micro-batch
// late (I0 I1 W0 I2 W1 W2), the others after all their input passes.
func checkSplitBitIdentical(t *testing.T, m *models.Model, cuts [][2]int, xs []*tensor.Dense, ys [][]int, seed uint64) {
	t.Helper()
	if m.DType == tensor.Float32 {
		for k := range xs {
			xs[k] = toFloat32(xs[k])
		}
	}
	batch := xs[0].Shape()[0]
	build := func(split bool) []*Engine {
		var es []*Engine
		for _, c := range cuts {
			e, err := NewEngine(m, c[0], c[1], batch, seed, Options{Split: split})
			if err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		return es
	}
	fused, split := build(false), build(true)
	last := len(cuts) - 1
	forwardAll := func(es []*Engine) {
		for k := range xs {
			h := xs[k]
			for _, e := range es {
				out, err := e.Forward(k, h, ys[k])
				if err != nil {
					t.Fatal(err)
				}
				h = out
			}
		}
	}
	forwardAll(fused)
	forwardAll(split)
	scale := fused[last].LossScale(len(xs))
	// fusedDx[s][k] is the gradient stage s sent upstream for micro-batch k,
	// kept as sent: the stage receiving it may compute in its memory.
	fusedDx, splitDx := make([][]*tensor.Dense, len(cuts)), make([][]*tensor.Dense, len(cuts))
	for k := range xs {
		g := scale
		for s := last; s >= 0; s-- {
			dx, err := fused[s].Backward(k, g)
			if err != nil {
				t.Fatal(err)
			}
			fusedDx[s], g = append(fusedDx[s], cloneDense(dx)), dx
		}
	}
	for k := range xs {
		g := scale
		for s := last; s >= 0; s-- {
			dx, err := split[s].Input(k, g)
			if err != nil {
				t.Fatal(err)
			}
			splitDx[s], g = append(splitDx[s], cloneDense(dx)), dx
			if s == last && k >= 1 {
				if err := split[s].Weight(k - 1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for s, e := range split {
		want := len(xs)
		if s == last {
			want = 1
		}
		if e.InFlight() != want {
			t.Errorf("stage %d: %d micro-batches in flight before the last weight passes, want %d", s, e.InFlight(), want)
		}
	}
	if err := split[last].Weight(len(xs) - 1); err != nil {
		t.Fatal(err)
	}
	for s := range last {
		for k := range xs {
			if err := split[s].Weight(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	for s := range split {
		for k := range xs {
			if s > 0 && !sameBits(fusedDx[s][k], splitDx[s][k]) {
				t.Errorf("stage %d: micro-batch %d input gradient differs", s, k)
			}
		}
	}
	for i := range fused {
		fg, _ := fused[i].Gradients()
		sg, _ := split[i].Gradients()
		for j := range fg {
			name := fused[i].Params()[j].Name()
			f, s := fg[j].Value, sg[j].Value
			if !sameBits(f, s) {
				t.Errorf("%s gradient differs", name)
			}
			if allZero(s) {
				t.Errorf("%s gradient is all zeros: the comparison shows nothing", name)
			}
		}
		adam := optim.Spec{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
		fo, err := fused[i].NewOptimizer(adam)
		if err != nil {
			t.Fatal(err)
		}
		so, err := split[i].NewOptimizer(adam)
		if err != nil {
			t.Fatal(err)
		}
		if err := fused[i].Step(fo); err != nil {
			t.Fatal(err)
		}
		if err := split[i].Step(so); err != nil {
			t.Fatal(err)
		}
		for j, p := range fused[i].Params() {
			if !sameBits(p.Value().(*tensor.Dense), split[i].Params()[j].Value().(*tensor.Dense)) {
				t.Errorf("%s after a step differs", p.Name())
			}
		}
	}
	// The weight program differentiates the parts but never computes them.
	for _, e := range split {
		for _, w := range e.weights {
			for _, tap := range w.taps {
				if tap.Value() != nil {
					t.Errorf("the weight program computed %v: it reran the forward", tap)
				}
			}
		}
	}
	if err := split[0].Weight(0); err == nil {
		t.Error("weight gradient of a released micro-batch accepted")
	}
}

func cloneDense(d *tensor.Dense) *tensor.Dense {
	if d == nil {
		return nil
	}
	return d.Clone().(*tensor.Dense)
}

func allZero(d *tensor.Dense) bool {
	for _, v := range Float64s(d) {
		if v != 0 {
			return false
		}
	}
	return true
}

func toFloat32(x *tensor.Dense) *tensor.Dense {
	d := x.Data().([]float64)
	f := make([]float32, len(d))
	for i, v := range d {
		f[i] = float32(v)
	}
	return tensor.New(tensor.WithShape(x.Shape()...), tensor.WithBacking(f))
}

// differingGradients names the parameters whose summed gradients in a
// and b (engines of the same layers) differ in any bit.
func differingGradients(t *testing.T, a, b *Engine) []string {
	t.Helper()
	ga, err := a.Gradients()
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.Gradients()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range ga {
		if !sameBits(ga[i].Value, gb[i].Value) {
			out = append(out, a.Params()[i].Name())
		}
	}
	return out
}

func sameBits(a, b *tensor.Dense) bool {
	if a == nil || b == nil || !a.Shape().Eq(b.Shape()) {
		return a == nil && b == nil
	}
	switch x := a.Data().(type) {
	case []float32:
		y := b.Data().([]float32)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
	case []float64:
		y := b.Data().([]float64)
		for i := range x {
			if math.Float64bits(x[i]) != math.Float64bits(y[i]) {
				return false
			}
		}
	default:
		return false
	}
	return true
}

// TestInputPassSkipsWeightGradients: gorgonia's matmul derivative builds nodes for
// both operands, and the fused ops' derivatives one per input, so the
// input-gradient program must be compiled without the weight gradients' nodes,
// or a split backward would compute every weight gradient twice.
func TestInputPassSkipsWeightGradients(t *testing.T) {
	weightOps := []string{"Aᵀ × B", "ColSum", "LayerNormGainGrad", "EmbedTokenGrad", "EmbedPositionGrad"}
	r := rand.New(rand.NewPCG(3, 4))
	mlp := smallMLP(t, "float64")
	x, y := randInput(r, 4, 5)
	gpt := smallGPT(t, "float64", true)
	ids, next := gptBatch(r, gpt, 4)
	for _, c := range []struct {
		m           *models.Model
		first, last int
		x           *tensor.Dense
		y           []int
		want        []string // weight-gradient ops the graph must hold
	}{
		{mlp, 1, 3, x, y, weightOps[:1]},
		{gpt, 0, 4, ids, next, weightOps},
	} {
		e, err := NewEngine(c.m, c.first, c.last, 4, 1, Options{Split: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Forward(0, c.x, c.y); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Input(0, e.LossScale(1)); err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, n := range e.g.AllNodes() {
			if n.Op() == nil {
				continue
			}
			for _, op := range c.want {
				if strings.HasPrefix(n.Op().String(), op) {
					seen[op]++
					if n.Value() != nil {
						t.Errorf("%s: the input pass computed %v", c.m.Spec.Name, n)
					}
				}
			}
		}
		for _, op := range c.want {
			if seen[op] == 0 {
				t.Errorf("%s: no %s node in the graph; the test no longer looks at the right nodes", c.m.Spec.Name, op)
			}
		}
	}
}

// TestFirstStageSkipsDataGradient: the first stage's input is data, so its
// gradient is dead work (as many multiply-adds as the first layer's forward)
// that a whole-graph compile would still run wherever the matmul's
// derivative is built, having nodes for both operands.
func TestFirstStageSkipsDataGradient(t *testing.T) {
	m := smallMLP(t, "float64")
	e, err := NewEngine(m, 0, len(m.Layers), 4, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	x, y := randInput(rand.New(rand.NewPCG(3, 4)), 4, 6)
	if _, err := e.Forward(0, x, y); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Backward(0, e.LossScale(1)); err != nil {
		t.Fatal(err)
	}
	inShape := e.InShape()
	computed := 0
	for _, n := range e.g.AllNodes() {
		if n == e.x || n.Op() == nil || n.Value() == nil {
			continue
		}
		computed++
		if n.Shape().Eq(inShape) {
			t.Errorf("the first stage computed %v %v, a gradient with respect to its data", n.Op(), n.Shape())
		}
	}
	if computed == 0 {
		t.Fatal("no node holds a value after the run; the test no longer looks at the right nodes")
	}
	grads, err := e.Gradients()
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range grads {
		if g.Value == nil {
			t.Errorf("parameter %d has no gradient", i)
		}
	}
}
