package stages

import (
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/data"
)

// feed supplies the ends of the pipeline from the dataset's source: the first
// stage's inputs and the last stage's targets, for training steps and
// evaluation passes. Both ends derive the same batch from (seed, step) alone,
// so targets never cross the wire.
type feed struct{ src data.Source }

// openFeed asks the registry for the source of the config's dataset: a stage
// holding the model's first stage loads its inputs, one holding its last the
// targets; data handed in by Options is used as it is.
func (r *Runtime) openFeed(o Options, model *data.Model) (feed, error) {
	src, err := data.Open(r.cfg.DataSection(), model, data.OpenOptions{
		Inputs: r.holdsFirst(), Targets: r.holdsLoss(),
		Train: o.Train, Test: o.Test, Text: o.Text,
	})
	return feed{src}, err
}

// inputs is x's buffer for the source; empty when x is nil.
func inputs(x *tensor.Dense) data.Inputs {
	if x == nil {
		return data.Inputs{}
	}
	switch d := x.Data().(type) {
	case []float32:
		return data.Inputs{F32: d}
	case []float64:
		return data.Inputs{F64: d}
	}
	return data.Inputs{}
}

// train fills x (first stage; nil elsewhere) with micro-batch mb of step and
// returns its targets (last stage; nil elsewhere).
func (f feed) train(step, mb int, x *tensor.Dense, wantTargets bool) []int {
	return f.src.Train(step, mb, inputs(x), wantTargets)
}

// evalBatches is the number of micro-batches in one evaluation pass.
func (f feed) evalBatches() int { return f.src.EvalBatches() }

// eval fills x with evaluation micro-batch k and returns its targets and how
// many of its rows are real (the rest padding).
func (f feed) eval(k int, x *tensor.Dense, wantTargets bool) ([]int, int) {
	return f.src.Eval(k, inputs(x), wantTargets)
}

// name says what an evaluation reports on, for logs.
func (f feed) name() string { return f.src.EvalName() }
