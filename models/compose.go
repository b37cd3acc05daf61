package models

import (
	"fmt"

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
func (o *ops) affine(x, w, b *G.Node) *G.Node { return o.biasAdd(o.matMul(x, w), b) }

// layerNormEps keeps the normalisation finite for constant rows; GPT-2's value.
const layerNormEps = 1e-5

// setAt writes v at flat index i of a float32 or float64 tensor.
func setAt(t *tensor.Dense, i int, v float64) {
	switch d := t.Data().(type) {
	case []float32:
		d[i] = float32(v)
	case []float64:
		d[i] = v
	}
}
