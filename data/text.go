package data

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"unicode/utf8"
)

// Tokenizer maps bytes of text to token ids in [0, Vocab()) and back.
type Tokenizer interface {
	Vocab() int
	// Encode fails on a byte the tokenizer has no id for.
	Encode(text []byte) ([]int32, error)
	// Decode fails on an id outside [0, Vocab()).
	Decode(ids []int32) ([]byte, error)
}

// ByteTokenizer is the identity on bytes: 256 ids, any input encodes.
type ByteTokenizer struct{}

func (ByteTokenizer) Vocab() int { return 256 }

func (ByteTokenizer) Encode(text []byte) ([]int32, error) {
	ids := make([]int32, len(text))
	for i, b := range text {
		ids[i] = int32(b)
	}
	return ids, nil
}

func (ByteTokenizer) Decode(ids []int32) ([]byte, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		if id < 0 || id > 255 {
			return nil, fmt.Errorf("data: token id %d at position %d is not a byte", id, i)
		}
		out[i] = byte(id)
	}
	return out, nil
}

// CharTokenizer numbers the distinct bytes of a corpus in increasing order, so
// a small alphabet gets a small vocabulary (and a small embedding and LM head).
// It is a pure function of the corpus: every process of a run that loads the
// same corpus agrees on the ids.
type CharTokenizer struct {
	symbols []byte     // id -> byte, increasing
	ids     [256]int32 // byte -> id, -1 when absent
}

// NewCharTokenizer builds the vocabulary of corpus, which needs at least two
// distinct bytes (a one-symbol language model predicts nothing).
func NewCharTokenizer(corpus []byte) (*CharTokenizer, error) {
	var seen [256]bool
	for _, b := range corpus {
		seen[b] = true
	}
	return charTokenizer(&seen)
}

// charTokenizer numbers the bytes seen marks, in increasing order.
func charTokenizer(seen *[256]bool) (*CharTokenizer, error) {
	t := &CharTokenizer{}
	for b := range 256 {
		t.ids[b] = -1
		if seen[b] {
			t.ids[b] = int32(len(t.symbols))
			t.symbols = append(t.symbols, byte(b))
		}
	}
	if len(t.symbols) < 2 {
		return nil, fmt.Errorf("data: corpus has %d distinct bytes; a character vocabulary needs at least 2", len(t.symbols))
	}
	return t, nil
}

func (t *CharTokenizer) Vocab() int { return len(t.symbols) }

// Symbols returns the byte of each id, in id order.
func (t *CharTokenizer) Symbols() []byte { return append([]byte(nil), t.symbols...) }

// Encode gives each byte its id. The vocabulary holds bytes, so a character
// of several UTF-8 bytes encodes when the corpus had each of its bytes; one
// that does not is refused as the character the text holds, at its position
// in characters, not as one of its bytes.
func (t *CharTokenizer) Encode(text []byte) ([]int32, error) {
	ids := make([]int32, len(text))
	for i, b := range text {
		if ids[i] = t.ids[b]; ids[i] < 0 {
			return nil, t.unknown(text, i)
		}
	}
	return ids, nil
}

// unknown describes the character of text holding byte i, which the
// vocabulary lacks.
func (t *CharTokenizer) unknown(text []byte, i int) error {
	pos, start := 0, 0
	for start < len(text) {
		_, size := utf8.DecodeRune(text[start:])
		if start+size > i {
			break
		}
		start += size
		pos++
	}
	r, size := utf8.DecodeRune(text[start:])
	if r == utf8.RuneError && size <= 1 {
		return fmt.Errorf("data: byte 0x%02x at position %d (not UTF-8) is not in the character vocabulary", text[i], pos)
	}
	return fmt.Errorf("data: character %q at position %d is not in the character vocabulary", r, pos)
}

func (t *CharTokenizer) Decode(ids []int32) ([]byte, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.symbols) {
			return nil, fmt.Errorf("data: token id %d at position %d is outside the vocabulary [0, %d)", id, i, len(t.symbols))
		}
		out[i] = t.symbols[id]
	}
	return out, nil
}

