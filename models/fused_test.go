package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// valueAndGrads runs sum(y .* R) for y = build(inputs) and returns y and the
// gradient of that sum with respect to every input but the last data ones,
// which get none. (Data inputs are graph inputs, not constants: an op on
// constants alone, such as a one-hot of token ids, has no graph to join.)
func valueAndGrads(t *testing.T, ins []*tensor.Dense, data int, build func(o *ops, in []*G.Node) *G.Node) ([]float64, [][]float64) {
	t.Helper()
	g := G.NewGraph()
	all := make([]*G.Node, len(ins))
	for i, v := range ins {
		if i < len(ins)-data {
			all[i] = newParam(g, fmt.Sprintf("in%d", i), v.Clone().(*tensor.Dense))
		} else {
			all[i] = newParam(g, fmt.Sprintf("data%d", i), v.Clone().(*tensor.Dense))
		}
	}
	nodes := all[:len(ins)-data]
	o := newOps(ins[0].Dtype())
	y := build(o, all)
	if o.err != nil {
		t.Fatal(o.err)
	}
	loss := weightedSum(t, g, y)
	if _, err := G.Grad(loss, nodes...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(nodes...))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	grads := make([][]float64, len(nodes))
	for i, n := range nodes {
		gv, err := n.Grad()
		if err != nil {
			t.Fatal(err)
		}
		grads[i] = append([]float64(nil), gv.Data().([]float64)...)
	}
	if s, ok := y.Value().(*G.F64); ok {
		return []float64{float64(*s)}, grads
	}
	return append([]float64(nil), y.Value().Data().([]float64)...), grads
}

// oneHotRows is n one-hot rows of c classes, the class of each random.
func oneHotRows(r *rand.Rand, n, c int) *tensor.Dense {
	t := tensor.New(tensor.WithShape(n, c), tensor.Of(tensor.Float64))
	for i := range n {
		t.Data().([]float64)[i*c+r.IntN(c)] = 1
	}
	return t
}

// TestFusedMatchComposed: each fused op computes, forward and backward,
// what the same layer composed from gorgonia's ops computes, to float64
// rounding.
func TestFusedMatchComposed(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	const batch, context, heads, width = 2, 5, 3, 6
	for _, c := range []struct {
		name            string
		ins             []*tensor.Dense
		data            int // trailing inputs that get no gradient
		fused, composed func(o *ops, in []*G.Node) *G.Node
	}{
		{"layer norm", []*tensor.Dense{randDense(r, 2, 7, 5), randDense(r, 1, 5), randDense(r, 1, 5)}, 0,
			func(o *ops, in []*G.Node) *G.Node { return o.layerNorm(in[0], in[1], in[2]) },
			func(o *ops, in []*G.Node) *G.Node { return o.composedLayerNorm(in[0], in[1], in[2]) }},
		{"gelu", []*tensor.Dense{randDense(r, 3, 4, 9)}, 0,
			func(o *ops, in []*G.Node) *G.Node { return o.gelu(in[0]) },
			func(o *ops, in []*G.Node) *G.Node { return o.composedGELU(in[0]) }},
		{"bias add", []*tensor.Dense{randDense(r, 1, 4, 3), randDense(r, 1, 3)}, 0,
			func(o *ops, in []*G.Node) *G.Node { return o.biasAdd(in[0], in[1]) },
			func(o *ops, in []*G.Node) *G.Node { return o.bcastAdd(in[0], in[1], 0) }},
		{"causal attention", []*tensor.Dense{randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width)}, 0,
			func(o *ops, in []*G.Node) *G.Node {
				return o.causalAttention(in[0], in[1], in[2], batch, context, heads, true)
			},
			func(o *ops, in []*G.Node) *G.Node {
				return o.composedAttention(in[0], in[1], in[2], batch, context, heads)
			}},
		{"causal attention, probabilities recomputed", []*tensor.Dense{randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width)}, 0,
			func(o *ops, in []*G.Node) *G.Node {
				return o.causalAttention(in[0], in[1], in[2], batch, context, heads, false)
			},
			func(o *ops, in []*G.Node) *G.Node {
				return o.composedAttention(in[0], in[1], in[2], batch, context, heads)
			}},
		{"embedding", []*tensor.Dense{randDense(r, 1, 7, width), randDense(r, 1, context, width), denseOf(tensor.Float64, []float64{3, 0, 6, 3, 1, 2, 3, 3, 0, 5}, batch, context)}, 1,
			func(o *ops, in []*G.Node) *G.Node { return o.embed(in[2], in[0], in[1]) },
			func(o *ops, in []*G.Node) *G.Node { return o.composedEmbed(in[2], in[0], in[1]) }},
		{"cross-entropy", []*tensor.Dense{randDense(r, 3, 6, 5), oneHotRows(r, 6, 5)}, 1,
			func(o *ops, in []*G.Node) *G.Node {
				return o.do("loss", func() (*G.Node, error) { return SoftmaxCrossEntropy(in[0], in[1]) })
			},
			func(o *ops, in []*G.Node) *G.Node { return o.composedCrossEntropy(in[0], in[1]) }},
	} {
		y1, g1 := valueAndGrads(t, c.ins, c.data, c.fused)
		y2, g2 := valueAndGrads(t, c.ins, c.data, c.composed)
		if d := maxRelDiff(y1, y2); d > 1e-12 {
			t.Errorf("%s: forward differs from the composed layer by %.2g", c.name, d)
		}
		for i := range g1 {
			if d := maxRelDiff(g1[i], g2[i]); d > 1e-10 {
				t.Errorf("%s: gradient of input %d differs from the composed layer's by %.2g", c.name, i, d)
			}
		}
	}
}

func maxRelDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	worst := 0.0
	for i := range a {
		worst = max(worst, relErr(a[i], b[i]))
	}
	return worst
}

// TestAttentionIsCausal: changing a later token's key and value leaves every
// earlier token's output bit for bit as it was.
func TestAttentionIsCausal(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	const context, heads, width = 6, 2, 4
	q, k, v := randDense(r, 1, context, width), randDense(r, 1, context, width), randDense(r, 1, context, width)
	run := func() []float64 {
		got, err := runNode(t, []*tensor.Dense{q, k, v}, func(o *ops, in []*G.Node) *G.Node {
			return o.causalAttention(in[0], in[1], in[2], 1, context, heads, true)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got.Data().([]float64)
	}
	before := run()
	for j := range width {
		k.Data().([]float64)[4*width+j] += 3
		v.Data().([]float64)[4*width+j] -= 2
	}
	after := run()
	for i := range 4 * width {
		if before[i] != after[i] {
			t.Fatalf("output %d (token %d) changed when token 4 did", i, i/width)
		}
	}
	if fmt.Sprint(before[4*width:]) == fmt.Sprint(after[4*width:]) {
		t.Fatal("token 4's own output did not change; the test changes nothing")
	}
}

// TestFusedFloat32MatchesFloat64: the float32 kernels compute the float64
// ones' values to float32 precision.
func TestFusedFloat32MatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 13))
	const batch, context, heads, width = 2, 8, 2, 8
	ins := []*tensor.Dense{randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width), randDense(r, 1, width), randDense(r, 1, width)}
	layer := func(o *ops, in []*G.Node) *G.Node {
		a := o.causalAttention(o.layerNorm(in[0], in[3], in[4]), in[1], in[2], batch, context, heads, true)
		return o.gelu(o.biasAdd(a, in[4]))
	}
	want, err := runNode(t, ins, layer)
	if err != nil {
		t.Fatal(err)
	}
	ins32 := make([]*tensor.Dense, len(ins))
	for i, d := range ins {
		ins32[i] = denseOf(tensor.Float32, d.Data().([]float64), d.Shape()...)
	}
	got, err := runNode(t, ins32, layer)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want.Data().([]float64) {
		if g := float64(got.Data().([]float32)[i]); math.Abs(g-w) > 1e-5*max(1, math.Abs(w)) {
			t.Errorf("element %d: float32 %v, float64 %v", i, g, w)
		}
	}
}
