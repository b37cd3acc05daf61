package models

import (
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// testStage is layers [first, last) of a model built into one graph the way a
// pipeline stage builds them: an input of shape ShapeAt(first, batch) and, when
// last is the end, the loss against one-hot targets.
type testStage struct {
	m              *Model
	first, last    int
	batch          int
	g              *G.ExprGraph
	x, onehot, out *G.Node
	params         []*G.Node
}

func buildTestStage(t *testing.T, m *Model, first, last, batch int, seed uint64) *testStage {
	t.Helper()
	s := &testStage{m: m, first: first, last: last, batch: batch, g: G.NewGraph()}
	in := m.ShapeAt(first, batch)
	s.x = G.NewTensor(s.g, m.DType, in.Dims(), G.WithShape(in...), G.WithName("input"))
	h := s.x
	for _, l := range m.Layers[first:last] {
		b, err := l.Build(s.g, h, seed)
		if err != nil {
			t.Fatalf("building %s: %v", l.Name(), err)
		}
		if want := l.OutShape(h.Shape()); !b.Out.Shape().Eq(want) {
			t.Fatalf("%s: output shape %v, OutShape says %v", l.Name(), b.Out.Shape(), want)
		}
		h = b.Out
		s.params = append(s.params, b.Params...)
	}
	s.out = h
	if last == len(m.Layers) {
		s.onehot = G.NewMatrix(s.g, m.DType, G.WithShape(batch*m.Targets(), m.Classes), G.WithName("targets"))
		loss, err := SoftmaxCrossEntropy(h, s.onehot)
		if err != nil {
			t.Fatal(err)
		}
		s.out = loss
	}
	return s
}

// forward runs the stage on input (and targets on the last stage) and returns
// a copy of its output: the activation, or the loss as a 1-element tensor.
func (s *testStage) forward(t *testing.T, input *tensor.Dense, targets []int) *tensor.Dense {
	t.Helper()
	if err := G.Let(s.x, input); err != nil {
		t.Fatal(err)
	}
	if s.onehot != nil {
		if err := G.Let(s.onehot, oneHotTargets(s.m, targets)); err != nil {
			t.Fatal(err)
		}
	}
	vm := G.NewTapeMachine(s.g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatalf("layers [%d, %d): %v", s.first, s.last, err)
	}
	if d, ok := s.out.Value().(*tensor.Dense); ok {
		return d.Clone().(*tensor.Dense)
	}
	return denseOf(s.m.DType, []float64{scalarValue(s.out.Value())}, 1)
}

// oneHotTargets is the (len(targets), Classes) target matrix.
func oneHotTargets(m *Model, targets []int) *tensor.Dense {
	t := tensor.New(tensor.Of(m.DType), tensor.WithShape(len(targets), m.Classes))
	for i, y := range targets {
		setAt(t, i*m.Classes+y, 1)
	}
	return t
}

func scalarValue(v G.Value) float64 {
	switch x := v.Data().(type) {
	case float32:
		return float64(x)
	case float64:
		return x
	}
	panic("not a float scalar")
}

// denseOf makes a tensor of dtype dt from float64 values.
func denseOf(dt tensor.Dtype, v []float64, shape ...int) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	for i, x := range v {
		setAt(t, i, x)
	}
	return t
}

// randomBatch is a micro-batch of model inputs and targets: token ids for a
// language model, pixels in [0, 1) otherwise.
func randomBatch(m *Model, batch int, r *rand.Rand) (*tensor.Dense, []int) {
	in := m.ShapeAt(0, batch)
	x := make([]float64, in.TotalSize())
	for i := range x {
		if m.TargetsPerExample > 1 {
			x[i] = float64(r.IntN(m.Classes))
		} else {
			x[i] = r.Float64()
		}
	}
	y := make([]int, batch*m.Targets())
	for i := range y {
		y[i] = r.IntN(m.Classes)
	}
	return denseOf(m.DType, x, in...), y
}

