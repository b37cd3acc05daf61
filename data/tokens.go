package data

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// TokenStream is token files read as one stream, in the order given: a run
// draws its windows from the stream, so a window may span two files as it
// would span two documents of one file.
type TokenStream struct {
	Files []*TokenFile
	ends  []int64 // tokens up to the end of each file
}

// OpenTokenStream opens the token files at paths (see OpenTokenFile), all
// of format and, for nanoGPT files, dtype. It reads headers, not tokens.
func OpenTokenStream(paths []string, format, dtype string) (*TokenStream, error) {
	s := &TokenStream{}
	var n int64
	for _, p := range paths {
		f, err := OpenTokenFile(p, format, dtype)
		if err != nil {
			s.Close()
			return nil, err
		}
		n += f.Tokens
		s.Files, s.ends = append(s.Files, f), append(s.ends, n)
	}
	return s, nil
}

// Len is the number of tokens in the stream.
func (s *TokenStream) Len() int64 {
	if len(s.ends) == 0 {
		return 0
	}
	return s.ends[len(s.ends)-1]
}

// Close releases every file's mapping.
func (s *TokenStream) Close() {
	for _, f := range s.Files {
		f.Close()
	}
}

// Read copies tokens [start, start+len(dst)) of the stream into dst,
// checking each against vocab: an id at or beyond it, or a negative one, is
// an error wrapping ErrBadData that names the file and the token's offset.
func (s *TokenStream) Read(start int64, dst []int32, vocab int) error {
	if start < 0 || start+int64(len(dst)) > s.Len() {
		return fmt.Errorf("data: tokens [%d, %d) are beyond the stream's %d", start, start+int64(len(dst)), s.Len())
	}
	k := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > start })
	for len(dst) > 0 {
		f := s.Files[k]
		i := start - (s.ends[k] - f.Tokens)
		n := min(int64(len(dst)), f.Tokens-i)
		for j := range n {
			v := f.At(i + j)
			if v < 0 || v >= int64(vocab) {
				return f.badToken(i+j, vocab)
			}
			dst[j] = int32(v)
		}
		release(f.mapped)
		dst, start, k = dst[n:], start+n, k+1
	}
	return nil
}

// CheckSample checks a sample of each file's tokens against vocab
// (TokenFile.CheckSample).
func (s *TokenStream) CheckSample(vocab int) error {
	for _, f := range s.Files {
		if err := f.CheckSample(vocab); err != nil {
			return err
		}
	}
	return nil
}

// EvalWindows is how many evaluation windows a stream of n tokens holds:
// window i is tokens [i·context, i·context+context], context+1 tokens whose
// last context are the targets, so consecutive windows overlap by one token
// and every token after the first is predicted once; a last partial window
// is dropped.
func EvalWindows(n int64, context int) int64 {
	if n <= int64(context) {
		return 0
	}
	return (n - 1) / int64(context)
}

// tokenSource serves token files: training windows drawn as TextSampler
// draws them from a text, evaluation windows consecutive.
type tokenSource struct {
	train, val     *TokenStream
	vocab          int
	sampler        *TextSampler
	batch, context int
	evalWindows    int64
	step           int
	starts         []int
	window         []int32 // one window's tokens
}

// newTokenSource serves train and val (nil when the run does not
// evaluate) for a model of vocab ids and context tokens.
func newTokenSource(s *Section, train, val *TokenStream, vocab, context int) (*tokenSource, error) {
	f := &tokenSource{train: train, val: val, vocab: vocab, batch: s.MicroBatch, context: context, step: -1, window: make([]int32, context+1)}
	var err error
	if f.sampler, err = NewTextSampler(s.Seed, int(train.Len()), context, s.BatchSize); err != nil {
		return nil, err
	}
	if val != nil {
		f.evalWindows = EvalWindows(val.Len(), context)
	}
	return f, nil
}

// fill copies the windows at starts of stream into x's first rows, zeroes
// the rest of x, and returns the targets of batch windows (those of padding
// rows 0). A token beyond the vocabulary panics with Read's error, since a
// Source has no error to return: Check and Open sample the files first, so
// this is a bad token the sample missed.
func (f *tokenSource) fill(stream *TokenStream, starts []int64, x Inputs) []int {
	T := f.context
	y := make([]int, f.batch*T)
	for i, start := range starts {
		if err := stream.Read(start, f.window, f.vocab); err != nil {
			panic(err)
		}
		for j := range T {
			switch {
			case x.F32 != nil:
				x.F32[i*T+j] = float32(f.window[j])
			case x.F64 != nil:
				x.F64[i*T+j] = float64(f.window[j])
			}
			y[i*T+j] = int(f.window[j+1])
		}
	}
	clear(x.F32[min(len(x.F32), len(starts)*T):])
	clear(x.F64[min(len(x.F64), len(starts)*T):])
	return y
}

func (f *tokenSource) Train(step, mb int, x Inputs, targets bool) []int {
	if f.step != step {
		f.starts, f.step = f.sampler.Starts(step), step
	}
	starts := make([]int64, f.batch)
	for i, s := range f.starts[mb*f.batch : (mb+1)*f.batch] {
		starts[i] = int64(s)
	}
	y := f.fill(f.train, starts, x)
	if !targets {
		return nil
	}
	return y
}

// EvalBatches counts micro-batches of evaluation windows, the last padded.
func (f *tokenSource) EvalBatches() int {
	return int((f.evalWindows + int64(f.batch) - 1) / int64(f.batch))
}

func (f *tokenSource) Eval(k int, x Inputs, targets bool) ([]int, int) {
	first := int64(k * f.batch)
	var starts []int64
	for w := first; w < min(first+int64(f.batch), f.evalWindows); w++ {
		starts = append(starts, w*int64(f.context))
	}
	y := f.fill(f.val, starts, x)
	rows := len(starts) * f.context
	if !targets {
		return nil, rows
	}
	return y, rows
}

func (f *tokenSource) EvalName() string { return "validation" }

func (f *tokenSource) NextToken() bool { return true }

// shardPaths expands a file or a glob of token files, taken from the
// config's folder, into the files in sorted order. A Megatron pair matched
// by both its .bin and its .idx is kept once, by its .bin. A pattern that
// matches nothing is an error wrapping fs.ErrNotExist.
func shardPaths(s *Section, pattern string) ([]string, error) {
	p := s.resolve(pattern)
	if !strings.ContainsAny(p, "*?[") {
		return []string{p}, nil
	}
	matches, err := filepath.Glob(p)
	if err != nil {
		return nil, fmt.Errorf("data: file pattern %q: %w", pattern, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("data: no file matches %s: %w", p, fs.ErrNotExist)
	}
	slices.Sort(matches)
	var out []string
	for _, m := range matches {
		if strings.HasSuffix(m, ".idx") && slices.Contains(matches, strings.TrimSuffix(m, ".idx")+".bin") {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// CatchBadData, deferred by a function that draws batches from a Source,
// turns a panic carrying an error of bad data (a token a Source found
// beyond the vocabulary while reading a window) into that function's error
// *err, which a restart would meet again; any other panic goes on.
func CatchBadData(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if e, ok := r.(error); ok && errors.Is(e, ErrBadData) {
		*err = e
		return
	}
	panic(r)
}
