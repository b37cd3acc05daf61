package models

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ops adds gorgonia nodes with a sticky error, so that a composite op reads as
// its formula instead of as a ladder of error checks: after the first failure
// every method returns nil without touching the graph, and err says what failed.
type ops struct {
	dt  tensor.Dtype
	err error
}

func newOps(dt tensor.Dtype) *ops { return &ops{dt: dt} }

// do runs one gorgonia constructor unless an earlier one failed; what names the
// operation in the error, since gorgonia's own messages rarely say which node.
func (o *ops) do(what string, f func() (*G.Node, error)) *G.Node {
	if o.err != nil {
		return nil
	}
	n, err := f()
	if err != nil {
		o.err = fmt.Errorf("%s: %w", what, err)
		return nil
	}
	return n
}

// scalar is a constant of the ops' dtype: gorgonia refuses to mix float32 and float64.
func (o *ops) scalar(v float64) *G.Node {
	if o.dt == tensor.Float64 {
		return G.NewConstant(v)
	}
	return G.NewConstant(float32(v))
}

func (o *ops) add(a, b *G.Node) *G.Node {
	return o.do("add", func() (*G.Node, error) { return G.Add(a, b) })
}

// mul is the element-wise product (either operand may be a scalar).
func (o *ops) mul(a, b *G.Node) *G.Node {
	return o.do("mul", func() (*G.Node, error) { return G.HadamardProd(a, b) })
}

// scale multiplies by a constant.
func (o *ops) scale(a *G.Node, c float64) *G.Node { return o.mul(a, o.scalar(c)) }

// shift adds a constant.
func (o *ops) shift(a *G.Node, c float64) *G.Node { return o.add(a, o.scalar(c)) }

func (o *ops) matMul(a, b *G.Node) *G.Node {
	return o.do("matmul", func() (*G.Node, error) { return G.Mul(a, b) })
}

// batchedMatMul multiplies matching matrices of two rank-3 tensors, optionally
// transposing the matrices of either.
func (o *ops) batchedMatMul(a, b *G.Node, transA, transB bool) *G.Node {
	return o.do("batched matmul", func() (*G.Node, error) { return G.BatchedMatMul(a, b, transA, transB) })
}

func (o *ops) reshape(a *G.Node, s ...int) *G.Node {
	return o.do(fmt.Sprintf("reshape to %v", s), func() (*G.Node, error) { return G.Reshape(a, tensor.Shape(s)) })
}

func (o *ops) transpose(a *G.Node, axes ...int) *G.Node {
	return o.do(fmt.Sprintf("transpose %v", axes), func() (*G.Node, error) { return G.Transpose(a, axes...) })
}

func (o *ops) sum(a *G.Node, axis int) *G.Node {
	return o.do("sum", func() (*G.Node, error) { return G.Sum(a, axis) })
}

func (o *ops) mean(a *G.Node, axis int) *G.Node {
	return o.do("mean", func() (*G.Node, error) { return G.Mean(a, axis) })
}

func (o *ops) exp(a *G.Node) *G.Node { return o.do("exp", func() (*G.Node, error) { return G.Exp(a) }) }
func (o *ops) tanh(a *G.Node) *G.Node {
	return o.do("tanh", func() (*G.Node, error) { return G.Tanh(a) })
}
func (o *ops) cube(a *G.Node) *G.Node {
	return o.do("cube", func() (*G.Node, error) { return G.Cube(a) })
}
func (o *ops) square(a *G.Node) *G.Node {
	return o.do("square", func() (*G.Node, error) { return G.Square(a) })
}
func (o *ops) relu(a *G.Node) *G.Node {
	return o.do("relu", func() (*G.Node, error) { return G.Rectify(a) })
}

// invSqrt is 1/sqrt(a) composed as Inverse(Sqrt(a)): gorgonia v0.9.18's
// InverseSqrt has a wrong derivative (-g/(2y^3) instead of -g y^3/2).
func (o *ops) invSqrt(a *G.Node) *G.Node {
	s := o.do("sqrt", func() (*G.Node, error) { return G.Sqrt(a) })
	return o.do("inverse", func() (*G.Node, error) { return G.Inverse(s) })
}

// The broadcast helpers combine a with b, where b lacks a's axes listed in
// along and is repeated over them.
func (o *ops) bcastAdd(a, b *G.Node, along ...byte) *G.Node {
	return o.do("broadcast add", func() (*G.Node, error) { return G.BroadcastAdd(a, b, nil, along) })
}

func (o *ops) bcastSub(a, b *G.Node, along ...byte) *G.Node {
	return o.do("broadcast sub", func() (*G.Node, error) { return G.BroadcastSub(a, b, nil, along) })
}

func (o *ops) bcastMul(a, b *G.Node, along ...byte) *G.Node {
	return o.do("broadcast mul", func() (*G.Node, error) { return G.BroadcastHadamardProd(a, b, nil, along) })
}

func (o *ops) bcastDiv(a, b *G.Node, along ...byte) *G.Node {
	return o.do("broadcast div", func() (*G.Node, error) { return G.BroadcastHadamardDiv(a, b, nil, along) })
}

func (o *ops) apply(op G.Op, in ...*G.Node) *G.Node {
	return o.do(op.String(), func() (*G.Node, error) { return G.ApplyOp(op, in...) })
}

// affine is x W + b for x (n, in), W (in, out), b (out).
func (o *ops) affine(x, w, b *G.Node) *G.Node { return o.bcastAdd(o.matMul(x, w), b, 0) }

// layerNormEps keeps the normalisation finite for constant rows; GPT-2's value.
const layerNormEps = 1e-5

// layerNorm normalises each row of x (n, d) to zero mean and unit variance (the
// biased variance, as in GPT-2) and applies the learned per-feature gain and bias
// (d). Composed from gorgonia ops, so gorgonia derives its backward; the
// finite-difference test covers the composition.
func (o *ops) layerNorm(x, gain, bias *G.Node) *G.Node {
	centred := o.bcastSub(x, o.mean(x, 1), 1)
	variance := o.mean(o.square(centred), 1)
	normed := o.bcastMul(centred, o.invSqrt(o.shift(variance, layerNormEps)), 1)
	return o.bcastAdd(o.bcastMul(normed, gain, 0), bias, 0)
}

// gelu is the tanh approximation GPT-2 uses:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
func (o *ops) gelu(x *G.Node) *G.Node {
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

// setAt writes v at flat index i of a float32 or float64 tensor.
func setAt(t *tensor.Dense, i int, v float64) {
	switch d := t.Data().(type) {
	case []float32:
		d[i] = float32(v)
	case []float64:
		d[i] = v
	}
}

// causalAttention is multi-head causal self-attention without its projections:
// q, k, v are (batch*context, width) with each row a token and head h owning
// columns [h*dh, (h+1)*dh); the result has the same layout, ready for the
// output projection.
func (o *ops) causalAttention(q, k, v *G.Node, batch, context, heads int) *G.Node {
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
