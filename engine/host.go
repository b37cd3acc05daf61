package engine

import (
	"fmt"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Weight is one of a stage's weights in host memory, named as checkpoints
// and exports name it.
type Weight struct {
	Name  string
	Value *tensor.Dense
}

// Weights returns the stage's weights in Params' order. Their values are
// the engine's own memory, which its graph computes with: on the cpu no
// copy is needed.
func (e *Engine) Weights() []Weight {
	ws := make([]Weight, len(e.params))
	for i, p := range e.params {
		ws[i] = Weight{Name: p.Name(), Value: p.Value().(*tensor.Dense)}
	}
	return ws
}

// LoadWeights copies ws, in Weights' order, names and shapes, into the
// stage's weights. Copying a weight Weights returned onto itself changes
// nothing.
func (e *Engine) LoadWeights(ws []Weight) error { return copyWeights(e.Weights(), ws) }

// copyWeights copies src into dst, which must match it name by name, in
// shape and dtype.
func copyWeights(dst, src []Weight) error {
	if len(src) != len(dst) {
		return fmt.Errorf("%d weights for a stage of %d", len(src), len(dst))
	}
	for i, d := range dst {
		w := src[i]
		if w.Name != d.Name || !slices.Equal(w.Value.Shape(), d.Value.Shape()) || w.Value.Dtype() != d.Value.Dtype() {
			return fmt.Errorf("weight %d: %s %v %v for %s %v %v", i, w.Name, w.Value.Shape(), w.Value.Dtype(), d.Name, d.Value.Shape(), d.Value.Dtype())
		}
		switch dd := d.Value.Data().(type) {
		case []float32:
			copy(dd, w.Value.Data().([]float32))
		case []float64:
			copy(dd, w.Value.Data().([]float64))
		default:
			return fmt.Errorf("weight %s: dtype %v", w.Name, d.Value.Dtype())
		}
	}
	return nil
}

// Gradients returns the step's summed gradient of each weight so far, in
// Weights' order and names. Their values are the engine's own memory, which
// its backward passes add to and its optimizer step reads: a caller that
// changes them in place (an all-reduce, a tied weight's sum) changes the
// step's gradients, and LoadGradients of them copies nothing.
func (e *Engine) Gradients() ([]Weight, error) {
	out := make([]Weight, len(e.params))
	for i, p := range e.params {
		var v G.Value = e.grads[i]
		if e.grads[i] == nil {
			g, err := p.Grad()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.Name(), err)
			}
			v = g
		}
		d, ok := v.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("%s: gradient is a %T, not a dense tensor", p.Name(), v)
		}
		out[i] = Weight{Name: p.Name(), Value: d}
	}
	return out, nil
}

// LoadGradients copies gs, in Gradients' order, names and shapes, into the
// step's summed gradients: what a device computing elsewhere needs after
// its host copies were changed. Copying a gradient onto itself changes
// nothing.
func (e *Engine) LoadGradients(gs []Weight) error {
	own, err := e.Gradients()
	if err != nil {
		return err
	}
	return copyWeights(own, gs)
}
