package models

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// tinyLlama is a small Llama: 2 blocks of width 8, 4 query heads of 4
// (head_dim given, so the queries are wider than the model), kvHeads key
// and value heads, an MLP of 12, and a rope_theta and rms_norm_eps of its
// own, so that every key reaches the ops.
func tinyLlama(dtype string, tied bool, kvHeads int) Spec {
	return Spec{Name: "llama", DType: dtype, Layers: 2, Width: 8, Heads: 4, Context: 5, Vocab: 11, TieEmbeddings: tied,
		Own: map[string]any{"intermediate": 12, "kv_heads": kvHeads, "head_dim": 4, "rms_norm_eps": 1e-5, "rope_theta": 500.0}}
}

func TestGradRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 21))
	x, gain := randDense(r, 1, 5, 6), randDense(r, 1, 6)
	checkGrads(t, []*tensor.Dense{x, gain}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		return o.rmsNorm(in[0], in[1], 1e-5), o.err
	})
}

func TestGradRoPE(t *testing.T) {
	r := rand.New(rand.NewPCG(22, 22))
	x := randDense(r, 1, 2*5, 3*6) // 2 sequences of 5 tokens, 3 heads of 6
	checkGrads(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		return o.rope(in[0], rotary{context: 5, headDim: 6, theta: 100}), o.err
	})
}

func TestGradSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 23))
	gate, up := randDense(r, 2, 4, 7), randDense(r, 1, 4, 7)
	checkGrads(t, []*tensor.Dense{gate, up}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
		o := newOps(tensor.Float64)
		return o.swiglu(in[0], in[1]), o.err
	})
}

func TestGradGroupedAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 24))
	const batch, context, heads, dh = 2, 4, 4, 3
	for _, kv := range []int{1, 2, 4} {
		q := randDense(r, 1, batch*context, heads*dh)
		k, v := randDense(r, 1, batch*context, kv*dh), randDense(r, 1, batch*context, kv*dh)
		for _, keep := range []bool{true, false} {
			t.Run(fmt.Sprintf("kv=%d/keep=%v", kv, keep), func(t *testing.T) {
				checkGrads(t, []*tensor.Dense{q, k, v}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
					o := newOps(tensor.Float64)
					return o.groupedAttention(in[0], in[1], in[2], batch, context, heads, kv, keep), o.err
				})
			})
		}
	}
}

// TestGradAttentionBlocks: with blocks of queries smaller than the context
// (the last one partial), the attention's backward still matches central
// differences, grouped or not, probabilities kept or recomputed.
func TestGradAttentionBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 26))
	const batch, context, heads, dh, blk = 2, 7, 4, 3, 3
	for _, kv := range []int{2, 4} {
		q := randDense(r, 1, batch*context, heads*dh)
		k, v := randDense(r, 1, batch*context, kv*dh), randDense(r, 1, batch*context, kv*dh)
		for _, keep := range []bool{true, false} {
			t.Run(fmt.Sprintf("kv=%d/keep=%v", kv, keep), func(t *testing.T) {
				checkGrads(t, []*tensor.Dense{q, k, v}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
					o := newOps(tensor.Float64)
					return o.attend(in[0], in[1], in[2], attention{context: context, heads: heads, kvHeads: kv, keep: keep, blk: blk}), o.err
				})
			})
		}
	}
}

