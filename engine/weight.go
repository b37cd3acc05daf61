package engine

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// weightProgram computes a stage's weight gradients from each layer's input and the
// gradient of its tap. It is built from the layers' Affine parts, differentiated by
// gorgonia, and compiled with only the weight gradients as outputs, so the affine
// forward itself (an ancestor of nothing it returns) is never run.
type weightProgram struct {
	g      *G.ExprGraph
	leaves []*G.Node // layer inputs, then tap gradients: Let from a flight's stash
	grads  []*G.Node // one per parameter, in the stage's params order
	taps   []*G.Node // the affine outputs: differentiated, never computed
	vm     G.VM
	// rearm ends a run: the engine's, which keeps the registers between
	// runs unless a layer needs fresh ones, so a W pass allocates no more
	// than the fused backward it replaces.
	rearm func(G.VM)
}

// counts[i] is how many of params layer first+i owns (they are contiguous).
func newWeightProgram(m *models.Model, first, last int, inputs, taps, params []*G.Node, counts []int) (*weightProgram, error) {
	w := &weightProgram{g: G.NewGraph()}
	var gradLeaves, newTaps, newParams []*G.Node
	pi := 0
	for i, l := range m.Layers[first:last] {
		in := inputs[i]
		x := G.NewTensor(w.g, in.Dtype(), in.Dims(), G.WithShape(in.Shape()...), G.WithName(fmt.Sprintf("%s.input", l.Name())))
		gt := G.NewTensor(w.g, taps[i].Dtype(), taps[i].Dims(), G.WithShape(taps[i].Shape()...), G.WithName(fmt.Sprintf("%s.tap_grad", l.Name())))
		n := counts[i]
		var ps []*G.Node
		for _, p := range params[pi : pi+n] {
			ps = append(ps, G.NewTensor(w.g, p.Dtype(), p.Dims(), G.WithShape(p.Shape()...), G.WithName(p.Name()), G.WithValue(p.Value())))
		}
		pi += n
		tap, err := l.(models.Splittable).Affine(w.g, x, ps)
		if err != nil {
			return nil, err
		}
		w.leaves = append(w.leaves, x)
		gradLeaves, newTaps, newParams = append(gradLeaves, gt), append(newTaps, tap), append(newParams, ps...)
	}
	w.leaves = append(w.leaves, gradLeaves...)
	grads, err := G.Backpropagate(newTaps, gradLeaves, newParams)
	if err != nil {
		return nil, fmt.Errorf("differentiating the weight gradients: %w", err)
	}
	w.grads, w.taps = grads, newTaps
	prog, locMap, err := G.CompileFunction(w.g, w.leaves, grads)
	if err != nil {
		return nil, fmt.Errorf("compiling the weight gradients: %w", err)
	}
	w.vm = G.NewTapeMachine(w.g, G.WithPrecompiled(prog, locMap), G.WithEngine(fast))
	return w, nil
}

// run computes one micro-batch's weight gradients and adds them to sums.
func (w *weightProgram) run(stash []G.Value, sums []*tensor.Dense) error {
	for i, leaf := range w.leaves {
		if stash[i] == nil {
			return fmt.Errorf("weight gradient: %s was not kept from the input gradient", leaf.Name())
		}
		if err := G.Let(leaf, stash[i]); err != nil {
			return fmt.Errorf("weight gradient: %s: %w", leaf.Name(), err)
		}
	}
	defer w.rearm(w.vm)
	if err := w.vm.RunAll(); err != nil {
		return fmt.Errorf("weight gradient: %w", err)
	}
	for i, g := range w.grads {
		if _, err := tensor.Add(sums[i], g.Value().(tensor.Tensor), tensor.UseUnsafe()); err != nil {
			return fmt.Errorf("adding the gradient of %s: %w", g.Name(), err)
		}
	}
	return nil
}