// checkSplitEquivalence builds the model whole and cut in two at every layer
// boundary, chaining the first part's output into the second as a pipeline
// does, and requires the same loss to the bit.
func checkSplitEquivalence(t *testing.T, m *Model, batch int) {
	t.Helper()
	const seed = 11
	x, y := randomBatch(m, batch, rand.New(rand.NewPCG(5, 5)))
	n := len(m.Layers)
	whole := buildTestStage(t, m, 0, n, batch, seed).forward(t, x, y)
	for k := 1; k < n; k++ {
		h := buildTestStage(t, m, 0, k, batch, seed).forward(t, x, nil)
		if want := m.ShapeAt(k, batch); !h.Shape().Eq(want) {
			t.Fatalf("cut at %d: activation shape %v, ShapeAt says %v", k, h.Shape(), want)
		}
		split := buildTestStage(t, m, k, n, batch, seed).forward(t, h, y)
		if lossBits(t, split) != lossBits(t, whole) {
			t.Errorf("cut before %s: loss %v, whole model %v", m.Layers[k].Name(), split.Data(), whole.Data())
		}
	}
}

// lossBits is the bit pattern of a 1-element loss tensor.
func lossBits(t *testing.T, v *tensor.Dense) uint64 {
	t.Helper()
	switch d := v.Data().(type) {
	case []float32:
		return uint64(math.Float32bits(d[0]))
	case []float64:
		return math.Float64bits(d[0])
	}
	t.Fatalf("loss of dtype %v", v.Dtype())
	return 0
}

// modelGrads differentiates the whole model's loss on one micro-batch and
// returns each parameter's gradient, as float64, by name.
func modelGrads(t *testing.T, m *Model, x *tensor.Dense, y []int, seed uint64) map[string][]float64 {
	t.Helper()
	s := buildTestStage(t, m, 0, len(m.Layers), x.Shape()[0], seed)
	if _, err := G.Grad(s.out, s.params...); err != nil {
		t.Fatal(err)
	}
	if err := G.Let(s.x, x); err != nil {
		t.Fatal(err)
	}
	if err := G.Let(s.onehot, oneHotTargets(m, y)); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(s.g, G.BindDualValues(s.params...))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, p := range s.params {
		g, err := p.Grad()
		if err != nil {
			t.Fatalf("%s: %v", p.Name(), err)
		}
		out[p.Name()] = toFloat64s(g.Data())
	}
	return out
}

func toFloat64s(d any) []float64 {
	switch v := d.(type) {
	case []float64:
		return append([]float64(nil), v...)
	case []float32:
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	panic("not float data")
}

// checkFloat32Backward runs the backward in float32 and float64 on the same
// batch and requires the gradients to agree to float32 accuracy: the
// finite-difference checks run in float64 only, and gorgonia's kernels are
// per dtype.
func checkFloat32Backward(t *testing.T, spec Spec, batch int) {
	t.Helper()
	spec.DType = "float64"
	m64 := buildModel(t, spec)
	spec.DType = "float32"
	m32 := buildModel(t, spec)
	x, y := randomBatch(m64, batch, rand.New(rand.NewPCG(12, 12)))
	x32 := denseOf(tensor.Float32, x.Data().([]float64), x.Shape()...)
	g64, g32 := modelGrads(t, m64, x, y, 2), modelGrads(t, m32, x32, y, 2)
	for name, want := range g64 {
		got, scale := g32[name], 0.0
		for _, v := range want {
			scale = max(scale, math.Abs(v))
		}
		for i := range want {
			// The floor covers gradients that are zero but for rounding, like
			// that of the key bias (softmax ignores a per-row shift).
			if d := math.Abs(got[i] - want[i]); d > 1e-3*scale+1e-9 {
				t.Errorf("%s[%d]: float32 %g, float64 %g (largest entry %g)", name, i, got[i], want[i], scale)
				break
			}
		}
	}
}
