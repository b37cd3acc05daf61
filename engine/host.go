package engine

import (
	"fmt"
	"slices"

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
func (e *Engine) LoadWeights(ws []Weight) error {
	if len(ws) != len(e.params) {
		return fmt.Errorf("%d weights for a stage of %d", len(ws), len(e.params))
	}
	for i, p := range e.params {
		dst, w := p.Value().(*tensor.Dense), ws[i]
		if w.Name != p.Name() || !slices.Equal(w.Value.Shape(), dst.Shape()) || w.Value.Dtype() != dst.Dtype() {
			return fmt.Errorf("weight %d: %s %v %v for %s %v %v", i, w.Name, w.Value.Shape(), w.Value.Dtype(), p.Name(), dst.Shape(), dst.Dtype())
		}
		switch d := dst.Data().(type) {
		case []float32:
			copy(d, w.Value.Data().([]float32))
		case []float64:
			copy(d, w.Value.Data().([]float64))
		default:
			return fmt.Errorf("weight %s: dtype %v", w.Name, dst.Dtype())
		}
	}
	return nil
}
