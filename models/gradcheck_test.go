package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// gradTol is the relative tolerance between symbolic and central-difference
// gradients in float64; the difference step below keeps the truncation and
// rounding errors of the difference well under it.
const (
	gradTol  = 1e-6
	gradStep = 1e-5
)

// randDense is a float64 tensor of the given shape with N(0, sd) entries.
func randDense(r *rand.Rand, sd float64, shape ...int) *tensor.Dense {
	v := make([]float64, tensor.Shape(shape).TotalSize())
	for i := range v {
		v[i] = r.NormFloat64() * sd
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}

// checkGrads differentiates a float64 graph symbolically and compares every
// gradient entry with a central difference. build gets one node per input
// (named in0, in1, ..., holding ins) and returns any node y; the checked scalar
// is sum(y .* R) for a fixed random R, so that every entry of y's gradient
// matters.
func checkGrads(t *testing.T, ins []*tensor.Dense, build func(g *G.ExprGraph, in []*G.Node) (*G.Node, error)) {
	t.Helper()
	g := G.NewGraph()
	nodes := make([]*G.Node, len(ins))
	for i, v := range ins {
		nodes[i] = newParam(g, fmt.Sprintf("in%d", i), v)
	}
	y, err := build(g, nodes)
	if err != nil {
		t.Fatal(err)
	}
	checkGraphGrads(t, g, weightedSum(t, g, y), nodes, 0)
}

// checkGraphGrads compares the symbolic gradient of the scalar loss with
// respect to each of wrt (float64 nodes holding values) with central
// differences, on every entry, or on at most perNode entries spread over each
// node when perNode > 0. Values are changed in place and restored.
func checkGraphGrads(t *testing.T, g *G.ExprGraph, loss *G.Node, wrt []*G.Node, perNode int) {
	t.Helper()
	if _, err := G.Grad(loss, wrt...); err != nil {
		t.Fatalf("differentiating: %v", err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(wrt...))
	defer vm.Close()
	run := func() float64 {
		t.Helper()
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		return loss.Value().Data().(float64)
	}
	base := run()
	symbolic := make([][]float64, len(wrt))
	for i, n := range wrt {
		gv, err := n.Grad()
		if err != nil {
			t.Fatalf("%s: %v", n.Name(), err)
		}
		symbolic[i] = append([]float64(nil), gv.Data().([]float64)...)
	}
	if again := run(); again != base {
		t.Fatalf("second run gives loss %v, first %v: the program changes its own inputs", again, base)
	}
	for i, n := range wrt {
		compareCentral(t, n.Name(), n.Value().Data().([]float64), symbolic[i], spread(len(symbolic[i]), perNode), run)
	}
}

// spread picks at most k indices of [0, n) evenly spaced (all when k <= 0).
func spread(n, k int) []int {
	if k <= 0 || k > n {
		k = n
	}
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i * n / k
	}
	return idx
}

// weightedSum is sum(y .* R) with R a fixed random constant of y's shape.
func weightedSum(t *testing.T, g *G.ExprGraph, y *G.Node) *G.Node {
	t.Helper()
	if y.IsScalar() {
		return y
	}
	r := rand.New(rand.NewPCG(7, 7))
	w := G.NewConstant(randDense(r, 1, y.Shape()...), G.WithName("check_weights"))
	prod, err := G.HadamardProd(y, w)
	if err != nil {
		t.Fatal(err)
	}
	s, err := G.Sum(prod)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// compareCentral perturbs entries idx of x and checks (f(x+h)-f(x-h))/2h
// against the symbolic gradient.
func compareCentral(t *testing.T, name string, x, symbolic []float64, idx []int, f func() float64) {
	t.Helper()
	worst := 0.0
	for _, j := range idx {
		orig := x[j]
		x[j] = orig + gradStep
		up := f()
		x[j] = orig - gradStep
		down := f()
		x[j] = orig
		numeric := (up - down) / (2 * gradStep)
		if rel := relErr(symbolic[j], numeric); rel > gradTol {
			t.Errorf("%s[%d]: symbolic %.10g, central difference %.10g (relative error %.2g)", name, j, symbolic[j], numeric, rel)
		} else {
			worst = max(worst, rel)
		}
	}
	t.Logf("%s: %d of %d entries, worst relative error %.2g", name, len(idx), len(x), worst)
}

// relErr is |a-b| relative to the larger magnitude, with a floor so that
// entries that are zero up to rounding do not fail on noise.
func relErr(a, b float64) float64 {
	return math.Abs(a-b) / max(math.Abs(a), math.Abs(b), 1e-4)
}

func TestGradLayerNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	x := randDense(r, 1, 5, 6)
	gain := randDense(r, 1, 6)
	bias := randDense(r, 1, 6)
	checkGrads(t, []*tensor.Dense{x, gain, bias}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		y := o.layerNorm(in[0], in[1], in[2])
		return y, o.err
	})
}

