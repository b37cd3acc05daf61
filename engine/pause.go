package engine

import (
	"errors"
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// errPaused is what the pause op returns while its gate is closed: the tape machine
// stops with its program counter on the pause instruction, between the forward
// instructions (already run) and the backward ones.
var errPaused = errors.New("stage program paused between forward and backward")

// gate is shared by every tape machine of one engine. The runtime executes one action
// at a time, so a single slot suffices: it is filled just before a machine resumes.
type gate struct {
	open  bool
	grad  G.Value // upstream gradient handed to the resuming machine
	taken bool    // set when the pause op hands grad over
	hit   bool    // set when the pause op refused, i.e. the machine paused
}

// pauseOp sits where the upstream gradient enters the backward pass. Its input is the
// stage output (so it runs after the whole forward), and its value is the gradient
// placed in the gate. It is not differentiable: it is the gradient.
type pauseOp struct {
	g *gate
}

func newPause(g *gate) *pauseOp { return &pauseOp{g: g} }

func (op *pauseOp) Arity() int { return 1 }
func (op *pauseOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op *pauseOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("pause: input shape %v is not a tensor.Shape", in[0])
	}
	return s.Clone(), nil
}
func (op *pauseOp) Do(in ...G.Value) (G.Value, error) {
	if !op.g.open {
		op.g.hit = true
		return nil, errPaused
	}
	if op.g.grad == nil {
		return nil, errors.New("pause: gate opened without a gradient")
	}
	if !op.g.grad.Shape().Eq(in[0].Shape()) {
		return nil, fmt.Errorf("pause: gradient shape %v does not match output shape %v", op.g.grad.Shape(), in[0].Shape())
	}
	op.g.taken = true
	return op.g.grad, nil
}
func (op *pauseOp) ReturnsPtr() bool     { return true }
func (op *pauseOp) CallsExtern() bool    { return false }
func (op *pauseOp) OverwritesInput() int { return -1 }
func (op *pauseOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "pipetrain.pause(%p)", op.g)
}
func (op *pauseOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
func (op *pauseOp) String() string { return "pipetrain.pause" }

// DiffWRT and SymDiff make the op acceptable to Backpropagate as the given
// gradient of the output; without them the graph is reported unreachable.
func (op *pauseOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }
func (op *pauseOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return make(G.Nodes, len(inputs)), nil
}
