package data

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// tokenizers are the values of data.tokenizer.
var tokenizers = []string{"byte", "char"}

// Tokenizers returns the values data.tokenizer takes.
func Tokenizers() []string { return slices.Clone(tokenizers) }

// textKind is dataset text: data.corpus, tokenized, for a language model.
type textKind struct{}

func init() { Register(textKind{}) }

func (textKind) Name() string { return "text" }

func (textKind) Validate(s *Section, m *Model, problem func(key, format string, args ...any)) {
	if s.Corpus == "" {
		problem("data.corpus", `missing; give a text file, a directory, or "go:PKG" for the Go sources of package PKG`)
	}
	if !slices.Contains(tokenizers, s.Tokenizer) {
		problem("data.tokenizer", "unknown tokenizer %q (known: %s)", s.Tokenizer, strings.Join(tokenizers, ", "))
	}
	if s.ValFraction <= 0 || s.ValFraction >= 1 {
		problem("data.val_fraction", "must be in (0, 1), got %v", s.ValFraction)
	}
	if s.MaxBytes < 0 {
		problem("data.max_bytes", "must be 0 (no limit) or positive, got %d", s.MaxBytes)
	}
	if m != nil && m.Targets == 1 {
		problem("data.dataset", "text trains language models; model %s is a classifier (use model: gpt)", m.Name)
	}
	if m != nil && s.Tokenizer == "byte" && m.Classes != 256 {
		problem("model.vocab", "is %d; the byte tokenizer has 256 symbols", m.Classes)
	}
}

// Check finds the corpus's files and checks the tokenizer's vocabulary
// against model.vocab without tokenizing the corpus: the byte tokenizer's
// is fixed, so only the files' sizes are read; the char tokenizer's is the
// set of bytes the corpus uses, which one streaming pass finds.
func (textKind) Check(s *Section, m *Model) error {
	path, files, err := corpusOf(s)
	if err != nil {
		return err
	}
	var tok Tokenizer = ByteTokenizer{}
	if s.Tokenizer == "char" {
		var seen [256]bool
		n, err := scanCorpus(files, s.MaxBytes, &seen)
		if err == nil && n == 0 {
			err = fmt.Errorf("data: corpus %s is empty", path)
		}
		if err == nil {
			tok, err = charTokenizer(&seen)
		}
		if err != nil {
			return fmt.Errorf("%s: data.corpus: %w", s.Config, err)
		}
	} else if err := nonEmpty(path, files); err != nil {
		return fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	return checkVocab(s, m.Vocab, tok, path)
}

func (textKind) Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	return openText(s, m, o.Text)
}

// corpusPath resolves data.corpus: "go:PKG" to the Go sources of PKG, a
// relative path against the config's folder.
func corpusPath(s *Section) (string, error) {
	if pkg, ok := strings.CutPrefix(s.Corpus, "go:"); ok {
		return GoSourceDir(pkg)
	}
	src := s.resolve(s.Corpus)
	if _, err := os.Stat(src); err != nil {
		return "", fmt.Errorf("%s: %w", s.Corpus, err)
	}
	return src, nil
}

// corpusOf finds the corpus's path and the files LoadText would read, with
// the errors LoadText gives.
func corpusOf(s *Section) (string, []string, error) {
	path, err := corpusPath(s)
	if err != nil {
		return "", nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	if err := checkGlob(s.Glob); err != nil {
		return "", nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	files, err := corpusFiles(path, s.Glob)
	if err != nil {
		return "", nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	return path, files, nil
}

// nonEmpty opens each file, as reading it would, and fails as LoadCorpus
// does when they hold no byte at all.
func nonEmpty(path string, files []string) error {
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("data: corpus: %w", err)
		}
		info, err := f.Stat()
		f.Close()
		if err != nil {
			return fmt.Errorf("data: corpus: %w", err)
		}
		// A file that is not regular (a pipe) tells no size: only reading
		// it says whether it is empty.
		if info.Size() > 0 || !info.Mode().IsRegular() {
			return nil
		}
	}
	return fmt.Errorf("data: corpus %s is empty", path)
}

// scanCorpus marks in seen the bytes of files, read in order as LoadCorpus
// reads them, at most maxBytes (0: all), and returns how many it read.
func scanCorpus(files []string, maxBytes int64, seen *[256]bool) (int64, error) {
	var n int64
	buf := make([]byte, 1<<16)
	for _, name := range files {
		if maxBytes > 0 && n >= maxBytes {
			break
		}
		f, err := os.Open(name)
		if err != nil {
			return n, fmt.Errorf("data: corpus: %w", err)
		}
		var r io.Reader = f
		if maxBytes > 0 {
			r = io.LimitReader(f, maxBytes-n)
		}
		for {
			k, err := r.Read(buf)
			for _, b := range buf[:k] {
				seen[b] = true
			}
			n += int64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				f.Close()
				return n, fmt.Errorf("data: corpus: %w", err)
			}
		}
		f.Close()
	}
	return n, nil
}