// attentionValues runs attention a on q, k and v and returns its output and
// the gradients of q, k and v under a weighted sum of it.
func attentionValues(t *testing.T, q, k, v *tensor.Dense, a attention) [][]float64 {
	t.Helper()
	g := G.NewGraph()
	in := []*G.Node{newParam(g, "q", q.Clone().(*tensor.Dense)), newParam(g, "k", k.Clone().(*tensor.Dense)), newParam(g, "v", v.Clone().(*tensor.Dense))}
	o := newOps(q.Dtype())
	y := o.attend(in[0], in[1], in[2], a)
	if o.err != nil {
		t.Fatal(o.err)
	}
	w := randDense(rand.New(rand.NewPCG(7, 7)), 1, y.Shape()...)
	loss, err := G.Sum(G.Must(G.HadamardProd(y, G.NewConstant(denseOf(q.Dtype(), w.Data().([]float64), y.Shape()...)))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := G.Grad(loss, in...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(in...))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	var out [][]float64
	for _, n := range append([]*G.Node{y}, in...) {
		val := n.Value()
		if n != y {
			d, err := n.Grad()
			if err != nil {
				t.Fatal(err)
			}
			val = d
		}
		switch x := val.Data().(type) {
		case []float32:
			f := make([]float64, len(x))
			for i, e := range x {
				f[i] = float64(e)
			}
			out = append(out, f)
		case []float64:
			out = append(out, slices.Clone(x))
		}
	}
	return out
}

// TestAttentionBlocksMatchOneBlock: the products over blocks of queries
// skip only terms that are exactly zero (scores the mask drops,
// probabilities after the query), so the output and every gradient are
// those of one block over the whole context up to the order in which the
// BLAS sums (OpenBLAS's kernels sum a shorter product in another order; the
// loss of bench-llama-10m's first step moved in its 8th digit), in float32
// and float64.
func TestAttentionBlocksMatchOneBlock(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 27))
	const batch, context, heads, kv, dh = 2, 13, 4, 2, 5
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		tol := 1e-13
		if dt == tensor.Float32 {
			tol = 1e-5
		}
		ins := make([]*tensor.Dense, 3)
		for i, w := range []int{heads * dh, kv * dh, kv * dh} {
			ins[i] = denseOf(dt, randDense(r, 1, batch*context, w).Data().([]float64), batch*context, w)
		}
		for _, keep := range []bool{true, false} {
			whole := attentionValues(t, ins[0], ins[1], ins[2], attention{context: context, heads: heads, kvHeads: kv, keep: keep, blk: context})
			for _, blk := range []int{1, 2, 4, 5, 12} {
				got := attentionValues(t, ins[0], ins[1], ins[2], attention{context: context, heads: heads, kvHeads: kv, keep: keep, blk: blk})
				for i, name := range []string{"output", "dq", "dk", "dv"} {
					for j, want := range whole[i] {
						if d := math.Abs(got[i][j] - want); !(d <= tol*max(1, math.Abs(want))) {
							t.Fatalf("%v keep=%v blocks of %d: %s[%d] = %v, %v in one block", dt, keep, blk, name, j, got[i][j], want)
						}
					}
				}
			}
		}
	}
}

// repeatKV is Hugging Face's repeat_kv on (n, kv·dh) rows: each head
// repeated group times in place, giving (n, kv·group·dh).
func repeatKV(x *tensor.Dense, dh, group int) *tensor.Dense {
	n, w := x.Shape()[0], x.Shape()[1]
	src := x.Data().([]float32)
	out := make([]float32, 0, n*w*group)
	for r := range n {
		for h := 0; h < w; h += dh {
			for range group {
				out = append(out, src[r*w+h:r*w+h+dh]...)
			}
		}
	}
	return tensor.New(tensor.WithShape(n, w*group), tensor.WithBacking(out))
}

