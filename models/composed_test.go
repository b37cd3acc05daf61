package models

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// The transformer's layers as first written, composed from gorgonia's own
// ops, which gorgonia differentiates: the fused ops (fused.go) must compute
// what these compute.

// invSqrt is 1/sqrt(a) composed as Inverse(Sqrt(a)): gorgonia v0.9.18's
// InverseSqrt has a wrong derivative (-g/(2y^3) instead of -g y^3/2).
func (o *ops) invSqrt(a *G.Node) *G.Node {
	s := o.do("sqrt", func() (*G.Node, error) { return G.Sqrt(a) })
	return o.do("inverse", func() (*G.Node, error) { return G.Inverse(s) })
}

// composedLayerNorm normalises each row of x (n, d) to zero mean and unit variance (the
// biased variance, as in GPT-2) and applies the learned per-feature gain and bias
// (d). Composed from gorgonia ops, so gorgonia derives its backward; the
// finite-difference test covers the composition.
func (o *ops) composedLayerNorm(x, gain, bias *G.Node) *G.Node {
	centred := o.bcastSub(x, o.mean(x, 1), 1)
	variance := o.mean(o.square(centred), 1)
	normed := o.bcastMul(centred, o.invSqrt(o.shift(variance, layerNormEps)), 1)
	return o.bcastAdd(o.bcastMul(normed, gain, 0), bias, 0)
}

// composedGELU is the tanh approximation GPT-2 uses:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
func (o *ops) composedGELU(x *G.Node) *G.Node {
	inner := o.scale(o.add(x, o.scale(o.cube(x), 0.044715)), math.Sqrt(2/math.Pi))
	return o.mul(o.scale(x, 0.5), o.shift(o.tanh(inner), 1))
}

// maskedNegative is added to the scores a query may not see. Large enough that
// exp underflows to exactly zero after the row maximum is subtracted, small
// enough to stay finite in float32.
const maskedNegative = -1e9

// maskedSoftmax is the softmax over the last axis of s (b, t, t) where mask
// (b, t, t, a constant) holds 0 where attending is allowed and maskedNegative
// where not. The row maximum is subtracted for stability through rowMaxOp, whose
// value the backward treats as a constant: softmax does not depend on it, so the
// exact gradient through it is zero anyway.
func (o *ops) maskedSoftmax(s, mask *G.Node) *G.Node {
	masked := o.add(s, mask)
	stable := o.bcastSub(masked, o.apply(rowMaxOp{}, masked), 2)
	e := o.exp(stable)
	return o.bcastDiv(e, o.sum(e, 2), 2)
}

// causalMask returns the constant (b, t, t) additive mask for maskedSoftmax:
// query i may attend to keys j <= i only.
func causalMask(dt tensor.Dtype, b, t int) *G.Node {
	m := tensor.New(tensor.Of(dt), tensor.WithShape(b, t, t))
	switch d := m.Data().(type) {
	case []float32:
		fillCausal(d, t)
	case []float64:
		fillCausal(d, t)
	}
	// The default name would print the whole tensor.
	return G.NewConstant(m, G.WithName(fmt.Sprintf("causal_mask_%dx%d", b, t)))
}

// fillCausal sets the entries above the diagonal of each t x t matrix in d.
func fillCausal[T float32 | float64](d []T, t int) {
	for k := 0; k < len(d); k += t * t {
		for i := 0; i < t; i++ {
			for j := i + 1; j < t; j++ {
				d[k+i*t+j] = maskedNegative
			}
		}
	}
}

// composedAttention is multi-head causal self-attention without its projections:
// q, k, v are (batch*context, width) with each row a token and head h owning
// columns [h*dh, (h+1)*dh); the result has the same layout, ready for the
// output projection.
func (o *ops) composedAttention(q, k, v *G.Node, batch, context, heads int) *G.Node {
	width := q.Shape()[1]
	dh := width / heads
	// (b*t, w) -> (b, t, h, dh) -> (b, h, t, dh) -> (b*h, t, dh): one matrix per sequence and head.
	split := func(x *G.Node) *G.Node {
		return o.reshape(o.transpose(o.reshape(x, batch, context, heads, dh), 0, 2, 1, 3), batch*heads, context, dh)
	}
	qh, kh, vh := split(q), split(k), split(v)
	scores := o.scale(o.batchedMatMul(qh, kh, false, true), 1/math.Sqrt(float64(dh)))
	p := o.maskedSoftmax(scores, causalMask(o.dt, batch*heads, context))
	att := o.batchedMatMul(p, vh, false, false) // (b*h, t, dh)
	return o.reshape(o.transpose(o.reshape(att, batch, heads, context, dh), 0, 2, 1, 3), batch*context, width)
}

// composedEmbed is the embedding as first written: the one-hot rows of the
// ids times the token table, plus the position table broadcast over the
// sequences.
func (o *ops) composedEmbed(ids, tok, pos *G.Node) *G.Node {
	batch, context, width := ids.Shape()[0], ids.Shape()[1], tok.Shape()[1]
	h := o.matMul(o.apply(oneHotOp{vocab: tok.Shape()[0]}, ids), tok)
	h = o.bcastAdd(o.reshape(h, batch, context*width), o.reshape(pos, context*width), 0)
	return o.reshape(h, batch*context, width)
}

// oneHotOp turns token ids (batch, context), stored as floats of the model's
// dtype, into a one-hot matrix (batch*context, vocab), row b*context+t for token
// t of sequence b. A matmul with the embedding table then is the lookup, and
// gorgonia derives the table's gradient from the matmul. The ids themselves are
// data: they get no gradient. The layer now looks rows up (embed), which
// TestFusedMatchComposed holds against this.
type oneHotOp struct{ vocab int }

