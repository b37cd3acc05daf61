package models

import (
	"fmt"
	"strconv"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Dropout, and the random numbers it draws.
//
// A training run's masks must not depend on where they are computed: the
// pipelined run has to equal the one-process reference bit for bit, and a
// micro-batch's recomputation and its split backward (input gradient,
// then weight gradients, much later) must see the mask its forward saw.
// So a mask is a pure function of its key, drawn counter-based, never from
// a generator's running state: element i of the micro-batch's activation
// (row-major, the batch first) at dropout entry L is kept iff
//
//	s  = mix(seed); s = mix(s ^ step); s = mix(s ^ microBatch)
//	s  = mix(s ^ L[0]); s = mix(s ^ L[1]) ...   (L: the entry's module path)
//	u  = mix(s + i·γ)                            (SplitMix64's (i+1)th number from s)
//	keep iff u>>11 >= ⌊p·2⁵³⌋
//
// with mix SplitMix64's step (add γ = 0x9e3779b97f4a7c15, then its
// finaliser), seed the model's (train.seed), step the training step
// counted from 0, microBatch the micro-batch's index in the step's global
// batch as the one-process reference numbers it (replica r's micro-batch j is
// r·micro_batches + j) and L the entry's index in the nn.Sequential, with
// the index inside a residual group after it ([9, 1] for module 9.1). A
// kept element is scaled by 1/(1-p) (inverted dropout), so evaluation,
// which draws nothing, needs no scaling. The backward draws the same mask
// again from the same key instead of keeping it.

// DrawKey says which run a graph computes, for the ops that draw random
// numbers: training step Step's micro-batch MicroBatch (its index in the
// step's global batch, as the reference numbers it), or, when Train is
// false, a run that draws nothing (evaluation, measurement).
type DrawKey struct {
	Train            bool
	Step, MicroBatch int
}

// Drawer is where one layer's ops draw from: the run's key, read when the
// ops run, the model's seed and the layer's own stream, its module path.
type Drawer struct {
	Key   *DrawKey
	Seed  uint64
	Layer []int
}

// golden is SplitMix64's increment γ, 2⁶⁴ over the golden ratio.
const golden = 0x9e3779b97f4a7c15

// mix is one step of SplitMix64: the state advanced by γ, then finalised.
func mix(z uint64) uint64 {
	z += golden
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// state is the SplitMix64 state of the layer's draws under key k.
func (d Drawer) state(k DrawKey) uint64 {
	s := mix(d.Seed)
	s = mix(s ^ uint64(k.Step))
	s = mix(s ^ uint64(k.MicroBatch))
	for _, l := range d.Layer {
		s = mix(s ^ uint64(l))
	}
	return s
}

// dropThreshold is ⌊p·2⁵³⌋: an element is kept when the top 53 bits of its
// number reach it, with probability 1 - p to within 2⁻⁵³.
func dropThreshold(p float64) uint64 { return uint64(p * (1 << 53)) }

// Mask is which of the n elements of the activation the layer keeps under
// key k with drop probability p: what the dropout ops compute, for tests
// and for anyone reproducing a run elsewhere.
func (d Drawer) Mask(k DrawKey, p float64, n int) []bool {
	s, t := d.state(k), dropThreshold(p)
	out := make([]bool, n)
	for i := range out {
		out[i] = mix(s+uint64(i)*golden)>>11 >= t
	}
	return out
}

// dropout writes x masked and scaled into out under the key d reads now;
// out = x when the run draws nothing. It is the forward (x the input) and
// the backward (x the output gradient: the same mask, the same scale).
func dropout[T float32 | float64](d Drawer, p float64, out, x []T) {
	k := d.Key
	if k == nil || !k.Train || p == 0 {
		copy(out, x)
		return
	}
	s, t := d.state(*k), dropThreshold(p)
	// 1/(1-p) in the tensor's dtype: PyTorch's dropout divides its mask by
	// 1-p in the input's.
	scale := T(1) / T(1-p)
	for i, v := range x {
		if mix(s+uint64(i)*golden)>>11 >= t {
			out[i] = v * scale
		} else {
			out[i] = 0
		}
	}
}

// layerName writes a module path as PyTorch names the module, "9.1".
func modulePath(l []int) string {
	parts := make([]string, len(l))
	for i, v := range l {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ".")
}

// dropout adds inverted dropout with probability p over x, of any shape,
// drawing from d. The name carries the layer, so that two dropouts of one
// input are two ops (gorgonia merges ops of equal hash and inputs).
func (o *ops) dropout(x *G.Node, p float64, d Drawer) *G.Node {
	dims := x.Dims()
	return o.fused(dropoutOp[float32](p, d, dims, false), dropoutOp[float64](p, d, dims, false), x)
}

// dropoutOp is dropout's forward, or (grad) its backward, dx = mask·dy/(1-p)
// with the mask drawn again from the key of the micro-batch the engine
// resumed: the same kernel on the output gradient.
func dropoutOp[T float32 | float64](p float64, d Drawer, dims int, grad bool) *fusedOp[T] {
	name := "Dropout"
	if grad {
		name = "DropoutGrad"
	}
	op := &fusedOp[T]{name: fmt.Sprintf("%s{p %v, layer %s}", name, p, modulePath(d.Layer)), inDims: []int{dims}, outDims: dims, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) { dropout(d, p, out, in[0]) },
	}
	if !grad {
		op.grad = func(o *ops, _ G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(dropoutOp[float32](p, d, dims, true), dropoutOp[float64](p, d, dims, true), grad)}
		}
	}
	return op
}

