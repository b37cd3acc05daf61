package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// shardTokens reads back the tokens of shards, checking each is an llm.c
// shard of the given magic.
func shardTokens(t *testing.T, shards []Shard, dtype string) []int32 {
	t.Helper()
	var out []int32
	for _, s := range shards {
		f, err := OpenTokenFile(s.Path, FormatLLMC, "")
		if err != nil {
			t.Fatal(err)
		}
		if f.DType != dtype || f.Tokens != s.Tokens {
			t.Errorf("%s: %s, %d tokens; want %s, %d", s.Path, f.DType, f.Tokens, dtype, s.Tokens)
		}
		for i := range f.Tokens {
			out = append(out, int32(f.At(i)))
		}
		f.Close()
	}
	return out
}

// writeText writes text into dir/name.
func writeText(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTokenizeAsTextDataset: shards of the byte and char tokenizers hold
// exactly the training and validation tokens dataset text makes of the same
// files and fraction, in shards of at most --shard-tokens named as llm.c
// names them; the training windows a tokens run draws from them are the
// text run's, step by step; the tokenizer file beside them reads back as
// the tokenizer.
func TestTokenizeAsTextDataset(t *testing.T) {
	dir, texts := t.TempDir(), t.TempDir()
	a := writeText(t, texts, "a.txt", strings.Repeat(variedText, 6))
	b := writeText(t, texts, "b.txt", strings.Repeat("the cat sat on the mat.\n", 40))
	corpus := append(must(os.ReadFile(a)), must(os.ReadFile(b))...)
	for _, name := range []string{"byte", "char"} {
		out := filepath.Join(dir, "tok-"+name)
		res, err := Tokenize([]string{a, b}, TokenizeOptions{Tokenizer: name, Out: out, ShardTokens: 700, ValFraction: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		var tok Tokenizer = ByteTokenizer{}
		if name == "char" {
			tok = must(NewCharTokenizer(corpus))
		}
		text := must(NewText(corpus, tok, 0.1))
		if got := shardTokens(t, res.Train, "uint16"); !slices.Equal(got, text.Train) {
			t.Errorf("%s: %d training tokens differ from dataset text's %d", name, len(got), len(text.Train))
		}
		if got := shardTokens(t, res.Val, "uint16"); !slices.Equal(got, text.Val) {
			t.Errorf("%s: %d validation tokens differ from dataset text's %d", name, len(got), len(text.Val))
		}
		for i, s := range res.Train {
			want := filepath.Join(out, "train_"+[]string{"000000", "000001", "000002", "000003", "000004", "000005", "000006"}[i]+".bin")
			if s.Path != want || i < len(res.Train)-1 && s.Tokens != 700 {
				t.Errorf("%s: shard %d is %s of %d tokens, want %s of 700", name, i, s.Path, s.Tokens, want)
			}
		}
		if len(res.Val) != 1 || res.Val[0].Path != filepath.Join(out, "val_000000.bin") {
			t.Errorf("%s: validation shards %v, want one val_000000.bin", name, res.Val)
		}
		if left, _ := filepath.Glob(filepath.Join(out, ".*")); len(left) > 0 {
			t.Errorf("%s: temporary files left: %v", name, left)
		}
		back, err := LoadTokenizer(res.Tokenizer)
		if err != nil || back.Vocab() != tok.Vocab() {
			t.Fatalf("%s: tokenizer file reads back as %v (%v), want %d ids", name, back, err, tok.Vocab())
		}
		if ids, _ := back.Encode(corpus[:200]); !slices.Equal(ids, text.Train[:200]) {
			t.Errorf("%s: the tokenizer read back encodes differently", name)
		}

		m := &Model{Name: "gpt", Example: []int{16}, Classes: tok.Vocab(), Vocab: tok.Vocab(), Targets: 16}
		textSrc := must(Open(&Section{Config: "run.yaml", Dataset: "text", Corpus: texts, Tokenizer: name, ValFraction: 0.1, BatchSize: 8, MicroBatch: 4, Seed: 3}, m, OpenOptions{Inputs: true, Targets: true}))
		tokSrc := must(Open(&Section{Config: "run.yaml", Dataset: "tokens", BatchSize: 8, MicroBatch: 4, Seed: 3, Own: map[string]any{"train_shards": filepath.Join(out, "train_*.bin")}}, m, OpenOptions{Inputs: true, Targets: true}))
		for step := range 5 {
			for mb := range 2 {
				x1, x2 := make([]float32, 4*16), make([]float32, 4*16)
				y1, y2 := textSrc.Train(step, mb, Inputs{F32: x1}, true), tokSrc.Train(step, mb, Inputs{F32: x2}, true)
				if !slices.Equal(x1, x2) || !slices.Equal(y1, y2) {
					t.Fatalf("%s: step %d micro-batch %d: the shards' window differs from dataset text's", name, step, mb)
				}
			}
		}
		_, found, err := ShardTokenizer(&Section{Config: "run.yaml", Own: map[string]any{"train_shards": filepath.Join(out, "train_*.bin")}})
		if err != nil || found != res.Tokenizer {
			t.Errorf("%s: ShardTokenizer found %s, %v; want %s", name, found, err, res.Tokenizer)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestTokenizeBPEInPieces: read in pieces far smaller than the text, a BPE
// tokenizer's shards hold the ids of encoding each split whole; a
// vocabulary beyond 65536 ids gets uint32 shards (magic 20240801, version
// 7), and the tokenizer.json is copied beside them as given.
func TestTokenizeBPEInPieces(t *testing.T) {
	defer func(n int) { pieceBytes = n }(pieceBytes)
	pieceBytes = 37
	dir := t.TempDir()
	text := strings.Repeat(variedText+"it's\n'tis\n\n  x\n", 20) + "<|endoftext|>last line"
	in := writeText(t, dir, "in.txt", text)
	spec := tokenizerJSON(trainMerges(text, 80), "<|endoftext|>")
	specPath := filepath.Join(dir, "tokenizer.json")
	os.WriteFile(specPath, spec, 0o644)
	tok := must(ParseBPETokenizer(spec))

	res, err := Tokenize([]string{in}, TokenizeOptions{Tokenizer: specPath, Out: filepath.Join(dir, "whole"), ShardTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tok.Encode([]byte(text))
	if got := shardTokens(t, res.Train, "uint16"); !slices.Equal(got, want) {
		t.Errorf("read in pieces: %d tokens; encoded whole: %d", len(got), len(want))
	}
	if len(res.Val) != 0 || len(res.Train) < 2 {
		t.Errorf("%d training and %d validation shards, want several and none", len(res.Train), len(res.Val))
	}
	if got := must(os.ReadFile(res.Tokenizer)); !bytes.Equal(got, spec) {
		t.Errorf("%s is not the tokenizer.json given", res.Tokenizer)
	}

	res, err = Tokenize([]string{in}, TokenizeOptions{Tokenizer: specPath, Out: filepath.Join(dir, "split"), ValFraction: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	cut := len(text) - int(float64(len(text))*0.25)
	wantTrain, _ := tok.Encode([]byte(text[:cut]))
	wantVal, _ := tok.Encode([]byte(text[cut:]))
	if got := shardTokens(t, res.Train, "uint16"); !slices.Equal(got, wantTrain) {
		t.Errorf("training split: %d tokens, want %d", len(got), len(wantTrain))
	}
	if got := shardTokens(t, res.Val, "uint16"); !slices.Equal(got, wantVal) {
		t.Errorf("validation split: %d tokens, want %d", len(got), len(wantVal))
	}

	var big map[string]any
	json.Unmarshal(spec, &big)
	big["added_tokens"].([]any)[0].(map[string]any)["id"] = 70000
	bigSpec, _ := json.Marshal(big)
	os.WriteFile(specPath, bigSpec, 0o644)
	res, err = Tokenize([]string{in}, TokenizeOptions{Tokenizer: specPath, Out: filepath.Join(dir, "wide")})
	if err != nil {
		t.Fatal(err)
	}
	f := must(OpenTokenFile(res.Train[0].Path, "", ""))
	defer f.Close()
	if f.Format != FormatLLMC || f.DType != "uint32" || f.Version != 7 || res.Vocab != 70001 {
		t.Errorf("vocabulary %d: %s version %d %s, want llm.c version 7 uint32", res.Vocab, f.Format, f.Version, f.DType)
	}
	if lo, hi := f.MinMax(); hi != 70000 || lo < 0 {
		t.Errorf("token ids %d to %d, want the added token's 70000 among them", lo, hi)
	}
}

// TestTokenizeRefuses: a folder holding shards already (unless Force), a
// fraction out of range or that leaves no validation byte, no text, a
// missing file, a tokenizer not given or not readable.
func TestTokenizeRefuses(t *testing.T) {
	dir := t.TempDir()
	in := writeText(t, dir, "in.txt", "hello world\n")
	empty := writeText(t, dir, "empty.txt", "")
	out := filepath.Join(dir, "tok")
	if _, err := Tokenize([]string{in}, TokenizeOptions{Tokenizer: "byte", Out: out}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		inputs []string
		o      TokenizeOptions
		want   string
	}{
		{[]string{in}, TokenizeOptions{Tokenizer: "byte", Out: out}, "tok/train_000000.bin already (--force replaces it)"},
		{[]string{in}, TokenizeOptions{Tokenizer: "byte", Out: out, ValFraction: 1}, "validation fraction 1 out of range [0, 1)"},
		{[]string{in}, TokenizeOptions{Tokenizer: "byte", Out: out + "2", ValFraction: 0.01}, "is no byte; give more text or --val-fraction 0"},
		{[]string{empty}, TokenizeOptions{Tokenizer: "byte", Out: out}, "empty.txt: no text (0 bytes)"},
		{[]string{filepath.Join(dir, "nope.txt")}, TokenizeOptions{Tokenizer: "byte", Out: out}, "nope.txt: no such file"},
		{[]string{in}, TokenizeOptions{Out: out}, "no tokenizer given"},
		{[]string{in}, TokenizeOptions{Tokenizer: filepath.Join(dir, "missing.json"), Out: out}, "missing.json: no such file"},
		{[]string{in}, TokenizeOptions{Tokenizer: "byte", Out: out, ShardTokens: -1}, "shard tokens -1 out of range"},
	} {
		if _, err := Tokenize(c.inputs, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %+v: err = %v, want one containing %q", c.inputs, c.o, err, c.want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out+"2", "*")); len(left) > 0 {
		t.Errorf("a refused tokenization left %v", left)
	}
	res, err := Tokenize([]string{in, in}, TokenizeOptions{Tokenizer: "byte", Out: out, Force: true})
	if err != nil || res.Train[0].Tokens != 24 {
		t.Errorf("--force over a tokenized folder: %v, %v", res, err)
	}
	if _, _, err := ShardTokenizer(&Section{Config: "run.yaml", Own: map[string]any{"train_shards": in}}); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "no tokenizer.json beside") {
		t.Errorf("shards without a tokenizer file: %v", err)
	}
}

// TestTokenizeProgress: the bar is drawn for an input at least as large as
// ProgressFrom, a line per tenth (or redrawn in place when live), and not
// at all for a smaller one.
func TestTokenizeProgress(t *testing.T) {
	defer func(n int) { pieceBytes = n }(pieceBytes)
	pieceBytes = 100
	dir := t.TempDir()
	in := writeText(t, dir, "in.txt", strings.Repeat("x", 1000))
	var lines, live, quiet bytes.Buffer
	Tokenize([]string{in}, TokenizeOptions{Tokenizer: "byte", Out: filepath.Join(dir, "a"), Progress: &lines, ProgressFrom: 1000})
	Tokenize([]string{in}, TokenizeOptions{Tokenizer: "byte", Out: filepath.Join(dir, "b"), Progress: &live, ProgressFrom: 1000, Live: true})
	Tokenize([]string{in}, TokenizeOptions{Tokenizer: "byte", Out: filepath.Join(dir, "c"), Progress: &quiet, ProgressFrom: 1001})
	got := strings.Split(strings.TrimSpace(lines.String()), "\n")
	if len(got) != 10 || got[9] != "tokenizing [####################] 100% 0.0 MiB of 0.0 MiB" || !strings.Contains(got[0], " 10% ") {
		t.Errorf("progress lines:\n%s", lines.String())
	}
	if n := strings.Count(live.String(), "\r"); n != 10 || strings.Count(live.String(), "\n") != 1 {
		t.Errorf("live bar redrawn %d times, with %d newlines: %q", n, strings.Count(live.String(), "\n"), live.String())
	}
	if quiet.Len() != 0 {
		t.Errorf("a smaller input drew %q", quiet.String())
	}
}
