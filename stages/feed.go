package stages

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/models"
)

// feed supplies the ends of the pipeline: the first stage's inputs and the last
// stage's targets, for training steps and evaluation passes. Both ends derive the
// same batch from (seed, step) alone, so targets never cross the wire.
type feed interface {
	// train fills x (first stage; nil elsewhere) with micro-batch mb of step and
	// returns its targets (last stage; nil elsewhere).
	train(step, mb int, x *tensor.Dense, wantTargets bool) []int
	// evalBatches is the number of micro-batches in one evaluation pass.
	evalBatches() int
	// eval fills x with evaluation micro-batch k and returns its targets and
	// how many of its rows are real (the rest padding).
	eval(k int, x *tensor.Dense, wantTargets bool) (targets []int, rows int)
	// name says what an evaluation reports on, for logs.
	name() string
}

// imageFeed serves Fashion-MNIST style datasets: images in, one label each.
type imageFeed struct {
	trainSet, testSet *data.Dataset
	sampler           *data.Sampler
	batch             int // examples per micro-batch
	step              int
	idx               []int // the current step's example indices
}

// check refuses data the model cannot take, with the error the launcher's
// CheckData gives before any stage starts: a stage started on its own, or
// handed its data in Options, must not index past a one-hot row either.
func (f *imageFeed) check(c *configs.Config, model *models.Model) error {
	for _, ds := range []*data.Dataset{f.trainSet, f.testSet} {
		if ds == nil {
			continue
		}
		if err := c.CheckImages(ds, model); err != nil {
			return err
		}
	}
	return nil
}

func (f *imageFeed) rows(step, mb int) []int {
	if f.idx == nil || f.step != step {
		f.idx, f.step = f.sampler.Indices(step), step
	}
	return f.idx[mb*f.batch : (mb+1)*f.batch]
}

func (f *imageFeed) train(step, mb int, x *tensor.Dense, wantTargets bool) []int {
	rows := f.rows(step, mb)
	gather(f.trainSet, rows, x)
	if !wantTargets {
		return nil
	}
	y := make([]int, len(rows))
	data.GatherLabels(f.trainSet, rows, y)
	return y
}

func (f *imageFeed) evalBatches() int {
	if f.testSet == nil {
		return 0
	}
	return (f.testSet.N + f.batch - 1) / f.batch
}

func (f *imageFeed) eval(k int, x *tensor.Dense, wantTargets bool) ([]int, int) {
	var rows []int
	for i := k * f.batch; i < min(f.testSet.N, (k+1)*f.batch); i++ {
		rows = append(rows, i)
	}
	gather(f.testSet, rows, x)
	if !wantTargets {
		return nil, len(rows)
	}
	y := make([]int, f.batch) // padding rows are class 0 and not scored
	data.GatherLabels(f.testSet, rows, y[:len(rows)])
	return y, len(rows)
}

func (f *imageFeed) name() string { return "test" }

// gather copies rows of ds into x and zeroes the padding rows after them. x may be nil.
func gather(ds *data.Dataset, rows []int, x *tensor.Dense) {
	if x == nil {
		return
	}
	n := len(rows) * ds.Dim
	switch d := x.Data().(type) {
	case []float32:
		data.GatherImages(ds, rows, d[:n])
		clear(d[n:])
	case []float64:
		data.GatherImages(ds, rows, d[:n])
		clear(d[n:])
	}
}

// textFeed serves a tokenized corpus: windows of context tokens in, the next
// token of each position as targets.
type textFeed struct {
	text    *data.Text
	sampler *data.TextSampler
	val     [][]int // validation window starts, one micro-batch each
	batch   int
	context int
	step    int
	starts  []int
}

func newTextFeed(c *configs.Config, text *data.Text, model *models.Model) (*textFeed, error) {
	// Text handed in by Options has not been through LoadText's check.
	if err := c.CheckVocab(text.Tokenizer, c.Data.Corpus); err != nil {
		return nil, err
	}
	context := model.Example[0]
	f := &textFeed{text: text, batch: c.MicroBatchSize(), context: context, step: -1}
	var err error
	if f.sampler, err = data.NewTextSampler(c.Train.Seed, len(text.Train), context, c.Data.BatchSize); err != nil {
		return nil, fmt.Errorf("%s: data: %w", c.Path, err)
	}
	if c.Train.Evaluate || c.Train.EvalEvery > 0 {
		if f.val, err = data.ValidationBatches(len(text.Val), context, f.batch); err != nil {
			return nil, fmt.Errorf("%s: data.val_fraction: %w", c.Path, err)
		}
	}
	return f, nil
}

func (f *textFeed) fill(tokens []int32, starts []int, x *tensor.Dense) []int {
	y := make([]int, len(starts)*f.context)
	switch {
	case x == nil:
		xs := make([]float32, len(y))
		data.GatherWindows(tokens, starts, f.context, xs, y)
	default:
		switch d := x.Data().(type) {
		case []float32:
			data.GatherWindows(tokens, starts, f.context, d, y)
		case []float64:
			data.GatherWindows(tokens, starts, f.context, d, y)
		}
	}
	return y
}

func (f *textFeed) train(step, mb int, x *tensor.Dense, wantTargets bool) []int {
	if f.step != step {
		f.starts, f.step = f.sampler.Starts(step), step
	}
	y := f.fill(f.text.Train, f.starts[mb*f.batch:(mb+1)*f.batch], x)
	if !wantTargets {
		return nil
	}
	return y
}

func (f *textFeed) evalBatches() int { return len(f.val) }

func (f *textFeed) eval(k int, x *tensor.Dense, wantTargets bool) ([]int, int) {
	y := f.fill(f.text.Val, f.val[k], x)
	if !wantTargets {
		return nil, len(y)
	}
	return y, len(y)
}

func (f *textFeed) name() string { return "validation" }
