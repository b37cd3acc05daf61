package models

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// The ops here have no gradient on purpose: they compute values that the
// backward pass treats as constants. They hold no per-run state, since an
// engine keeps several tape machines of one graph in flight at once.

// oneHotOp turns token ids (batch, context), stored as floats of the model's
// dtype, into a one-hot matrix (batch*context, vocab), row b*context+t for token
// t of sequence b. A matmul with the embedding table then is the lookup, and
// gorgonia derives the table's gradient from the matmul. The ids themselves are
// data: they get no gradient.
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

// hashOf is the FNV hash of an op's WriteHash, which gorgonia uses to merge
// identical nodes.
func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
