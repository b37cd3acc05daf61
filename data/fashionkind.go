package data

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// fashionKind is dataset fashion-mnist: the IDX files of Fashion-MNIST, or
// files named like them, in data.dir.
type fashionKind struct{}

func init() { Register(fashionKind{}) }

func (fashionKind) Name() string { return "fashion-mnist" }

func (fashionKind) Validate(s *Section, m *Model, problem func(key, format string, args ...any)) {
	if m != nil && m.Targets > 1 {
		problem("data.dataset", "fashion-mnist holds images; model %s predicts tokens (use dataset: text)", m.Name)
	}
}

// Check reads the image files' headers and the labels of the splits the run
// reads (the test split when it evaluates), never the images.
func (fashionKind) Check(s *Section, m *Model) error {
	if _, err := os.Stat(s.Dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: data.dir: %s: %w (%s)", s.Config, s.Dir, fs.ErrNotExist, installHint)
	} else if err != nil {
		return fmt.Errorf("%s: data.dir: %w", s.Config, err)
	}
	for _, split := range imageSplits(s.Evaluate) {
		ds, err := LoadFashionMNIST(s.Dir, split, false, true)
		if err != nil {
			return fmt.Errorf("%s: data.dir: %w", s.Config, err)
		}
		if err := checkImages(s, ds, m); err != nil {
			return err
		}
	}
	return nil
}

func (fashionKind) Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	return openImages(s, m, o)
}

// imageSplits are the Fashion-MNIST splits a run reads: the training split,
// and the test split when it evaluates.
func imageSplits(evaluate bool) []string {
	if evaluate {
		return []string{"train", "test"}
	}
	return []string{"train"}
}

// checkImages checks a loaded split against the model, with the error that
// names the config: the check Check makes before any stage starts, which a
// stage makes again on the data it loads or is handed.
func checkImages(s *Section, ds *Dataset, m *Model) error {
	if err := ds.CheckModel(m.Features(), m.Classes); err != nil {
		return fmt.Errorf("%s: %w", s.Config, err)
	}
	return nil
}

// openImages is the source of an image dataset: o.Train and o.Test when
// handed in, else the splits of Fashion-MNIST in s.Dir (the test split when
// the run evaluates), loading only the images (o.Inputs) and labels
// (o.Targets) the stage needs.
func openImages(s *Section, m *Model, o OpenOptions) (Source, error) {
	f := &imageSource{trainSet: o.Train, testSet: o.Test, batch: s.MicroBatch}
	var err error
	if f.trainSet == nil {
		if f.trainSet, err = LoadFashionMNIST(s.Dir, "train", o.Inputs, o.Targets); err != nil {
			return nil, err
		}
	}
	if f.testSet == nil && s.Evaluate {
		if f.testSet, err = LoadFashionMNIST(s.Dir, "test", o.Inputs, o.Targets); err != nil {
			return nil, err
		}
	}
	for _, ds := range []*Dataset{f.trainSet, f.testSet} {
		if ds == nil {
			continue
		}
		if err := checkImages(s, ds, m); err != nil {
			return nil, err
		}
	}
	if f.sampler, err = NewSampler(s.Seed, f.trainSet.N, s.BatchSize); err != nil {
		return nil, err
	}
	return f, nil
}

// imageSource serves Fashion-MNIST style datasets: images in, one label each.
type imageSource struct {
	trainSet, testSet *Dataset
	sampler           *Sampler
	batch             int // examples per micro-batch
	step              int
	idx               []int // the current step's example indices
}

func (f *imageSource) rows(step, mb int) []int {
	if f.idx == nil || f.step != step {
		f.idx, f.step = f.sampler.Indices(step), step
	}
	return f.idx[mb*f.batch : (mb+1)*f.batch]
}

func (f *imageSource) Train(step, mb int, x Inputs, targets bool) []int {
	rows := f.rows(step, mb)
	gather(f.trainSet, rows, x)
	if !targets {
		return nil
	}
	y := make([]int, len(rows))
	GatherLabels(f.trainSet, rows, y)
	return y
}

func (f *imageSource) EvalBatches() int {
	if f.testSet == nil {
		return 0
	}
	return (f.testSet.N + f.batch - 1) / f.batch
}

func (f *imageSource) Eval(k int, x Inputs, targets bool) ([]int, int) {
	var rows []int
	for i := k * f.batch; i < min(f.testSet.N, (k+1)*f.batch); i++ {
		rows = append(rows, i)
	}
	gather(f.testSet, rows, x)
	if !targets {
		return nil, len(rows)
	}
	y := make([]int, f.batch) // padding rows are class 0 and not scored
	GatherLabels(f.testSet, rows, y[:len(rows)])
	return y, len(rows)
}

func (f *imageSource) EvalName() string { return "test" }

func (f *imageSource) NextToken() bool { return false }

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
