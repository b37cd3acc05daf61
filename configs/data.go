package configs

import (
	"fmt"
	"os"
	"path/filepath"
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

// CorpusPath resolves data.corpus: "go:PKG" to the Go sources of PKG, a relative
// path against the config's folder.
func (c *Config) CorpusPath() (string, error) {
	src := c.Data.Corpus
	if pkg, ok := strings.CutPrefix(src, "go:"); ok {
		return data.GoSourceDir(pkg)
	}
	if !filepath.IsAbs(src) && c.Path != "" {
		src = filepath.Join(filepath.Dir(c.Path), src)
	}
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
	if c.Model.Vocab != tok.Vocab() {
		return nil, fmt.Errorf("%s: model.vocab is %d; the %s tokenizer finds %d symbols in %s", c.Path, c.Model.Vocab, c.Data.Tokenizer, tok.Vocab(), path)
	}
	return data.NewText(corpus, tok, c.Data.ValFraction)
}