// SeqDrawing is a SeqLayer whose forward draws random numbers in training,
// as dropout does: the stack builds it with ForwardDrawing, which gets the
// draws' key, seed and stream, in place of Forward. Such a layer has no
// parameters (a zero-bubble schedule rebuilds the parameterised entries
// with Forward alone); Forward is its evaluation form.
type SeqDrawing interface {
	SeqLayer
	ForwardDrawing(g *G.ExprGraph, x *G.Node, d Drawer) (*G.Node, error)
}

// seqDropout is nn.Dropout(p): in training each element is zeroed with
// probability p and the rest scaled by 1/(1-p); in evaluation it is the
// identity.
type seqDropout struct{ p float64 }

// parseDropout reads p, PyTorch's default 0.5 when absent.
func parseDropout(e *SeqEntry) SeqLayer { return seqDropout{e.Fraction("p", 0.5)} }

func (seqDropout) OutShape(in []int) ([]int, error) { return in, nil }

func (seqDropout) Params([]int) []SeqParam { return nil }

// Forward is the evaluation form: x itself.
func (seqDropout) Forward(_ *G.ExprGraph, x *G.Node, _ []*G.Node) (*G.Node, error) { return x, nil }

func (l seqDropout) ForwardDrawing(_ *G.ExprGraph, x *G.Node, d Drawer) (*G.Node, error) {
	o := newOps(x.Dtype())
	y := o.dropout(x, l.p, d)
	return y, o.err
}

// DrawingLayer is a layer whose ops draw random numbers in training when
// DrawsInTraining says so (a sequential unit holding a dropout): the
// device computing it must be told each training forward's key.
type DrawingLayer interface {
	Layer
	DrawsInTraining() bool
}

// DrawsInTraining reports whether any of layers [first, last) draws random
// numbers in training.
func (m *Model) DrawsInTraining(first, last int) bool {
	for _, l := range m.Layers[first:last] {
		if d, ok := l.(DrawingLayer); ok && d.DrawsInTraining() {
			return true
		}
	}
	return false
}

// DrawsInTraining: some entry of the unit, or of a residual group in it, is
// a SeqDrawing.
func (u *seqUnit) DrawsInTraining() bool {
	var draws func(ns []seqNode) bool
	draws = func(ns []seqNode) bool {
		for _, n := range ns {
			if _, ok := n.layer.(SeqDrawing); ok || n.layer == nil && draws(n.body) {
				return true
			}
		}
		return false
	}
	return draws(u.nodes)
}