func TestGradGELU(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	x := randDense(r, 2, 4, 7)
	checkGrads(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		y := o.gelu(in[0])
		return y, o.err
	})
}

func TestGradMaskedSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	s := randDense(r, 2, 3, 4, 4)
	checkGrads(t, []*tensor.Dense{s}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		y := o.maskedSoftmax(in[0], causalMask(tensor.Float64, 3, 4))
		return y, o.err
	})
}

func TestGradCausalAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	const batch, context, heads, width = 2, 4, 2, 6
	q, k, v := randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width), randDense(r, 1, batch*context, width)
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			checkGrads(t, []*tensor.Dense{q, k, v}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
				o := newOps(tensor.Float64)
				y := o.causalAttention(in[0], in[1], in[2], batch, context, heads, keep)
				return y, o.err
			})
		})
	}
}

// TestGradInvSqrt covers the replacement for gorgonia's InverseSqrt, whose
// derivative is wrong in v0.9.18.
func TestGradInvSqrt(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	x := randDense(r, 1, 3, 4)
	for i, v := range x.Data().([]float64) {
		x.Data().([]float64)[i] = 0.5 + v*v // keep it positive
	}
	checkGrads(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		y := o.invSqrt(in[0])
		return y, o.err
	})
}

// runNodes evaluates y in a fresh graph holding the given inputs.
func runNode(t *testing.T, ins []*tensor.Dense, build func(o *ops, in []*G.Node) *G.Node) (*tensor.Dense, error) {
	t.Helper()
	g := G.NewGraph()
	nodes := make([]*G.Node, len(ins))
	for i, v := range ins {
		nodes[i] = newParam(g, fmt.Sprintf("in%d", i), v)
	}
	o := newOps(ins[0].Dtype())
	y := build(o, nodes)
	if o.err != nil {
		t.Fatal(o.err)
	}
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		return nil, err
	}
	return y.Value().(*tensor.Dense).Clone().(*tensor.Dense), nil
}

// TestEmbedLooksUpRows: row b·context+t of the embedding is the token
// table's row of token ids[b, t] plus the position table's row t, and an id
// that is not a token is an error, in the forward and in the token table's
// gradient.
func TestEmbedLooksUpRows(t *testing.T) {
	ids := denseOf(tensor.Float32, []float64{2, 0, 1, 2}, 2, 2)
	tok := denseOf(tensor.Float32, []float64{1, 2, 10, 20, 100, 200}, 3, 2)
	pos := denseOf(tensor.Float32, []float64{0.5, 0.25, -1, -2}, 2, 2)
	got, err := runNode(t, []*tensor.Dense{ids, tok, pos}, func(o *ops, in []*G.Node) *G.Node { return o.embed(in[0], in[1], in[2]) })
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{100.5, 200.25, 0, 0, 10.5, 20.25, 99, 198}
	if !got.Shape().Eq(tensor.Shape{4, 2}) || !slices.Equal(got.Data().([]float32), want) {
		t.Errorf("embedding %v %v, want (4, 2) %v", got.Shape(), got.Data(), want)
	}
	dy := denseOf(tensor.Float64, []float64{1, 2, 3, 4}, 2, 2)
	for _, bad := range []float64{3, -1, 0.5} {
		ids := denseOf(tensor.Float64, []float64{0, bad}, 1, 2)
		tok, pos := denseOf(tensor.Float64, make([]float64, 6), 3, 2), denseOf(tensor.Float64, make([]float64, 4), 2, 2)
		_, err := runNode(t, []*tensor.Dense{ids, tok, pos}, func(o *ops, in []*G.Node) *G.Node { return o.embed(in[0], in[1], in[2]) })
		if err == nil || !strings.Contains(err.Error(), "is not an integer in [0, 3)") {
			t.Errorf("id %v: error %v", bad, err)
		}
		_, err = runNode(t, []*tensor.Dense{ids, dy}, func(o *ops, in []*G.Node) *G.Node {
			return o.fused(tokenGradOp[float32](3), tokenGradOp[float64](3), in[0], in[1])
		})
		if err == nil || !strings.Contains(err.Error(), "is not an integer in [0, 3)") {
			t.Errorf("id %v in the token gradient: error %v", bad, err)
		}
	}
}

