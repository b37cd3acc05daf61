package data

import (
	"fmt"
	"slices"
	"strings"
)

// tokensKind is dataset tokens: token files prepared by llm.c, nanoGPT,
// Megatron or NumPy, mapped into memory and read in place.
type tokensKind struct{}

func init() { Register(tokensKind{}) }

func (tokensKind) Name() string { return "tokens" }

// tokensKeys are the kind's own keys of the data section.
type tokensKeys struct {
	TrainShards string `json:"train_shards"`
	ValShards   string `json:"val_shards"`
	Format      string `json:"token_format"`
	DType       string `json:"token_dtype"`
}

func (tokensKind) Keys() []KeyDoc {
	return []KeyDoc{
		{Key: "train_shards", Type: "string", Doc: "The training token files (dataset tokens): a file or a glob of shards (\"fineweb_train_*.bin\"), taken from the config's folder and read in sorted order as one stream."},
		{Key: "val_shards", Type: "string", Doc: "The validation token files (dataset tokens), a file or a glob, which train.evaluate and train.eval_every cut into consecutive windows of context+1 tokens."},
		{Key: "token_format", Type: "string", Doc: "The token files' format (dataset tokens): auto (the default: llm.c and NumPy by their magic, a Megatron pair by its .idx, any other .bin as nanoGPT's), llm.c, nanogpt, megatron or npy."},
		{Key: "token_dtype", Type: "string", Doc: "The element type of nanoGPT's headerless files (dataset tokens): uint16 (the default) or uint32; the other formats say theirs."},
	}
}

// keys decodes s's own keys; Validate has reported their problems.
func (tokensKind) keys(s *Section) tokensKeys {
	var k tokensKeys
	s.DecodeOwn(&k, func(string, string, ...any) {})
	return k
}

func (t tokensKind) Validate(s *Section, m *Model, problem func(key, format string, args ...any)) {
	var k tokensKeys
	s.DecodeOwn(&k, problem)
	if k.TrainShards == "" {
		problem("data.train_shards", "missing; give a token file or a glob of shards")
	}
	if s.Evaluate && k.ValShards == "" {
		problem("data.val_shards", "missing; the run evaluates (train.evaluate or train.eval_every), on validation tokens: give a token file or a glob of shards")
	}
	if k.Format != "" && !slices.Contains(TokenFormats, k.Format) {
		problem("data.token_format", "unknown format %q (known: %s)", k.Format, strings.Join(TokenFormats, ", "))
	}
	if k.DType != "" && !slices.Contains(NanoGPTDTypes, k.DType) {
		problem("data.token_dtype", "unknown dtype %q (known: %s)", k.DType, strings.Join(NanoGPTDTypes, ", "))
	}
	if m != nil && m.Targets == 1 {
		problem("data.dataset", "tokens trains language models; model %s is a classifier (use model: gpt)", m.Name)
	}
}

// Check opens every file, which reads headers (and Megatron indexes) and
// checks them against the files' lengths, and checks a sample of each
// file's tokens against the vocabulary; that the training stream holds a
// window and, when the run evaluates, that the validation stream does.
func (t tokensKind) Check(s *Section, m *Model) error {
	train, val, err := t.open(s, m)
	if err != nil {
		return err
	}
	train.Close()
	if val != nil {
		val.Close()
	}
	return nil
}

func (t tokensKind) Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	train, val, err := t.open(s, m)
	if err != nil {
		return nil, err
	}
	src, err := newTokenSource(s, train, val, m.Classes, m.Example[0])
	if err != nil {
		return nil, fmt.Errorf("%s: data.train_shards: %w", s.Config, err)
	}
	return src, nil
}

// open opens and checks the training stream and, when the run evaluates,
// the validation stream.
func (t tokensKind) open(s *Section, m *Model) (train, val *TokenStream, err error) {
	k := t.keys(s)
	context := m.Example[0]
	if train, err = openShards(s, "train_shards", k.TrainShards, k, m.Classes); err != nil {
		return nil, nil, err
	}
	if n := train.Len(); n < int64(context)+1 {
		train.Close()
		return nil, nil, BadData(fmt.Errorf("%s: data.train_shards: %s holds %d tokens, fewer than one window of context+1 = %d", s.Config, k.TrainShards, n, context+1))
	}
	if !s.Evaluate {
		return train, nil, nil
	}
	if val, err = openShards(s, "val_shards", k.ValShards, k, m.Classes); err != nil {
		train.Close()
		return nil, nil, err
	}
	if EvalWindows(val.Len(), context) == 0 {
		train.Close()
		val.Close()
		return nil, nil, BadData(fmt.Errorf("%s: data.val_shards: %s holds %d tokens, fewer than one window of context+1 = %d", s.Config, k.ValShards, val.Len(), context+1))
	}
	return train, val, nil
}

// openShards opens the stream of the files pattern names, the value of
// key, and checks a sample of their tokens against vocab.
func openShards(s *Section, key, pattern string, k tokensKeys, vocab int) (*TokenStream, error) {
	paths, err := shardPaths(s, pattern)
	if err != nil {
		return nil, fmt.Errorf("%s: data.%s: %w", s.Config, key, err)
	}
	stream, err := OpenTokenStream(paths, k.Format, k.DType)
	if err != nil {
		return nil, fmt.Errorf("%s: data.%s: %w", s.Config, key, err)
	}
	if err := stream.CheckSample(vocab); err != nil {
		stream.Close()
		return nil, fmt.Errorf("%s: data.%s: %w", s.Config, key, err)
	}
	return stream, nil
}