// TestGroupedAttentionIsRepeatedKV: grouped-query attention computes the
// bits of plain attention on keys and values whose heads are repeated, as
// Hugging Face's repeat_kv does, in float32's vector kernels too.
func TestGroupedAttentionIsRepeatedKV(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 25))
	const batch, context, heads, kv, dh = 2, 5, 6, 2, 4
	f32 := func(d *tensor.Dense) *tensor.Dense {
		return denseOf(tensor.Float32, d.Data().([]float64), d.Shape()...)
	}
	q := f32(randDense(r, 1, batch*context, heads*dh))
	k, v := f32(randDense(r, 1, batch*context, kv*dh)), f32(randDense(r, 1, batch*context, kv*dh))
	grouped, err := runNode(t, []*tensor.Dense{q, k, v}, func(o *ops, in []*G.Node) *G.Node {
		return o.groupedAttention(in[0], in[1], in[2], batch, context, heads, kv, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := runNode(t, []*tensor.Dense{q, repeatKV(k, dh, heads/kv), repeatKV(v, dh, heads/kv)}, func(o *ops, in []*G.Node) *G.Node {
		return o.causalAttention(in[0], in[1], in[2], batch, context, heads, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sameBits(grouped, plain) {
		t.Errorf("grouped attention differs from attention on repeated keys and values")
	}
	o := newOps(tensor.Float32)
	g := G.NewGraph()
	qn := newParam(g, "q", q)
	if o.groupedAttention(qn, newParam(g, "k", k), newParam(g, "v", v), batch, context, heads, 4, true); o.err == nil ||
		!strings.Contains(o.err.Error(), "6 heads sharing 4 key and value heads") {
		t.Errorf("4 kv heads for 6 heads: error %v", o.err)
	}
}

// TestRoPEIsHalfSplitRotation: dimensions i and i+dh/2 of a head at position
// t turn by t·theta^(−2i/dh), the first half cos·x₁ − sin·x₂; position 0 is
// left alone.
func TestRoPEIsHalfSplitRotation(t *testing.T) {
	const context, dh, theta = 3, 4, 100.0
	x := make([]float64, context*2*dh) // 2 heads
	for i := range x {
		x[i] = float64(i%7) - 3
	}
	got, err := runNode(t, []*tensor.Dense{denseOf(tensor.Float64, x, context, 2*dh)}, func(o *ops, in []*G.Node) *G.Node {
		return o.rope(in[0], rotary{context: context, headDim: dh, theta: theta})
	})
	if err != nil {
		t.Fatal(err)
	}
	y := got.Data().([]float64)
	for pos := range context {
		for h := range 2 {
			for i := range dh / 2 {
				a := float64(pos) * math.Pow(theta, -float64(2*i)/dh)
				at := pos*2*dh + h*dh
				x1, x2 := x[at+i], x[at+i+dh/2]
				w1, w2 := x1*math.Cos(a)-x2*math.Sin(a), x2*math.Cos(a)+x1*math.Sin(a)
				if math.Abs(y[at+i]-w1) > 1e-12 || math.Abs(y[at+i+dh/2]-w2) > 1e-12 {
					t.Errorf("position %d head %d pair %d: (%v, %v), want (%v, %v)", pos, h, i, y[at+i], y[at+i+dh/2], w1, w2)
				}
			}
		}
	}
}

// perturb adds N(0, sd) to every entry of each node's value, so that
// tests run far from the initial weights' near-uniform attention and unit
// gains.
func perturb(r *rand.Rand, sd float64, nodes ...*G.Node) {
	for _, n := range nodes {
		switch d := n.Value().Data().(type) {
		case []float64:
			for i := range d {
				d[i] += r.NormFloat64() * sd
			}
		case []float32:
			for i := range d {
				d[i] += float32(r.NormFloat64() * sd)
			}
		}
	}
}

// TestGradLlamaBlock checks one whole block, grouped and not, keeping its
// attention's probabilities and recomputing them, with respect to its
// input and every parameter.
func TestGradLlamaBlock(t *testing.T) {
	for _, kv := range []int{2, 4} {
		m := buildModel(t, tinyLlama("float64", false, kv))
		for _, recompute := range []bool{false, true} {
			t.Run(fmt.Sprintf("kv=%d/recompute=%v", kv, recompute), func(t *testing.T) {
				layer := m.Layers[1]
				if recompute {
					layer = layer.(RecomputingInternals).RecomputingInternals()
				}
				r := rand.New(rand.NewPCG(26, 26))
				g := G.NewGraph()
				x := newParam(g, "x", randDense(r, 1, 2*5, 8))
				b, err := layer.Build(g, x, 3)
				if err != nil {
					t.Fatal(err)
				}
				perturb(r, 0.3, b.Params...)
				checkGraphGrads(t, g, weightedSum(t, g, b.Out), append([]*G.Node{x}, b.Params...), 0)
			})
		}
	}
}

// TestLlamaGradients checks the whole tiny Llama's loss, tied and untied,
// grouped, with respect to every parameter (a spread of entries each).
func TestLlamaGradients(t *testing.T) {
	for _, tied := range []bool{true, false} {
		m := buildModel(t, tinyLlama("float64", tied, 2))
		const batch = 2
		s := buildTestStage(t, m, 0, len(m.Layers), batch, 3)
		r := rand.New(rand.NewPCG(27, 27))
		perturb(r, 0.3, s.params...)
		x, y := randomBatch(m, batch, r)
		if err := G.Let(s.x, x); err != nil {
			t.Fatal(err)
		}
		if err := G.Let(s.onehot, oneHotTargets(m, y)); err != nil {
			t.Fatal(err)
		}
		checkGraphGrads(t, s.g, s.out, s.params, 12)
	}
}

func TestLlamaSplitEquivalence(t *testing.T) {
	for _, dt := range []string{"float32", "float64"} {
		for _, tied := range []bool{true, false} {
			checkSplitEquivalence(t, buildModel(t, tinyLlama(dt, tied, 2)), 3)
		}
	}
}

func TestLlamaFloat32Backward(t *testing.T) {
	checkFloat32Backward(t, tinyLlama("", true, 2), 2)
	checkFloat32Backward(t, tinyLlama("", false, 1), 2)
}

// TestLlamaRecomputingIsTheSameBlock: the block that recomputes attention's
// probabilities gives the forward's and the backward's bits of the one
// that keeps them.
func TestLlamaRecomputingIsTheSameBlock(t *testing.T) {
	m := buildModel(t, tinyLlama("float32", false, 2))
	x, y := randomBatch(m, 2, rand.New(rand.NewPCG(28, 28)))
	want := modelGrads(t, m, x, y, 5)
	for i, l := range m.Layers {
		if r, ok := l.(RecomputingInternals); ok {
			m.Layers[i] = r.RecomputingInternals()
		}
	}
	got := modelGrads(t, m, x, y, 5)
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("%s: recomputing the probabilities changes the gradient", name)
		}
	}
}

func TestLlamaLayout(t *testing.T) {
	m := buildModel(t, tinyLlama("float32", true, 2))
	var names []string
	for _, l := range m.Layers {
		names = append(names, l.Name())
	}
	if want := []string{"embed", "block0", "block1", "head"}; !slices.Equal(names, want) {
		t.Fatalf("layers %v, want %v", names, want)
	}
	for i, want := range []tensor.Shape{{3, 5}, {15, 8}, {15, 8}, {15, 8}, {15, 11}} {
		if got := m.ShapeAt(i, 3); !got.Eq(want) {
			t.Errorf("ShapeAt(%d) = %v, want %v", i, got, want)
		}
	}
	if m.Classes != 11 || m.Targets() != 5 || !m.Example.Eq(tensor.Shape{5}) {
		t.Errorf("Classes %d, Targets %d, Example %v", m.Classes, m.Targets(), m.Example)
	}
	if want := [][2]string{{"embed.tok", "head.tok"}}; !slices.Equal(m.Tied, want) {
		t.Errorf("Tied = %v, want %v", m.Tied, want)
	}
	s := buildTestStage(t, m, 0, len(m.Layers), 2, 1)
	var got []string
	for _, p := range s.params {
		got = append(got, fmt.Sprintf("%s %v", p.Name(), p.Shape()))
	}
	block := []string{"attn_norm.gain (8)", "attn.q.weight (8, 16)", "attn.k.weight (8, 8)", "attn.v.weight (8, 8)",
		"attn.o.weight (16, 8)", "mlp_norm.gain (8)", "mlp.gate.weight (8, 12)", "mlp.up.weight (8, 12)", "mlp.down.weight (12, 8)"}
	want := append([]string{"embed.tok (11, 8)"}, prefixed("block0.", block)...)
	want = append(append(want, prefixed("block1.", block)...), "head.norm.gain (8)", "head.tok (11, 8)")
	if !slices.Equal(got, want) {
		t.Errorf("parameters\n%q\nwant\n%q", got, want)
	}
	embed, head := buildTestStage(t, m, 0, 1, 2, 21).params[0], buildTestStage(t, m, 3, 4, 2, 21).params[1]
	if !sameBits(embed.Value().(*tensor.Dense), head.Value().(*tensor.Dense)) {
		t.Error("head.tok does not start as embed.tok")
	}
	untied := buildModel(t, tinyLlama("float32", false, 2))
	if untied.Tied != nil {
		t.Errorf("untied model has Tied = %v", untied.Tied)
	}
	if p := buildTestStage(t, untied, 3, 4, 2, 1).params[1]; p.Name() != "head.weight" || !p.Shape().Eq(tensor.Shape{8, 11}) {
		t.Errorf("untied head's matrix %s %v", p.Name(), p.Shape())
	}
}

// TestLlamaDefaults: kv_heads defaults to heads, head_dim to width/heads,
// rms_norm_eps to 1e-6 and rope_theta to 10000.
func TestLlamaDefaults(t *testing.T) {
	sz, err := llamaSizesOf(Spec{Name: "llama", Layers: 1, Width: 12, Heads: 3, Context: 4, Vocab: 5, Own: map[string]any{"intermediate": 7}})
	if err != nil {
		t.Fatal(err)
	}
	if sz.kvHeads != 3 || sz.headDim != 4 || sz.eps != 1e-6 || sz.theta != 10000 || sz.intermediate != 7 {
		t.Errorf("sizes %+v", sz)
	}
}

func TestLlamaBuildErrors(t *testing.T) {
	ok := Spec{Name: "llama", Layers: 2, Width: 64, Heads: 4, Context: 16, Vocab: 256, Own: map[string]any{"intermediate": 128}}
	with := func(f func(*Spec)) Spec {
		s := ok
		s.Own = map[string]any{"intermediate": 128}
		f(&s)
		return s
	}
	cases := []struct {
		spec Spec
		want string
	}{
		{with(func(s *Spec) { s.Heads = 3 }), "model.heads: 3 does not divide model.width 64 (or give model.head_dim)"},
		{with(func(s *Spec) { s.Width = 12 }), "model.width/model.heads = 3 is odd"},
		{with(func(s *Spec) { s.Own["kv_heads"] = 3 }), "model.kv_heads: 3 does not divide model.heads 4"},
		{with(func(s *Spec) { s.Own["kv_heads"] = 0 }), "model.kv_heads: must be at least 1, got 0"},
		{with(func(s *Spec) { s.Own["head_dim"] = 5 }), "model.head_dim: 5 is odd"},
		{with(func(s *Spec) { delete(s.Own, "intermediate") }), "model.intermediate: missing"},
		{with(func(s *Spec) { s.Own["intermediate"] = "big" }), "model.intermediate: a string, want an integer"},
		{with(func(s *Spec) { s.Own["rms_norm_eps"] = 0.0 }), "model.rms_norm_eps: must be positive, got 0"},
		{with(func(s *Spec) { s.Own["rope_theta"] = 1.0 }), "model.rope_theta: must be more than 1, got 1"},
		{with(func(s *Spec) { s.Layers = 0 }), "model.layers: must be at least 1, got 0"},
		{with(func(s *Spec) { s.Vocab = 1<<24 + 1 }), "model.vocab: 16777217 is too large for float32 token ids"},
	}
	for _, c := range cases {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.want)
		}
	}
	// Every problem is reported, each under its key.
	_, err := Build(with(func(s *Spec) { s.Context = 0; s.Own["kv_heads"] = 3; s.Own["rope_theta"] = -1.0 }))
	var errs SpecErrors
	if !errors.As(err, &errs) || len(errs) != 3 {
		t.Errorf("three bad keys: %v", err)
	}
	// A head_dim makes heads that do not divide the width valid.
	if _, err := Build(with(func(s *Spec) { s.Heads = 3; s.Own["head_dim"] = 10 })); err != nil {
		t.Errorf("heads 3 of head_dim 10: %v", err)
	}
	if m, err := Build(with(func(s *Spec) { s.Input, s.Classes = 784, 10 })); err != nil || m.Classes != 256 {
		t.Errorf("valid spec: %v", err)
	}
}

// TestLlamaLayersCompose: the Llama's layers built one by one from
// LlamaSpec are the layers model llama builds, and a bad spec is refused
// naming the layer and each field.
func TestLlamaLayersCompose(t *testing.T) {
	m := buildModel(t, tinyLlama("float64", true, 2))
	s := LlamaSpec{Layers: 2, Width: 8, Heads: 4, KVHeads: 2, HeadDim: 4, Intermediate: 12, Context: 5, Vocab: 11,
		RMSNormEps: 1e-5, RopeTheta: 500, TieEmbeddings: true, DType: tensor.Float64}
	var layers []Layer
	add := func(l Layer, err error) {
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	add(NewLlamaEmbed(s))
	for i := range s.Layers {
		add(NewLlamaBlock(i, s))
	}
	add(NewLlamaHead(s))
	if len(layers) != len(m.Layers) {
		t.Fatalf("%d layers composed, model llama has %d", len(layers), len(m.Layers))
	}
	for i, l := range layers {
		if got, want := fmt.Sprintf("%+v", l), fmt.Sprintf("%+v", m.Layers[i]); got != want {
			t.Errorf("layer %d: %s, model llama makes %s", i, got, want)
		}
	}
	// Zeros are the defaults.
	l, err := NewLlamaBlock(0, LlamaSpec{Layers: 1, Width: 8, Heads: 2, Intermediate: 3, Context: 2, Vocab: 5})
	if err != nil {
		t.Fatal(err)
	}
	if sz := l.(*llamaBlock).sz; sz.kvHeads != 2 || sz.headDim != 4 || sz.eps != 1e-6 || sz.theta != 10000 || sz.dt != tensor.Float32 {
		t.Errorf("defaults: %+v", sz)
	}
	_, err = NewLlamaBlock(0, LlamaSpec{Layers: 1, Width: 8, Heads: 4, KVHeads: 3, Context: 0, Vocab: 11})
	if want := `llama block layer "block0": context: must be at least 1, got 0; intermediate: must be at least 1, got 0; kv_heads: 3 does not divide model.heads 4`; err == nil || err.Error() != want {
		t.Errorf("NewLlamaBlock: %v, want %s", err, want)
	}
	if _, err := NewLlamaBlock(2, s); err == nil || !strings.Contains(err.Error(), "index 2 outside the model's 2 blocks") {
		t.Errorf("NewLlamaBlock(2): %v", err)
	}
}