// LoadText reads and tokenizes the corpus s names, split into training and
// validation tokens, and checks that the tokenizer gives vocab symbols.
func LoadText(s *Section, vocab int) (*Text, error) {
	path, err := corpusPath(s)
	if err != nil {
		return nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	corpus, err := LoadCorpus(path, s.Glob, s.MaxBytes)
	if err != nil {
		return nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
	}
	var tok Tokenizer = ByteTokenizer{}
	if s.Tokenizer == "char" {
		if tok, err = NewCharTokenizer(corpus); err != nil {
			return nil, fmt.Errorf("%s: data.corpus: %w", s.Config, err)
		}
	}
	if err := checkVocab(s, vocab, tok, path); err != nil {
		return nil, err
	}
	return NewText(corpus, tok, s.ValFraction)
}

// checkVocab checks that the tokenizer of the corpus at path gives as many
// symbols as model.vocab: a token id at or beyond it would index past the
// model's embedding and its one-hot rows.
func checkVocab(s *Section, vocab int, tok Tokenizer, path string) error {
	if vocab != tok.Vocab() {
		return BadData(fmt.Errorf("%s: model.vocab is %d; the %s tokenizer finds %d symbols in %s", s.Config, vocab, s.Tokenizer, tok.Vocab(), path))
	}
	return nil
}

// openText is the source of a text dataset: text when handed in (checked
// against model.vocab), else the corpus s names, loaded and tokenized.
func openText(s *Section, m *Model, text *Text) (Source, error) {
	if text == nil {
		var err error
		if text, err = LoadText(s, m.Vocab); err != nil {
			return nil, err
		}
	} else if err := checkVocab(s, m.Vocab, text.Tokenizer, s.Corpus); err != nil {
		return nil, err
	}
	context := m.Example[0]
	f := &textSource{text: text, batch: s.MicroBatch, context: context, step: -1}
	var err error
	if f.sampler, err = NewTextSampler(s.Seed, len(text.Train), context, s.BatchSize); err != nil {
		return nil, fmt.Errorf("%s: data: %w", s.Config, err)
	}
	if s.Evaluate {
		if f.val, err = ValidationBatches(len(text.Val), context, f.batch); err != nil {
			return nil, fmt.Errorf("%s: data.val_fraction: %w", s.Config, err)
		}
	}
	return f, nil
}

// textSource serves a tokenized corpus: windows of context tokens in, the
// next token of each position as targets.
type textSource struct {
	text    *Text
	sampler *TextSampler
	val     [][]int // validation window starts, one micro-batch each
	batch   int
	context int
	step    int
	starts  []int
}

func (f *textSource) fill(tokens []int32, starts []int, x Inputs) []int {
	y := make([]int, len(starts)*f.context)
	switch {
	case x.F32 != nil:
		GatherWindows(tokens, starts, f.context, x.F32, y)
	case x.F64 != nil:
		GatherWindows(tokens, starts, f.context, x.F64, y)
	default:
		GatherWindows(tokens, starts, f.context, make([]float32, len(y)), y)
	}
	return y
}

func (f *textSource) Train(step, mb int, x Inputs, targets bool) []int {
	if f.step != step {
		f.starts, f.step = f.sampler.Starts(step), step
	}
	y := f.fill(f.text.Train, f.starts[mb*f.batch:(mb+1)*f.batch], x)
	if !targets {
		return nil
	}
	return y
}

func (f *textSource) EvalBatches() int { return len(f.val) }

func (f *textSource) Eval(k int, x Inputs, targets bool) ([]int, int) {
	y := f.fill(f.text.Val, f.val[k], x)
	if !targets {
		return nil, len(y)
	}
	return y, len(y)
}

func (f *textSource) EvalName() string { return "validation" }

func (f *textSource) NextToken() bool { return true }