// TestGradEmbed checks the token table's scattered gradient and the position
// table's summed one, with tokens repeated within and across sequences so
// that rows accumulate, and a token absent, whose row gets exactly zero.
func TestGradEmbed(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	const batch, context, vocab, width = 3, 4, 6, 5
	ids := make([]float64, batch*context)
	for i := range ids {
		ids[i] = float64(r.IntN(vocab - 1)) // token vocab-1 never appears
	}
	ids[1], ids[6] = ids[0], ids[0]
	g := G.NewGraph()
	tok := newParam(g, "tok", randDense(r, 1, vocab, width))
	pos := newParam(g, "pos", randDense(r, 1, context, width))
	x := G.NewConstant(denseOf(tensor.Float64, ids, batch, context), G.WithName("ids"))
	o := newOps(tensor.Float64)
	y := o.embed(x, tok, pos)
	if o.err != nil {
		t.Fatal(o.err)
	}
	checkGraphGrads(t, g, weightedSum(t, g, y), []*G.Node{tok, pos}, 0)
	gv, err := tok.Grad()
	if err != nil {
		t.Fatal(err)
	}
	for j, v := range gv.Data().([]float64)[(vocab-1)*width:] {
		if v != 0 {
			t.Errorf("absent token's gradient[%d] = %v, want 0", j, v)
		}
	}
}

// TestMaskedSoftmaxFloat32: rows sum to one, masked entries are exactly zero,
// and large scores do not overflow.
func TestMaskedSoftmaxFloat32(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	s := randDense(r, 30, 2, 5, 5)
	s32 := denseOf(tensor.Float32, s.Data().([]float64), 2, 5, 5)
	got, err := runNode(t, []*tensor.Dense{s32}, func(o *ops, in []*G.Node) *G.Node {
		return o.maskedSoftmax(in[0], causalMask(tensor.Float32, 2, 5))
	})
	if err != nil {
		t.Fatal(err)
	}
	p := got.Data().([]float32)
	for row := 0; row < 10; row++ {
		i, sum := row%5, float32(0)
		for j := 0; j < 5; j++ {
			v := p[row*5+j]
			if j > i && v != 0 {
				t.Errorf("row %d: masked entry %d is %v", row, j, v)
			}
			if math.IsNaN(float64(v)) {
				t.Errorf("row %d: NaN", row)
			}
			sum += v
		}
		if math.Abs(float64(sum)-1) > 1e-6 {
			t.Errorf("row %d sums to %v", row, sum)
		}
	}
}

// TestGradCrossEntropy checks the loss's gradient with respect to the
// logits; the targets, data, get none.
func TestGradCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	logits := randDense(r, 2, 5, 7)
	onehot := oneHotRows(r, 5, 7)
	g := G.NewGraph()
	x := newParam(g, "logits", logits)
	tg := G.NewConstant(onehot, G.WithName("targets"))
	loss, err := SoftmaxCrossEntropy(x, tg)
	if err != nil {
		t.Fatal(err)
	}
	checkGraphGrads(t, g, loss, []*G.Node{x}, 0)
}
