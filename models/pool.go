package models

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Max pooling over 2x2 windows with stride 2 on NCHW tensors, as a pair of
// stateless ops.
//
// gorgonia's MaxPool2D records the argmax of each window in a mask held by the
// op itself and its gradient reads that mask, so the gradient is only right if
// no other run of the same program has executed the forward since. An engine
// keeps several tape machines of one compiled program in flight (the forward
// of micro-batch 1 runs before the backward of micro-batch 0), so here the
// gradient op recomputes the argmax from the pooled input instead: both ops
// are pure functions of their inputs.
//
// An odd last row or column is dropped, as by MaxPool2D with kernel 2, no
// padding and stride 2: (B, C, H, W) -> (B, C, H/2, W/2). Within a window the
// first maximum in row-major order wins (top-left, top-right, bottom-left,
// bottom-right), and a NaN counts as larger than any number, so it reaches the
// output. The gradient of an output goes to its winning input alone; inputs
// that win no window, or lie in a dropped row or column, get zero.

// maxPool2x2 applies the 2x2, stride-2 max pool to a rank-4 (B, C, H, W) node.
func maxPool2x2(x *G.Node) (*G.Node, error) { return G.ApplyOp(maxPool2x2Op{}, x) }

// pooledShape is the output shape for an input shape, or an error if the input
// is not (B, C, H, W) with H and W at least 2.
func pooledShape(what string, in G.DimSizer) (tensor.Shape, error) {
	s, ok := in.(tensor.Shape)
	if !ok || s.Dims() != 4 {
		return nil, fmt.Errorf("%s: input must be (batch, channels, height, width), got %v", what, in)
	}
	if s[2] < 2 || s[3] < 2 {
		return nil, fmt.Errorf("%s: a %dx%d image is too small for a 2x2 window", what, s[2], s[3])
	}
	return tensor.Shape{s[0], s[1], s[2] / 2, s[3] / 2}, nil
}

// denseInput returns v as a dense tensor whose Data() is laid out in row-major
// order of its shape, copying a view if needed.
func denseInput(what string, v G.Value) (*tensor.Dense, error) {
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%s: input is %T, want a dense tensor", what, v)
	}
	if d.IsMaterializable() {
		d = d.Materialize().(*tensor.Dense)
	}
	return d, nil
}

// maxPool2x2Op is the forward pass.
type maxPool2x2Op struct{}

func (op maxPool2x2Op) Arity() int { return 1 }

func (op maxPool2x2Op) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := G.TensorType{Dims: 4, Of: a}
	return hm.NewFnType(t, t)
}

func (op maxPool2x2Op) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return pooledShape("max pool", in[0])
}

func (op maxPool2x2Op) Do(in ...G.Value) (G.Value, error) {
	x, err := denseInput("max pool", in[0])
	if err != nil {
		return nil, err
	}
	s := x.Shape()
	outShape, err := pooledShape("max pool", s)
	if err != nil {
		return nil, err
	}
	out := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(outShape...))
	switch d := x.Data().(type) {
	case []float32:
		poolForward(d, out.Data().([]float32), s[2], s[3])
	case []float64:
		poolForward(d, out.Data().([]float64), s[2], s[3])
	default:
		return nil, fmt.Errorf("max pool: dtype %v, want float32 or float64", x.Dtype())
	}
	return out, nil
}

func (op maxPool2x2Op) ReturnsPtr() bool      { return false }
func (op maxPool2x2Op) CallsExtern() bool     { return false }
func (op maxPool2x2Op) OverwritesInput() int  { return -1 }
func (op maxPool2x2Op) WriteHash(h hash.Hash) { fmt.Fprint(h, "pipetrain.maxpool2x2") }
func (op maxPool2x2Op) Hashcode() uint32      { return hashOf(op) }
func (op maxPool2x2Op) String() string        { return "MaxPool2x2" }

func (op maxPool2x2Op) DiffWRT(inputs int) []bool { return []bool{true} }

// SymDiff routes the output gradient back through the argmax of x, recomputed
// by the gradient op from x itself.
func (op maxPool2x2Op) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("max pool: %d inputs, want 1", len(inputs))
	}
	dx, err := G.ApplyOp(maxPool2x2GradOp{}, inputs[0], grad)
	if err != nil {
		return nil, err
	}
	return G.Nodes{dx}, nil
}