// LoadCorpus reads the text at path: the file itself, or, for a directory,
// every regular file in its tree whose base name matches glob ("" matches
// all, e.g. "*.go"), concatenated in sorted path order so the corpus is the
// same on every machine with the same files. At most maxBytes are read (0 for
// no cap); the cap cuts the last file short. Symbolic links are not followed.
func LoadCorpus(path, glob string, maxBytes int64) ([]byte, error) {
	if err := checkGlob(glob); err != nil {
		return nil, err
	}
	files, err := corpusFiles(path, glob)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, f := range files {
		left := int64(-1)
		if maxBytes > 0 {
			if left = maxBytes - int64(len(out)); left <= 0 {
				break
			}
		}
		if out, err = appendFile(out, f, left); err != nil {
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("data: corpus %s is empty", path)
	}
	return out, nil
}

// checkGlob refuses a malformed file pattern.
func checkGlob(glob string) error {
	if glob != "" {
		if _, err := filepath.Match(glob, ""); err != nil {
			return fmt.Errorf("data: file pattern %q: %w", glob, err)
		}
	}
	return nil
}

// corpusFiles lists the files LoadCorpus reads, sorted.
func corpusFiles(path, glob string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: corpus: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if ok, _ := filepath.Match(glob, d.Name()); glob == "" || ok {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data: corpus: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("data: corpus directory %s has no files matching %q", path, glob)
	}
	// WalkDir's order sorts names within each directory, which is not the
	// order of whole paths ("a.go" sorts before "a/b.go").
	sort.Strings(files)
	return files, nil
}

// appendFile appends at most limit bytes of file name to out (all of it when
// limit < 0).
func appendFile(out []byte, name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("data: corpus: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("data: corpus: %w", err)
	}
	return append(out, b...), nil
}

// Text is a tokenized corpus cut into a training part and, after it, a
// validation part.
type Text struct {
	Tokenizer  Tokenizer
	Train, Val []int32
}

// NewText encodes corpus and keeps its last valFraction of tokens for
// validation (none when valFraction is 0). Taking the tail rather than random
// windows keeps validation text unseen in training and the split the same on
// every process.
func NewText(corpus []byte, tok Tokenizer, valFraction float64) (*Text, error) {
	if valFraction < 0 || valFraction >= 1 {
		return nil, fmt.Errorf("data: validation fraction %v out of range [0, 1)", valFraction)
	}
	ids, err := tok.Encode(corpus)
	if err != nil {
		return nil, err
	}
	cut := len(ids) - int(float64(len(ids))*valFraction)
	return &Text{Tokenizer: tok, Train: ids[:cut], Val: ids[cut:]}, nil
}

// TextSampler picks each training step's windows as a pure function of
// (Seed, step), like Sampler: every process of a run agrees on step k's batch
// without talking, and a resumed run sees the same batches. A window is
// Context+1 consecutive tokens: Context inputs and, shifted by one, Context
// next-token targets. Starts are drawn uniformly with replacement, from a PCG
// generator seeded with (Seed, step), since the windows of a long text overlap
// anyway and an epoch of them has no natural order.
type TextSampler struct {
	Seed           uint64
	Context, Batch int
	N              int // tokens in the training text
}

// NewTextSampler returns a sampler of batch windows of context+1 tokens from a
// text of n tokens.
func NewTextSampler(seed uint64, n, context, batch int) (*TextSampler, error) {
	if context < 1 || batch < 1 {
		return nil, fmt.Errorf("data: context %d and batch %d must be >= 1", context, batch)
	}
	if n < context+1 {
		return nil, fmt.Errorf("data: training text of %d tokens is shorter than one window of context+1 = %d", n, context+1)
	}
	return &TextSampler{Seed: seed, Context: context, Batch: batch, N: n}, nil
}

// Starts returns the first token index of each of step's windows (a new
// slice of len Batch), each in [0, N-Context-1].
func (s *TextSampler) Starts(step int) []int {
	if step < 0 {
		panic(fmt.Sprintf("data: TextSampler.Starts: negative step %d", step))
	}
	r := rand.New(rand.NewPCG(s.Seed, uint64(step)))
	starts := make([]int, s.Batch)
	for i := range starts {
		starts[i] = r.IntN(s.N - s.Context)
	}
	return starts
}

// ValidationBatches cuts tokens into consecutive windows of context+1 tokens
// that overlap by one, so every token after the first is a target exactly
// once, and groups their starts into batches of batch windows. Windows that do
// not fill a last batch are dropped, since a pipeline runs fixed-size
// micro-batches.
func ValidationBatches(n, context, batch int) ([][]int, error) {
	if context < 1 || batch < 1 {
		return nil, fmt.Errorf("data: context %d and batch %d must be >= 1", context, batch)
	}
	windows := 0
	if n > context {
		windows = (n - 1) / context
	}
	if windows < batch {
		return nil, fmt.Errorf("data: validation text of %d tokens holds %d windows of context+1 = %d, fewer than one batch of %d", n, windows, context+1, batch)
	}
	out := make([][]int, windows/batch)
	for b := range out {
		out[b] = make([]int, batch)
		for i := range out[b] {
			out[b][i] = (b*batch + i) * context
		}
	}
	return out, nil
}

// GatherWindows copies the windows at starts into a model batch: x gets the
// inputs, window by window (len(starts)*context values, ids as floats of the
// model's dtype), and y the next-token targets in the same order.
func GatherWindows[T float32 | float64](tokens []int32, starts []int, context int, x []T, y []int) {
	if len(x) != len(starts)*context || len(y) != len(x) {
		panic(fmt.Sprintf("data: GatherWindows: x has %d values and y %d, want %d", len(x), len(y), len(starts)*context))
	}
	for i, s := range starts {
		if s < 0 || s+context+1 > len(tokens) {
			panic(fmt.Sprintf("data: GatherWindows: window at %d overruns %d tokens", s, len(tokens)))
		}
		for j := range context {
			x[i*context+j] = T(tokens[s+j])
			y[i*context+j] = int(tokens[s+j+1])
		}
	}
}

// GoSourceDir finds a directory of the Go standard library sources, e.g.
// GoSourceDir("strings"), a small, always-present default text corpus. It
// looks under $GOROOT and the usual install locations.
func GoSourceDir(pkg string) (string, error) {
	roots := []string{os.Getenv("GOROOT"), "/usr/local/go", "/usr/lib/go"}
	if more, err := filepath.Glob("/usr/lib/go-*"); err == nil {
		roots = append(roots, more...)
	}
	for _, root := range roots {
		if root == "" {
			continue
		}
		dir := filepath.Join(root, "src", pkg)
		if info, err := os.Stat(dir); err == nil && info.IsDir() {
			return dir, nil
		}
	}
	return "", errors.New("data: no Go source tree found under $GOROOT, /usr/local/go or /usr/lib/go; set GOROOT or give a corpus path")
}
