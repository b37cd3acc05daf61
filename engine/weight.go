package engine

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// weightProgram computes a stage's weight gradients from each part's input and
// the gradient of its tap. It is built from the layers' parts alone
// (models.Splittable), differentiated by gorgonia, and compiled with only the
// weight gradients as outputs, so the parts' forward (an ancestor of nothing
// it returns) is never run.
type weightProgram struct {
	g      *G.ExprGraph
	leaves []*G.Node // the parts' distinct inputs, then their taps' gradients: Let from a flight's stash
	// stashAt is the index in a flight's stash of each leaf's value.
	stashAt []int
	// first is the first of the engine's params whose sums are complete
	// once this program and the ones after it in the engine's list have run
	// (compute.GradientWatcher).
	first int
	// grads are the gradients gorgonia computes, of params[of[i]]; the
	// products' weights are summed by accumulations instead.
	grads []*G.Node
	of    []int
	taps  []*G.Node // the parts' outputs: differentiated, never computed
	vm    G.VM
	// rearm ends a run: the engine's, which keeps the registers between
	// runs unless a layer needs fresh ones, so a W pass allocates no more
	// than the fused backward it replaces.
	rearm func(G.VM)
}

// newWeightProgram rebuilds parts, whose inputs are ins, in a graph of their
// own. params are the stage's: each part gets its own nodes for its share,
// holding the same tensors, so the program sees every optimizer step. sums
// are the summed gradients; the weights marked linear are products'
// (linearWeight), summed into by the program itself.
func newWeightProgram(ins []*G.Node, all []part, sel []int, params []*G.Node, sums []*tensor.Dense, linear []bool) (*weightProgram, error) {
	w := &weightProgram{g: G.NewGraph()}
	parts := make([]part, len(sel))
	for i, k := range sel {
		parts[i] = all[k]
	}
	xs := make([]*G.Node, len(ins))
	for _, p := range parts {
		if xs[p.in] == nil {
			in := ins[p.in]
			xs[p.in] = G.NewTensor(w.g, in.Dtype(), in.Dims(), G.WithShape(in.Shape()...), G.WithName(fmt.Sprintf("%s.part%d.input", p.layer.Name(), p.index)))
		}
	}
	copies := make([]*G.Node, len(params))
	var gradLeaves, accs []*G.Node
	var costs, costGrads, wrt []*G.Node // the parts gorgonia differentiates
	for _, p := range parts {
		ps := make([]*G.Node, len(p.params))
		for i, k := range p.params {
			q := params[k]
			copies[k] = G.NewTensor(w.g, q.Dtype(), q.Dims(), G.WithShape(q.Shape()...), G.WithName(q.Name()), G.WithValue(q.Value()))
			ps[i] = copies[k]
		}
		tap, err := p.layer.BuildPart(w.g, p.index, xs[p.in], ps)
		if err != nil {
			return nil, err
		}
		if !tap.Shape().Eq(p.tap.Shape()) {
			return nil, fmt.Errorf("layer %s: part %d rebuilt has shape %v, built %v", p.layer.Name(), p.index, tap.Shape(), p.tap.Shape())
		}
		gt := G.NewTensor(w.g, tap.Dtype(), tap.Dims(), G.WithShape(tap.Shape()...), G.WithName(fmt.Sprintf("%s.part%d.tap_grad", p.layer.Name(), p.index)))
		w.taps, gradLeaves = append(w.taps, tap), append(gradLeaves, gt)
		differentiated := false
		for i, k := range p.params {
			if !linear[k] {
				wrt, w.of, differentiated = append(wrt, copies[k]), append(w.of, k), true
				continue
			}
			lw := linearWeight{param: k, transposed: p.transposed}
			if p.linear != i {
				return nil, fmt.Errorf("layer %s: part %d: %s is summed as a product's weight, and is not the part's", p.layer.Name(), p.index, copies[k].Name())
			}
			acc, err := lw.accumulate(xs[p.in], gt, sums[k])
			if err != nil {
				return nil, fmt.Errorf("summing the gradient of %s: %w", copies[k].Name(), err)
			}
			accs = append(accs, acc)
		}
		if differentiated {
			costs, costGrads = append(costs, tap), append(costGrads, gt)
		}
	}
	for i, x := range xs {
		if x != nil {
			w.leaves, w.stashAt = append(w.leaves, x), append(w.stashAt, i)
		}
	}
	for i, gl := range gradLeaves {
		w.leaves, w.stashAt = append(w.leaves, gl), append(w.stashAt, len(ins)+sel[i])
	}
	if len(wrt) > 0 {
		grads, err := G.Backpropagate(costs, costGrads, wrt)
		if err != nil {
			return nil, fmt.Errorf("differentiating the weight gradients: %w", err)
		}
		w.grads = grads
	}
	prog, locMap, err := G.CompileFunction(w.g, w.leaves, append(append(G.Nodes{}, w.grads...), accs...))
	if err != nil {
		return nil, fmt.Errorf("compiling the weight gradients: %w", err)
	}
	w.vm = G.NewTapeMachine(w.g, G.WithPrecompiled(prog, locMap), G.WithEngine(fast))
	return w, nil
}

// run computes one micro-batch's weight gradients and adds them to sums.
func (w *weightProgram) run(stash []G.Value, sums []*tensor.Dense) error {
	for i, leaf := range w.leaves {
		v := stash[w.stashAt[i]]
		if v == nil {
			return fmt.Errorf("weight gradient: %s was not kept from the input gradient", leaf.Name())
		}
		if err := G.Let(leaf, v); err != nil {
			return fmt.Errorf("weight gradient: %s: %w", leaf.Name(), err)
		}
	}
	defer w.rearm(w.vm)
	if err := w.vm.RunAll(); err != nil {
		return fmt.Errorf("weight gradient: %w", err)
	}
	for i, g := range w.grads {
		if _, err := tensor.Add(sums[w.of[i]], g.Value().(tensor.Tensor), tensor.UseUnsafe()); err != nil {
			return fmt.Errorf("adding the gradient of %s: %w", g.Name(), err)
		}
	}
	return nil
}

// newWeightPrograms builds one weight program per layer, in the layers'
// order: Weight runs them last layer first and reports after each which
// weights' sums it has completed, so the replicas' all-reduce can start on
// a layer's gradients while the earlier layers' are computed. Each weight
// is one part's, each part one layer's, so every gradient is computed and
// summed by the same operations as in one program of all the parts.
func newWeightPrograms(ins []*G.Node, parts []part, params []*G.Node, sums []*tensor.Dense, linear []bool) ([]*weightProgram, error) {
	var groups [][]int
	for i, p := range parts {
		if i == 0 || p.layer != parts[i-1].layer {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], i)
	}
	covered := make([]bool, len(params))
	first := len(params)
	out := make([]*weightProgram, len(groups))
	for g := len(groups) - 1; g >= 0; g-- {
		w, err := newWeightProgram(ins, parts, groups[g], params, sums, linear)
		if err != nil {
			return nil, err
		}
		for _, k := range groups[g] {
			for _, q := range parts[k].params {
				covered[q] = true
			}
		}
		for first > 0 && covered[first-1] {
			first--
		}
		w.first, out[g] = first, w
	}
	return out, nil
}