// maxPool2x2GradOp maps (x, dy) to dx, where dy is the gradient of the pooled
// output, shaped (B, C, H/2, W/2), and dx has x's shape.
type maxPool2x2GradOp struct{}

func (op maxPool2x2GradOp) Arity() int { return 2 }

func (op maxPool2x2GradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := G.TensorType{Dims: 4, Of: a}
	return hm.NewFnType(t, t, t)
}

func (op maxPool2x2GradOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if err := checkPoolGrad(in[0], in[1]); err != nil {
		return nil, err
	}
	return in[0].(tensor.Shape).Clone(), nil
}

// checkPoolGrad requires dy to have the pooled shape of x.
func checkPoolGrad(x, dy G.DimSizer) error {
	want, err := pooledShape("max pool gradient", x)
	if err != nil {
		return err
	}
	if s, ok := dy.(tensor.Shape); !ok || !s.Eq(want) {
		return fmt.Errorf("max pool gradient: output gradient shape %v, want %v for input %v", dy, want, x)
	}
	return nil
}

func (op maxPool2x2GradOp) Do(in ...G.Value) (G.Value, error) {
	x, err := denseInput("max pool gradient", in[0])
	if err != nil {
		return nil, err
	}
	dy, err := denseInput("max pool gradient", in[1])
	if err != nil {
		return nil, err
	}
	s := x.Shape()
	if err := checkPoolGrad(s, dy.Shape()); err != nil {
		return nil, err
	}
	if x.Dtype() != dy.Dtype() {
		return nil, fmt.Errorf("max pool gradient: input of dtype %v, output gradient of dtype %v", x.Dtype(), dy.Dtype())
	}
	dx := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(s.Clone()...))
	switch d := x.Data().(type) {
	case []float32:
		poolBackward(d, dy.Data().([]float32), dx.Data().([]float32), s[2], s[3])
	case []float64:
		poolBackward(d, dy.Data().([]float64), dx.Data().([]float64), s[2], s[3])
	default:
		return nil, fmt.Errorf("max pool gradient: dtype %v, want float32 or float64", x.Dtype())
	}
	return dx, nil
}

func (op maxPool2x2GradOp) ReturnsPtr() bool      { return false }
func (op maxPool2x2GradOp) CallsExtern() bool     { return false }
func (op maxPool2x2GradOp) OverwritesInput() int  { return -1 }
func (op maxPool2x2GradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "pipetrain.maxpool2x2grad") }
func (op maxPool2x2GradOp) Hashcode() uint32      { return hashOf(op) }
func (op maxPool2x2GradOp) String() string        { return "MaxPool2x2Grad" }

// windowArgmax is the index in x of the winner of the 2x2 window whose
// top-left element is x[i], in an image of row length w.
func windowArgmax[T float32 | float64](x []T, i, w int) int {
	best := i
	for _, j := range [3]int{i + 1, i + w, i + w + 1} {
		if v, m := x[j], x[best]; v > m || (v != v && m == m) {
			best = j
		}
	}
	return best
}

// poolForward pools x, planes of h x w, into y, planes of (h/2) x (w/2).
func poolForward[T float32 | float64](x, y []T, h, w int) {
	oh, ow := h/2, w/2
	o := 0
	for p := 0; p < len(x); p += h * w {
		for r := 0; r < oh; r++ {
			row := p + 2*r*w
			for c := 0; c < ow; c++ {
				y[o] = x[windowArgmax(x, row+2*c, w)]
				o++
			}
		}
	}
}

// poolBackward writes into dx (zeroed, x's shape) the gradient dy of each
// pooled output at the argmax of its window in x.
func poolBackward[T float32 | float64](x, dy, dx []T, h, w int) {
	oh, ow := h/2, w/2
	o := 0
	for p := 0; p < len(x); p += h * w {
		for r := 0; r < oh; r++ {
			row := p + 2*r*w
			for c := 0; c < ow; c++ {
				// Windows do not overlap, so this adds to a zero; adding rather
				// than assigning makes a -0 gradient +0, as in gorgonia's op.
				dx[windowArgmax(x, row+2*c, w)] += dy[o]
				o++
			}
		}
	}
}
