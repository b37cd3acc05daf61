package engine

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// A weight W whose part computes Tap = In·W (or In·Wᵀ) has the gradient
// Inᵀ·∂Tap (or its transpose), one product over the micro-batch's rows.
// gorgonia computes each micro-batch's product into a register of its own
// and then adds it into the summed gradient: a second pass over W, and,
// since BLAS zeroes a product's output before summing into it, a third.
// accumulateOp instead asks BLAS for Sum += Inᵀ·∂Tap (beta = 1): one pass.
// The kernel adds its product to what Sum held exactly as the separate add
// did, so the bits are the same wherever the product is not cut along the
// rows (K within OpenBLAS's blocking); pipelined runs and the reference
// compute every such gradient the same way, so they agree bit for bit in
// any case.
//
// The passes saved are worth a product over few rows: for a 1024x1024
// weight and 32 rows, timed inside a training run, the weight gradient
// took 1.26 ms with gorgonia's product and add and takes 0.85 ms here.
// Over many rows
// they are a small share, and there OpenBLAS's beta = 1 products measured
// slower than its beta = 0 ones (a GPT of 512-row micro-batches ran 3%
// slower), so products over more than accumulateRows rows stay gorgonia's.
const accumulateRows = 256

// linearWeight is a part whose tap is a product with one of the engine's
// parameters (models.LinearWeights).
type linearWeight struct {
	param      int // the weight's index in the engine's params
	in, tap    *G.Node
	transposed bool // Tap = In·Wᵀ
}

// linearWeightsOf lists b's parts that are products with a weight, their
// weights numbered from params in the engine's list. A part whose shapes
// are not a plain product of matrices, or that has more than
// accumulateRows rows, is left to gorgonia.
func linearWeightsOf(l models.Layer, b models.Built, params int) []linearWeight {
	lw, ok := l.(models.LinearWeights)
	if !ok {
		return nil
	}
	var out []linearWeight
	for i, bp := range b.Parts {
		k, transposed, ok := lw.LinearWeight(i)
		if !ok || k < 0 || k >= len(bp.Params) {
			continue
		}
		w := bp.Params[k]
		at := -1
		for j, p := range b.Params {
			if p == w {
				at = j
			}
		}
		in, tap, ws := bp.In.Shape(), bp.Tap.Shape(), w.Shape()
		if at < 0 || in.Dims() != 2 || tap.Dims() != 2 || ws.Dims() != 2 || in[0] != tap[0] || in[0] > accumulateRows {
			continue
		}
		rows, cols := ws[0], ws[1]
		if transposed {
			rows, cols = cols, rows
		}
		if rows != in[1] || cols != tap[1] {
			continue
		}
		out = append(out, linearWeight{param: params + at, in: bp.In, tap: bp.Tap, transposed: transposed})
	}
	return out
}

// accumulate adds the node that sums In·∂Tap's product into sum.
func (lw linearWeight) accumulate(in, tapGrad *G.Node, sum *tensor.Dense) (*G.Node, error) {
	op := &accumulateOp{sum: sum, transposed: lw.transposed, done: zeroScalar(sum.Dtype())}
	return G.ApplyOp(op, in, tapGrad)
}

// accumulateOp computes sum += inᵀ·g (or, transposed, sum += gᵀ·in) for
// in (rows, a) and g (rows, b). Its result is a scalar of no meaning that
// it owns: the machine's register must never hold the sum, or a later
// run's instruction sharing the register could write into it.
type accumulateOp struct {
	sum        *tensor.Dense
	transposed bool
	done       G.Value
}

func zeroScalar(dt tensor.Dtype) G.Value {
	if dt == tensor.Float64 {
		return G.NewF64(0)
	}
	return G.NewF32(0)
}

func (op *accumulateOp) Arity() int { return 2 }

func (op *accumulateOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(G.TensorType{Dims: 2, Of: a}, G.TensorType{Dims: 2, Of: a}, a)
}

func (op *accumulateOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%v: %d inputs, want 2", op, len(in))
	}
	return tensor.ScalarShape(), nil
}

func (op *accumulateOp) Do(in ...G.Value) (G.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%v: %d inputs, want 2", op, len(in))
	}
	x, okX := in[0].(*tensor.Dense)
	g, okG := in[1].(*tensor.Dense)
	if !okX || !okG {
		return nil, fmt.Errorf("%v: inputs %T and %T, want dense tensors", op, in[0], in[1])
	}
	xs, gs, ss := x.Shape(), g.Shape(), op.sum.Shape()
	a, b := xs[1], gs[1]
	if op.transposed {
		a, b = b, a
	}
	if xs.Dims() != 2 || gs.Dims() != 2 || xs[0] != gs[0] || ss[0] != a || ss[1] != b {
		return nil, fmt.Errorf("%v: inputs %v and %v do not make the sum's %v", op, xs, gs, ss)
	}
	left, right := x, g
	if op.transposed {
		left, right = g, x
	}
	rows, m, n := xs[0], ss[0], ss[1]
	switch s := op.sum.Data().(type) {
	case []float32:
		l, r := left.Data().([]float32), right.Data().([]float32)
		G.WhichBLAS().Sgemm(blas.Trans, blas.NoTrans, m, n, rows, 1, l, m, r, n, 1, s, n)
	case []float64:
		l, r := left.Data().([]float64), right.Data().([]float64)
		G.WhichBLAS().Dgemm(blas.Trans, blas.NoTrans, m, n, rows, 1, l, m, r, n, 1, s, n)
	default:
		return nil, fmt.Errorf("%v: a sum of %v", op, op.sum.Dtype())
	}
	return op.done, nil
}

func (op *accumulateOp) ReturnsPtr() bool     { return false }
func (op *accumulateOp) CallsExtern() bool    { return false }
func (op *accumulateOp) OverwritesInput() int { return -1 }

// WriteHash names the sum: gorgonia merges nodes of equal hashes, and two
// weights' accumulations must stay apart.
func (op *accumulateOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "pipetrain.Accumulate(%p,%t)", op.sum, op.transposed)
}

func (op *accumulateOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func (op *accumulateOp) String() string { return "Accumulate" }