func (op oneHotOp) Arity() int { return 1 }

func (op oneHotOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(G.TensorType{Dims: 2, Of: a}, G.TensorType{Dims: 2, Of: a})
}

func (op oneHotOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || s.Dims() != 2 {
		return nil, fmt.Errorf("one-hot: token ids must be (batch, context), got %v", in[0])
	}
	return tensor.Shape{s[0] * s[1], op.vocab}, nil
}

func (op oneHotOp) Do(in ...G.Value) (G.Value, error) {
	ids, ok := in[0].(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("one-hot: token ids are %T, want a dense tensor", in[0])
	}
	out := tensor.New(tensor.Of(ids.Dtype()), tensor.WithShape(ids.Shape().TotalSize(), op.vocab))
	var err error
	switch d := ids.Data().(type) {
	case []float32:
		err = fillOneHot(d, out.Data().([]float32), op.vocab)
	case []float64:
		err = fillOneHot(d, out.Data().([]float64), op.vocab)
	default:
		err = fmt.Errorf("one-hot: token ids of dtype %v, want float32 or float64", ids.Dtype())
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// fillOneHot sets out[i*vocab+ids[i]] = 1; out must be zeroed. A fractional or
// out-of-range id is an error, not a silently wrong row.
func fillOneHot[T float32 | float64](ids, out []T, vocab int) error {
	for i, v := range ids {
		id := int(v)
		if T(id) != v || id < 0 || id >= vocab {
			return fmt.Errorf("one-hot: token id %v at position %d is not an integer in [0, %d)", v, i, vocab)
		}
		out[i*vocab+id] = 1
	}
	return nil
}

func (op oneHotOp) ReturnsPtr() bool      { return false }
func (op oneHotOp) CallsExtern() bool     { return false }
func (op oneHotOp) OverwritesInput() int  { return -1 }
func (op oneHotOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "pipetrain.onehot(%d)", op.vocab) }
func (op oneHotOp) Hashcode() uint32      { return hashOf(op) }
func (op oneHotOp) String() string        { return fmt.Sprintf("OneHot{%d}", op.vocab) }

// DiffWRT and SymDiff make the op part of a differentiable graph whose input
// simply gets no gradient.
func (op oneHotOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }
func (op oneHotOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return make(G.Nodes, len(inputs)), nil
}

// rowMaxOp is the maximum over the last axis of a rank-3 tensor (b, r, c) ->
// (b, r). Softmax subtracts it for stability only, so it gets no gradient: the
// softmax's true derivative with respect to a per-row shift is zero.
type rowMaxOp struct{}

func (op rowMaxOp) Arity() int { return 1 }

func (op rowMaxOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(G.TensorType{Dims: 3, Of: a}, G.TensorType{Dims: 2, Of: a})
}

func (op rowMaxOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || s.Dims() != 3 {
		return nil, fmt.Errorf("row max: input must have 3 dimensions, got %v", in[0])
	}
	return tensor.Shape{s[0], s[1]}, nil
}

func (op rowMaxOp) Do(in ...G.Value) (G.Value, error) {
	x, ok := in[0].(*tensor.Dense)
	if !ok || x.Dims() != 3 {
		return nil, fmt.Errorf("row max: input is %T of shape %v, want a rank-3 dense tensor", in[0], in[0].Shape())
	}
	// The data is read flat, so a transposed view must be laid out first.
	if x.IsMaterializable() {
		x = x.Materialize().(*tensor.Dense)
	}
	s := x.Shape()
	out := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(s[0], s[1]))
	switch d := x.Data().(type) {
	case []float32:
		rowMax(d, out.Data().([]float32), s[2])
	case []float64:
		rowMax(d, out.Data().([]float64), s[2])
	default:
		return nil, fmt.Errorf("row max: dtype %v, want float32 or float64", x.Dtype())
	}
	return out, nil
}

// rowMax writes the maximum of each length-n row of x into out.
func rowMax[T float32 | float64](x, out []T, n int) {
	for r := range out {
		m := T(math.Inf(-1))
		for _, v := range x[r*n : (r+1)*n] {
			m = max(m, v)
		}
		out[r] = m
	}
}

func (op rowMaxOp) ReturnsPtr() bool      { return false }
func (op rowMaxOp) CallsExtern() bool     { return false }
func (op rowMaxOp) OverwritesInput() int  { return -1 }
func (op rowMaxOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "pipetrain.rowmax") }
func (op rowMaxOp) Hashcode() uint32      { return hashOf(op) }
func (op rowMaxOp) String() string        { return "RowMax" }

func (op rowMaxOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }
func (op rowMaxOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return make(G.Nodes, len(inputs)), nil
}

// composedCrossEntropy is the loss as first written: −mean(Σ onehot ·
// LogSoftMax(logits)).
func (o *ops) composedCrossEntropy(logits, onehot *G.Node) *G.Node {
	return o.do("composed cross-entropy", func() (*G.Node, error) {
		logp, err := G.LogSoftMax(logits)
		if err != nil {
			return nil, err
		}
		picked, err := G.HadamardProd(onehot, logp)
		if err != nil {
			return nil, err
		}
		perExample, err := G.Sum(picked, 1)
		if err != nil {
			return nil, err
		}
		mean, err := G.Mean(perExample)
		if err != nil {
			return nil, err
		}
		return G.Neg(mean)
	})
}
