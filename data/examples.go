package data

import (
	"errors"
	"fmt"
)

// split is one split of a classification dataset as a source reads it:
// examples of Dim features in, one label each. Fashion-MNIST's files and
// dataset arrays are arraySplits read in place; data handed in by
// OpenOptions a Dataset held in memory.
type split interface {
	// Len is the number of examples.
	Len() int
	// gather copies the features of examples rows into x's first rows and
	// zeroes the rest of x.
	gather(rows []int, x Inputs)
	// labels copies the labels of examples rows into y.
	labels(rows []int, y []int)
}

// datasetSplit is a Dataset held in memory, as reference runs and tests
// hand it in.
type datasetSplit struct{ *Dataset }

func (d datasetSplit) Len() int { return d.N }

func (d datasetSplit) gather(rows []int, x Inputs) { gather(d.Dataset, rows, x) }

func (d datasetSplit) labels(rows []int, y []int) { GatherLabels(d.Dataset, rows, y) }

// gather copies rows of ds into x and zeroes the padding rows after them.
func gather(ds *Dataset, rows []int, x Inputs) {
	n := len(rows) * ds.Dim
	switch {
	case x.F32 != nil:
		GatherImages(ds, rows, x.F32[:n])
		clear(x.F32[n:])
	case x.F64 != nil:
		GatherImages(ds, rows, x.F64[:n])
		clear(x.F64[n:])
	}
}

// arraySplit is a split whose features and labels are Arrays read in place:
// a stage holds the batches it draws, not the split.
type arraySplit struct {
	features, labelArr *Array
	// featuresKey and labelsKey are the config keys that named the arrays
	// ("data.train_features"), for errors; empty for Fashion-MNIST's files,
	// which name themselves.
	featuresKey, labelsKey string
}

func (a *arraySplit) Len() int { return a.labelArr.Rows() }

func (a *arraySplit) gather(rows []int, x Inputs) {
	n := len(rows) * a.features.RowLen()
	switch {
	case x.F32 != nil:
		gatherRows(a.features, rows, x.F32[:n])
		clear(x.F32[n:])
	case x.F64 != nil:
		gatherRows(a.features, rows, x.F64[:n])
		clear(x.F64[n:])
	}
	release(a.features.mapped)
}

func (a *arraySplit) labels(rows []int, y []int) {
	for i, r := range rows {
		y[i] = int(a.labelArr.Label(r))
	}
}

// Close releases both arrays.
func (a *arraySplit) Close() error {
	return errors.Join(a.features.Close(), a.labelArr.Close())
}

// check checks the split against the model: features of known dtype and of
// the model's input size, labels one integer per example, each below the
// model's classes. It reads every label (a few bytes per example) and no
// feature. Errors wrap ErrBadData and name the config, its key and the file.
func (a *arraySplit) check(config string, m *Model) error {
	bad := func(key string, format string, args ...any) error {
		if key != "" {
			config += ": " + key
		}
		return BadData(fmt.Errorf("%s: data: %s", config, fmt.Sprintf(format, args...)))
	}
	f, l := a.features, a.labelArr
	switch f.DType {
	case "uint8", "float16", "float32":
	default:
		return bad(a.featuresKey, "%s: features of dtype %s: want uint8, float16 or float32", f.Name, f.DType)
	}
	if len(f.Shape) < 2 {
		return bad(a.featuresKey, "%s: features of shape %v: want [examples, features...]", f.Name, f.Shape)
	}
	if d := f.RowLen(); d != m.Features() {
		return bad(a.featuresKey, "%s: examples have %d features; model.input is %d", f.Name, d, m.Features())
	}
	switch l.DType {
	case "uint8", "int32", "int64":
	default:
		return bad(a.labelsKey, "%s: labels of dtype %s: want int64, int32 or uint8", l.Name, l.DType)
	}
	if len(l.Shape) != 1 {
		return bad(a.labelsKey, "%s: labels of shape %v: want one label per example, [examples]", l.Name, l.Shape)
	}
	if f.Rows() != l.Rows() {
		return bad(a.labelsKey, "%s: %d labels, but %s holds %d examples", l.Name, l.Rows(), f.Name, f.Rows())
	}
	for i := range l.Rows() {
		switch v := l.Label(i); {
		case v < 0:
			return bad(a.labelsKey, "%s: label %d of example %d is negative; labels are classes in [0, model.classes)", l.Name, v, i)
		case v >= int64(m.Classes):
			return bad(a.labelsKey, "%s: label %d of example %d is not below model.classes %d", l.Name, v, i, m.Classes)
		}
	}
	return nil
}

// openSource is the source of a classification dataset: train, and test
// (nil when the run does not evaluate), micro-batches drawn by a Sampler
// over the training examples.
func openSource(s *Section, train, test split) (*classSource, error) {
	sampler, err := NewSampler(s.Seed, train.Len(), s.BatchSize)
	if err != nil {
		return nil, err
	}
	return &classSource{trainSet: train, testSet: test, sampler: sampler, batch: s.MicroBatch}, nil
}

// classSource serves classification datasets: features in, one label each.
// Fashion-MNIST and dataset arrays draw their batches through it alike.
type classSource struct {
	trainSet, testSet split
	sampler           *Sampler
	batch             int // examples per micro-batch
	step              int
	idx               []int // the current step's example indices
}

func (f *classSource) rows(step, mb int) []int {
	if f.idx == nil || f.step != step {
		f.idx, f.step = f.sampler.Indices(step), step
	}
	return f.idx[mb*f.batch : (mb+1)*f.batch]
}

func (f *classSource) Train(step, mb int, x Inputs, targets bool) []int {
	rows := f.rows(step, mb)
	f.trainSet.gather(rows, x)
	if !targets {
		return nil
	}
	y := make([]int, len(rows))
	f.trainSet.labels(rows, y)
	return y
}

func (f *classSource) EvalBatches() int {
	if f.testSet == nil {
		return 0
	}
	return (f.testSet.Len() + f.batch - 1) / f.batch
}

func (f *classSource) Eval(k int, x Inputs, targets bool) ([]int, int) {
	var rows []int
	for i := k * f.batch; i < min(f.testSet.Len(), (k+1)*f.batch); i++ {
		rows = append(rows, i)
	}
	f.testSet.gather(rows, x)
	if !targets {
		return nil, len(rows)
	}
	y := make([]int, f.batch) // padding rows are class 0 and not scored
	f.testSet.labels(rows, y[:len(rows)])
	return y, len(rows)
}

func (f *classSource) EvalName() string { return "test" }

func (f *classSource) NextToken() bool { return false }
