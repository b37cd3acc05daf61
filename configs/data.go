package configs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/models"
)

// datasets are the values of data.dataset, and tokenizers those of
// data.tokenizer (read with dataset text).
var (
	datasets   = []string{"fashion-mnist", "text"}
	tokenizers = []string{"byte", "char"}
)

// validateData checks the data section against the model: images for the
// classifiers, text for the language model.
func (c *Config) validateData(p *Problems, model *models.Model) {
	d := c.Data
	if !slices.Contains(datasets, d.Dataset) {
		p.add("data.dataset", "unknown dataset %q (known: %s)", d.Dataset, strings.Join(datasets, ", "))
	}
	switch d.Dataset {
	case "fashion-mnist":
		if model != nil && model.Targets() > 1 {
			p.add("data.dataset", "fashion-mnist holds images; model %s predicts tokens (use dataset: text)", c.Model.Name)
		}
	case "text":
		if d.Corpus == "" {
			p.add("data.corpus", `missing; give a text file, a directory, or "go:PKG" for the Go sources of package PKG`)
		}
		if !slices.Contains(tokenizers, d.Tokenizer) {
			p.add("data.tokenizer", "unknown tokenizer %q (known: %s)", d.Tokenizer, strings.Join(tokenizers, ", "))
		}
		if d.ValFraction <= 0 || d.ValFraction >= 1 {
			p.add("data.val_fraction", "must be in (0, 1), got %v", d.ValFraction)
		}
		if d.MaxBytes < 0 {
			p.add("data.max_bytes", "must be 0 (no limit) or positive, got %d", d.MaxBytes)
		}
		if model != nil && model.Targets() == 1 {
			p.add("data.dataset", "text trains language models; model %s is a classifier (use model: gpt)", c.Model.Name)
		}
		if model != nil && d.Tokenizer == "byte" && model.Classes != 256 {
			p.add("model.vocab", "is %d; the byte tokenizer has 256 symbols", model.Classes)
		}
	}
	if c.Train.EvalEvery < 0 {
		p.add("train.eval_every", "must be 0 (only after the last step) or a number of steps, got %d", c.Train.EvalEvery)
	}
}

// CheckData checks the data the config names against its model, before any
// stage starts: the Fashion-MNIST files' features against model.input and
// every label of the splits the run reads against model.classes; a text
// corpus's symbols against model.vocab. Errors name the file, and for a label
// the index of the first bad example. Data not found on this machine is an
// error that wraps fs.ErrNotExist, which validate tells apart.
func (c *Config) CheckData() error {
	if c.Data.Dataset == "text" {
		_, err := c.LoadText()
		return err
	}
	model, err := models.Build(c.Model)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	dir := c.DataDir()
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: data.dir: %s: %w (install Debian package dataset-fashion-mnist)", c.Path, dir, fs.ErrNotExist)
	} else if err != nil {
		return fmt.Errorf("%s: data.dir: %w", c.Path, err)
	}
	for _, split := range c.ImageSplits() {
		ds, err := data.LoadFashionMNIST(dir, split, false, true)
		if err != nil {
			return fmt.Errorf("%s: data.dir: %w", c.Path, err)
		}
		if err := c.CheckImages(ds, model); err != nil {
			return err
		}
	}
	return nil
}

// ImageSplits are the Fashion-MNIST splits a run reads: the training split,
// and the test split when it evaluates.
func (c *Config) ImageSplits() []string {
	if c.Train.Evaluate || c.Train.EvalEvery > 0 {
		return []string{"train", "test"}
	}
	return []string{"train"}
}

// CheckImages checks a loaded split against the model: the check CheckData
// makes before any stage starts, which a stage makes again on the data it
// loads, so that it refuses bad data with the same error rather than index
// past a one-hot row.
func (c *Config) CheckImages(ds *data.Dataset, model *models.Model) error {
	if err := ds.CheckModel(model.Example.TotalSize(), model.Classes); err != nil {
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	return nil
}

// DataDir is data.dir, a relative path taken from the config's folder, as
// data.corpus and the other paths of a config are, whether it came from the
// file or from PIPETRAIN_DATA_DIR: the stages of a run, and a resumed run,
// then find the same files wherever they are started from.
func (c *Config) DataDir() string { return c.resolve(c.Data.Dir) }

// CorpusPath resolves data.corpus: "go:PKG" to the Go sources of PKG, a relative
// path against the config's folder.
func (c *Config) CorpusPath() (string, error) {
	if pkg, ok := strings.CutPrefix(c.Data.Corpus, "go:"); ok {
		return data.GoSourceDir(pkg)
	}
	src := c.resolve(c.Data.Corpus)
	if _, err := os.Stat(src); err != nil {
		return "", fmt.Errorf("%s: %w", c.Data.Corpus, err)
	}
	return src, nil
}

// LoadText reads and tokenizes the text corpus, split into training and
// validation tokens, and checks the model's vocabulary fits the tokenizer.
func (c *Config) LoadText() (*data.Text, error) {
	path, err := c.CorpusPath()
	if err != nil {
		return nil, fmt.Errorf("%s: data.corpus: %w", c.Path, err)
	}
	corpus, err := data.LoadCorpus(path, c.Data.Glob, c.Data.MaxBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: data.corpus: %w", c.Path, err)
	}
	var tok data.Tokenizer = data.ByteTokenizer{}
	if c.Data.Tokenizer == "char" {
		if tok, err = data.NewCharTokenizer(corpus); err != nil {
			return nil, fmt.Errorf("%s: data.corpus: %w", c.Path, err)
		}
	}
	if err := c.CheckVocab(tok, path); err != nil {
		return nil, err
	}
	return data.NewText(corpus, tok, c.Data.ValFraction)
}

// CheckVocab checks that the tokenizer of the corpus at path gives as many
// symbols as model.vocab: a token id at or beyond it would index past the
// model's embedding and its one-hot rows.
func (c *Config) CheckVocab(tok data.Tokenizer, path string) error {
	if c.Model.Vocab != tok.Vocab() {
		return data.BadData(fmt.Errorf("%s: model.vocab is %d; the %s tokenizer finds %d symbols in %s", c.Path, c.Model.Vocab, c.Data.Tokenizer, tok.Vocab(), path))
	}
	return nil
}
