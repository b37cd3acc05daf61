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
		a, err := openFashion(s.Dir, split, false)
		if err != nil {
			return fmt.Errorf("%s: data.dir: %w", s.Config, err)
		}
		err = a.check(s.Config, m)
		a.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// Open serves Fashion-MNIST's files as arrays read in place (the images
// mapped, or decompressed when gzipped only on a stage that reads inputs),
// or the splits handed in by o.
func (fashionKind) Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	train, err := fashionSplit(s, m, o.Train, "train", o.Inputs)
	if err != nil {
		return nil, err
	}
	var test split
	if o.Test != nil || s.Evaluate {
		if test, err = fashionSplit(s, m, o.Test, "test", o.Inputs); err != nil {
			return nil, err
		}
	}
	return openSource(s, train, test)
}

// fashionSplit is the split handed in, checked against m, or else the
// split's files in s.Dir, checked.
func fashionSplit(s *Section, m *Model, handed *Dataset, name string, inputs bool) (split, error) {
	if handed != nil {
		if err := checkImages(s, handed, m); err != nil {
			return nil, err
		}
		return datasetSplit{handed}, nil
	}
	a, err := openFashion(s.Dir, name, inputs)
	if err != nil {
		return nil, err
	}
	if err := a.check(s.Config, m); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// openFashion opens split "train" or "test" of Fashion-MNIST in dir as
// arrays: the labels' bytes, and the images' header, and their bytes too
// when images is set or they are mapped in place (which costs nothing until
// they are read).
func openFashion(dir, split string, images bool) (*arraySplit, error) {
	prefix := map[string]string{"train": "train", "test": "t10k"}[split]
	imgPath, err := findIDX(dir, prefix+"-images-idx3-ubyte")
	if err != nil {
		return nil, err
	}
	lblPath, err := findIDX(dir, prefix+"-labels-idx1-ubyte")
	if err != nil {
		return nil, err
	}
	features, err := openIDXArray(imgPath, images)
	if err != nil {
		return nil, err
	}
	labels, err := openIDXArray(lblPath, true)
	if err != nil {
		features.Close()
		return nil, err
	}
	return &arraySplit{features: features, labelArr: labels}, nil
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
