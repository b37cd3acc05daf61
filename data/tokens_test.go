package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// someTokens is n token ids below vocab, varied enough that a reader taking
// the wrong width or offset reads other values.
func someTokens(n int, vocab int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i*7919+13) % vocab
	}
	return out
}

// appendInts appends tokens as little-endian integers of width bytes.
func appendInts(b []byte, tokens []int64, width int) []byte {
	for _, v := range tokens {
		switch width {
		case 1:
			b = append(b, byte(v))
		case 2:
			b = binary.LittleEndian.AppendUint16(b, uint16(v))
		case 4:
			b = binary.LittleEndian.AppendUint32(b, uint32(v))
		default:
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	}
	return b
}

// llmcBytes is an llm.c shard: the 1024-byte header, then the tokens.
func llmcBytes(magic, version, count int32, tokens []int64, width int) []byte {
	h := make([]byte, 1024)
	binary.LittleEndian.PutUint32(h[0:], uint32(magic))
	binary.LittleEndian.PutUint32(h[4:], uint32(version))
	binary.LittleEndian.PutUint32(h[8:], uint32(count))
	return appendInts(h, tokens, width)
}

// megatronIndex is a Megatron .idx of uint16 (code 8) sequences of the given
// lengths, documents ending after the sequences in docEnds.
func megatronIndex(code byte, width int, lengths []int, docEnds []int) []byte {
	b := append([]byte(nil), megatronMagic...)
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = append(b, code)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(lengths)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(docEnds)+1))
	for _, n := range lengths {
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
	}
	p := 0
	for _, n := range lengths {
		b = binary.LittleEndian.AppendUint64(b, uint64(p))
		p += n * width
	}
	b = binary.LittleEndian.AppendUint64(b, 0)
	for _, d := range docEnds {
		b = binary.LittleEndian.AppendUint64(b, uint64(d))
	}
	return b
}

func writeFile(t *testing.T, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// readAll reads every token of f.
func readAll(f *TokenFile) []int64 {
	out := make([]int64, f.Tokens)
	for i := range out {
		out[i] = f.At(int64(i))
	}
	return out
}

// TestTokenFilesWrittenInGo: each format, written byte by byte as its
// writers do, is recognised from its magic or extension and reads back the
// tokens written, with its dtype, header version and document count.
func TestTokenFilesWrittenInGo(t *testing.T) {
	dir := t.TempDir()
	gpt2 := someTokens(1000, 50257)
	llama := someTokens(700, 128256)
	npy := []byte("\x93NUMPY\x01\x00")
	head := "{'descr': '<i4', 'fortran_order': False, 'shape': (300,), }"
	head += strings.Repeat(" ", 64-(10+len(head)+1)%64) + "\n"
	npy = binary.LittleEndian.AppendUint16(npy, uint16(len(head)))
	npy = appendInts(append(npy, head...), gpt2[:300], 4)
	writeFile(t, filepath.Join(dir, "m.bin"), appendInts(nil, gpt2[:600], 2))
	writeFile(t, filepath.Join(dir, "m.idx"), megatronIndex(8, 2, []int{100, 250, 250}, []int{1, 3}))
	for _, c := range []struct {
		name, format, dtype string
		data                []byte
		want                []int64
		wantFormat          string
		wantDType           string
		version, docs       int64
	}{
		{"gpt2.bin", "", "", llmcBytes(20240520, 1, 1000, gpt2, 2), gpt2, FormatLLMC, "uint16", 1, -1},
		{"llama3.bin", "auto", "", llmcBytes(20240801, 7, 700, llama, 4), llama, FormatLLMC, "uint32", 7, -1},
		{"train.bin", "", "", appendInts(nil, gpt2, 2), gpt2, FormatNanoGPT, "uint16", 0, -1},
		{"wide.bin", "", "uint32", appendInts(nil, llama, 4), llama, FormatNanoGPT, "uint32", 0, -1},
		{"tokens.npy", "", "", npy, gpt2[:300], FormatNPY, "int32", 0, -1},
		{"m.idx", "", "", nil, gpt2[:600], FormatMegatron, "uint16", 1, 2},
	} {
		path := filepath.Join(dir, c.name)
		if c.data != nil {
			writeFile(t, path, c.data)
		}
		f, err := OpenTokenFile(path, c.format, c.dtype)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if f.Format != c.wantFormat || f.DType != c.wantDType || f.Version != c.version || f.Documents != c.docs || f.Tokens != int64(len(c.want)) {
			t.Errorf("%s: format %s, dtype %s, version %d, documents %d, %d tokens; want %s, %s, %d, %d, %d", c.name, f.Format, f.DType, f.Version, f.Documents, f.Tokens, c.wantFormat, c.wantDType, c.version, c.docs, len(c.want))
		}
		if got := readAll(f); !slices.Equal(got, c.want) {
			t.Errorf("%s: read back other tokens than written (first %v, want %v)", c.name, got[:5], c.want[:5])
		}
		f.Close()
	}
}

// TestTokenFilesWrittenByNumPy: shards written as llm.c, nanoGPT and
// Megatron's writers write them, with NumPy, read back the same tokens.
func TestTokenFilesWrittenByNumPy(t *testing.T) {
	testenv.NeedPython(t, "numpy", "python3-numpy")
	python := testenv.Python
	dir := t.TempDir()
	script := `
import struct, sys
import numpy as np
d = sys.argv[1]
def toks(n, vocab):
    return (np.arange(n, dtype=np.int64) * 7919 + 13) % vocab
def llmc(path, magic, version, tokens, dtype):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(dtype).tobytes())
llmc(d + "/fineweb_val_000000.bin", 20240520, 1, toks(5000, 50257), np.uint16)
llmc(d + "/llama3_000000.bin", 20240801, 7, toks(3000, 128256), np.uint32)
toks(4000, 50257).astype(np.uint16).tofile(d + "/train.bin")
np.save(d + "/tokens.npy", toks(2000, 50257).astype(np.uint32))
# Megatron's _IndexWriter: three documents of one, two and one sequences.
lengths = [500, 700, 300, 1500]
tokens = toks(sum(lengths), 32000).astype(np.int32)
tokens.tofile(d + "/corpus_text_document.bin")
with open(d + "/corpus_text_document.idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", 4))
    f.write(struct.pack("<Q", len(lengths)))
    doc_idx = [0, 1, 3, 4]
    f.write(struct.pack("<Q", len(doc_idx)))
    f.write(np.array(lengths, dtype=np.int32).tobytes())
    f.write(np.array(np.cumsum([0] + lengths[:-1]) * 4, dtype=np.int64).tobytes())
    f.write(np.array(doc_idx, dtype=np.int64).tobytes())
`
	if out, err := exec.Command(python, "-c", script, dir).CombinedOutput(); err != nil {
		t.Fatalf("writing token files with NumPy: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name           string
		n              int
		vocab          int64
		format, dtype  string
		docs           int64
		wantF, wantTyp string
	}{
		{"fineweb_val_000000.bin", 5000, 50257, "", "", -1, FormatLLMC, "uint16"},
		{"llama3_000000.bin", 3000, 128256, "", "", -1, FormatLLMC, "uint32"},
		{"train.bin", 4000, 50257, "nanogpt", "", -1, FormatNanoGPT, "uint16"},
		{"tokens.npy", 2000, 50257, "", "", -1, FormatNPY, "uint32"},
		{"corpus_text_document", 3000, 32000, "megatron", "", 3, FormatMegatron, "int32"},
		{"corpus_text_document", 3000, 32000, "", "", 3, FormatMegatron, "int32"},
	} {
		f, err := OpenTokenFile(filepath.Join(dir, c.name), c.format, c.dtype)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if f.Format != c.wantF || f.DType != c.wantTyp || f.Documents != c.docs {
			t.Errorf("%s: format %s, dtype %s, documents %d; want %s, %s, %d", c.name, f.Format, f.DType, f.Documents, c.wantF, c.wantTyp, c.docs)
		}
		if got, want := readAll(f), someTokens(c.n, c.vocab); !slices.Equal(got, want) {
			t.Errorf("%s: %d tokens read back differ from the %d NumPy wrote", c.name, len(got), len(want))
		}
		f.Close()
	}
}

// TestTokenFilesRefused: a bad magic, a file shorter or longer than its
// header says, a Megatron pair with a gap or no index, and a missing shard
// are refused naming the file; a token beyond the vocabulary names the file
// and the token's offset.
func TestTokenFilesRefused(t *testing.T) {
	dir := t.TempDir()
	tokens := someTokens(100, 256)
	path := func(name string) string { return filepath.Join(dir, name) }
	for _, c := range []struct {
		name, format string
		data         []byte
		want         string
	}{
		{"magic.bin", "llm.c", llmcBytes(20240521, 1, 100, tokens, 2), "bad magic 20240521: llm.c shards start with 20240520"},
		{"short.bin", "", llmcBytes(20240520, 1, 101, tokens, 2), "file too short: the header says 101 tokens (202 bytes after offset 1024), the file holds 200 bytes there"},
		{"long.bin", "", llmcBytes(20240801, 7, 99, tokens, 4), "file too long: the header says 99 tokens"},
		{"tiny.bin", "llm.c", make([]byte, 100), "100 bytes, shorter than llm.c's 1024-byte header"},
		{"odd.bin", "", make([]byte, 7), "file too short: 7 bytes is not a whole number of 2-byte uint16 tokens"},
	} {
		writeFile(t, path(c.name), c.data)
		_, err := OpenTokenFile(path(c.name), c.format, "")
		if err == nil || !strings.Contains(err.Error(), "data: "+path(c.name)+": "+c.want) || !errors.Is(err, ErrBadData) {
			t.Errorf("%s: err = %v\nwant bad data naming the file: %s", c.name, err, c.want)
		}
	}

	// Megatron: .bin shorter than the index says; a pointer leaving a gap;
	// a .bin whose .idx is missing.
	writeFile(t, path("m.bin"), appendInts(nil, tokens[:90], 2))
	writeFile(t, path("m.idx"), megatronIndex(8, 2, []int{50, 50}, []int{2}))
	if _, err := OpenTokenFile(path("m.bin"), "", ""); err == nil || !strings.Contains(err.Error(), path("m.bin")+": file too short: the index m.idx says 100 tokens") {
		t.Errorf("short Megatron .bin: err = %v", err)
	}
	idx := megatronIndex(8, 2, []int{40, 50}, []int{2})
	binary.LittleEndian.PutUint64(idx[34+8+8:], 82) // the second pointer, 2 bytes past the first sequence
	writeFile(t, path("m.idx"), idx)
	if _, err := OpenTokenFile(path("m.bin"), "", ""); err == nil || !strings.Contains(err.Error(), path("m.idx")+": sequence 1: length 50 at byte 82") {
		t.Errorf("Megatron gap: err = %v", err)
	}
	os.Remove(path("m.idx"))
	if _, err := OpenTokenFile(path("m.bin"), "megatron", ""); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path("m.idx")) {
		t.Errorf("Megatron without .idx: err = %v, want one wrapping fs.ErrNotExist naming m.idx", err)
	}

	// A missing shard, given by name or matched by no file.
	s := &Section{Config: "run.yaml", Resolve: func(p string) string { return filepath.Join(dir, p) }}
	if _, err := shardPaths(s, "fineweb_*.bin"); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path("fineweb_*.bin")) {
		t.Errorf("glob matching nothing: err = %v", err)
	}
	if _, err := OpenTokenStream([]string{path("odd.bin"), path("gone.bin")}, "nanogpt", "uint8"); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path("gone.bin")) {
		t.Errorf("missing shard: err = %v", err)
	}

	// Token 70 of the second file is 300, beyond a byte vocabulary: read
	// as the stream's token 170, it is named by file and offset.
	bad := slices.Clone(tokens)
	bad[70] = 300
	writeFile(t, path("a.bin"), llmcBytes(20240520, 1, 100, tokens, 2))
	writeFile(t, path("b.bin"), llmcBytes(20240520, 1, 100, bad, 2))
	stream, err := OpenTokenStream([]string{path("a.bin"), path("b.bin")}, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	want := "data: " + path("b.bin") + ": token id 300 at token 70 (byte offset 1164) is not in model.vocab's [0, 256)"
	if err := stream.Read(150, make([]int32, 30), 256); err == nil || err.Error() != want || !errors.Is(err, ErrBadData) {
		t.Errorf("out-of-vocabulary read: err = %v\nwant %s", err, want)
	}
	if err := stream.Read(150, make([]int32, 20), 256); err != nil {
		t.Errorf("window before the bad token: %v", err)
	}
	if err := stream.CheckSample(256); err == nil || err.Error() != want {
		t.Errorf("sample of a small file: err = %v\nwant %s", err, want)
	}
	if err := stream.CheckSample(301); err != nil {
		t.Errorf("vocab 301: %v", err)
	}
}

// tokenConfig writes a training and a validation nanoGPT file of byte
// tokens into dir and returns a section reading them.
func tokenConfig(t *testing.T, dir string, train, val []int64, microBatch, batch int) *Section {
	writeFile(t, filepath.Join(dir, "train_000.bin"), llmcBytes(20240520, 1, int32(len(train)/2), train[:len(train)/2], 2))
	writeFile(t, filepath.Join(dir, "train_001.bin"), llmcBytes(20240520, 1, int32(len(train)-len(train)/2), train[len(train)/2:], 2))
	writeFile(t, filepath.Join(dir, "val.bin"), appendInts(nil, val, 2))
	return &Section{
		Config: "run.yaml", Dataset: "tokens", BatchSize: batch, MicroBatch: microBatch, Seed: 5, Evaluate: true,
		Resolve: func(p string) string { return filepath.Join(dir, p) },
		Own:     map[string]any{"train_shards": "train_*.bin", "val_shards": "val.bin"},
	}
}

// TestTokenWindowsAgree: a step's windows are a pure function of (seed,
// step, micro-batch): the reference's one micro-batch of 8 windows is the
// pipeline's four micro-batches of 2 (two replicas' two, the second
// replica's numbered after the first's), each window context+1 consecutive
// tokens of the shards read as one stream, targets shifted by one; other
// steps draw other windows.
func TestTokenWindowsAgree(t *testing.T) {
	const T = 6
	train, val := someTokens(400, 256), someTokens(50, 256)
	stream := append(slices.Clone(train), 0) // the stream, for finding windows
	m := &Model{Name: "gpt", Example: []int{T}, Classes: 256, Vocab: 256, Targets: T}
	whole, err := Open(tokenConfig(t, t.TempDir(), train, val, 8, 8), m, OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	split, err := Open(tokenConfig(t, t.TempDir(), train, val, 2, 8), m, OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 8*T)
	y := whole.Train(3, 0, Inputs{F32: x}, true)
	for mb := range 4 {
		xs := make([]float64, 2*T)
		ys := split.Train(3, mb, Inputs{F64: xs}, true)
		for i := range xs {
			if float32(xs[i]) != x[mb*2*T+i] || ys[i] != y[mb*2*T+i] {
				t.Fatalf("micro-batch %d of 2 differs from the same rows of one micro-batch of 8", mb)
			}
		}
	}
	for w := range 8 {
		window := make([]int64, T+1)
		for j := range T {
			window[j] = int64(x[w*T+j])
		}
		window[T] = int64(y[w*T+T-1])
		for j := range T - 1 {
			if y[w*T+j] != int(x[w*T+j+1]) {
				t.Fatalf("window %d: target %d is not the next input", w, j)
			}
		}
		found := false
		for s := range len(train) - T {
			found = found || slices.Equal(stream[s:s+T+1], window)
		}
		if !found {
			t.Errorf("window %d, %v, is no run of context+1 tokens of the shards", w, window)
		}
	}
	again := make([]float32, 8*T)
	whole.Train(3, 0, Inputs{F32: again}, false)
	other := make([]float32, 8*T)
	whole.Train(4, 0, Inputs{F32: other}, false)
	if !slices.Equal(again, x) || slices.Equal(other, x) {
		t.Errorf("step 3 twice differs, or step 4 equals step 3")
	}
}

// TestTokenEvalWindows: evaluation cuts the validation tokens into
// consecutive windows, window i being tokens [i·T, i·T+T]; the last partial
// window is dropped and the last micro-batch padded, its padding rows
// neither inputs nor scored.
func TestTokenEvalWindows(t *testing.T) {
	const T = 4
	val := someTokens(23, 256) // (23-1)/4 = 5 windows: tokens 0-4, 4-8, ..., 16-20
	m := &Model{Name: "gpt", Example: []int{T}, Classes: 256, Vocab: 256, Targets: T}
	src, err := Open(tokenConfig(t, t.TempDir(), someTokens(100, 256), val, 2, 2), m, OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := src.EvalBatches(); n != 3 {
		t.Fatalf("EvalBatches() = %d, want 3 (5 windows in micro-batches of 2)", n)
	}
	var inputs []int64
	var targets []int
	for k := range 3 {
		x := make([]float32, 2*T)
		for i := range x {
			x[i] = -1
		}
		y, rows := src.Eval(k, Inputs{F32: x}, true)
		if want := min(2, 5-2*k) * T; rows != want || len(y) != 2*T {
			t.Fatalf("micro-batch %d: %d rows of %d targets, want %d of %d", k, rows, len(y), want, 2*T)
		}
		for i := range rows {
			inputs = append(inputs, int64(x[i]))
		}
		if slices.ContainsFunc(x[rows:], func(v float32) bool { return v != 0 }) {
			t.Errorf("micro-batch %d: padding rows %v not zero", k, x[rows:])
		}
		targets = append(targets, y[:rows]...)
	}
	var wantIn []int64
	var wantY []int
	for i := range 5 {
		wantIn = append(wantIn, val[i*T:i*T+T]...)
		for _, v := range val[i*T+1 : i*T+T+1] {
			wantY = append(wantY, int(v))
		}
	}
	if !slices.Equal(inputs, wantIn) || !slices.Equal(targets, wantY) {
		t.Errorf("evaluation windows\n inputs %v\n want   %v\n targets %v\n want    %v", inputs, wantIn, targets, wantY)
	}
}

// TestTokensKindChecks: Validate names the keys a tokens config lacks or
// gets wrong; Check refuses, by config key and file, a token beyond the
// vocabulary in its sample, validation tokens too few for a window, and a
// missing shard, before any stage starts.
func TestTokensKindChecks(t *testing.T) {
	k, ok := Lookup("tokens")
	if !ok {
		t.Fatal("dataset kind tokens is not registered")
	}
	var problems []string
	problem := func(key, format string, args ...any) {
		problems = append(problems, key+": "+fmt.Sprintf(format, args...))
	}
	k.Validate(&Section{Evaluate: true, Own: map[string]any{"token_format": "csv", "token_dtype": 16}}, &Model{Name: "mlp", Targets: 1}, problem)
	for _, want := range []string{
		"data.token_dtype: is a number, want a string",
		"data.train_shards: missing",
		"data.val_shards: missing",
		`data.token_format: unknown format "csv"`,
		"data.dataset: tokens trains language models; model mlp is a classifier",
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, want) }) {
			t.Errorf("problems %q lack %q", problems, want)
		}
	}

	dir := t.TempDir()
	m := &Model{Name: "gpt", Example: []int{8}, Classes: 256, Vocab: 256, Targets: 8}
	s := tokenConfig(t, dir, someTokens(100, 256), someTokens(50, 256), 2, 2)
	if err := k.Check(s, m); err != nil {
		t.Fatalf("good shards refused: %v", err)
	}
	small := *m
	small.Classes, small.Vocab = 200, 200
	if err := k.Check(s, &small); err == nil || !errors.Is(err, ErrBadData) || !strings.HasPrefix(err.Error(), "run.yaml: data.train_shards: data: "+filepath.Join(dir, "train_000.bin")+": token id 252 at token 1 (byte offset 1026)") {
		t.Errorf("vocab 200: err = %v", err)
	}
	writeFile(t, filepath.Join(dir, "val.bin"), appendInts(nil, someTokens(8, 256), 2))
	if err := k.Check(s, m); err == nil || !errors.Is(err, ErrBadData) || err.Error() != "run.yaml: data.val_shards: val.bin holds 8 tokens, fewer than one window of context+1 = 9" {
		t.Errorf("short validation: err = %v", err)
	}
	s.Evaluate = false
	if err := k.Check(s, m); err != nil {
		t.Errorf("a run that does not evaluate reads no validation tokens: %v", err)
	}
	os.Remove(filepath.Join(dir, "train_000.bin"))
	os.Remove(filepath.Join(dir, "train_001.bin"))
	if err := k.Check(s, m); !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "run.yaml: data.train_shards: data: no file matches") {
		t.Errorf("no shards: err = %v", err)
	}
}

// TestCatchBadData: a panic carrying bad data becomes the deferring
// function's error, which a restart would meet again; any other panic goes
// on.
func TestCatchBadData(t *testing.T) {
	read := func(v any) (err error) {
		defer CatchBadData(&err)
		panic(v)
	}
	bad := BadData(errors.New("data: a.bin: token id 300 at token 7"))
	if err := read(bad); err != bad || !errors.Is(err, ErrBadData) {
		t.Errorf("err = %v, want the panic's bad-data error", err)
	}
	defer func() {
		if r := recover(); r != "index out of range" {
			t.Errorf("recovered %v, want the other panic to go on", r)
		}
	}()
	read("index out of range")
	t.Error("a panic of something other than bad data was swallowed")
}

// TestTokenFilesReadInPlace: a 1 GiB shard (sparse, its tokens 0) is
// checked, opened and trained from with the Go heap growing by less than a
// MiB: its header is read, a sample of it checked and its windows read in
// place from the mapping, never the file into memory.
func TestTokenFilesReadInPlace(t *testing.T) {
	const n = 1 << 29 // uint16 tokens: 1 GiB
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(llmcBytes(20240520, 1, n, nil, 2)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1024 + 2*n); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s := &Section{Config: "run.yaml", Dataset: "tokens", BatchSize: 32, MicroBatch: 8, Seed: 1,
		Resolve: func(p string) string { return filepath.Join(dir, p) }, Own: map[string]any{"train_shards": "big.bin"}}
	m := &Model{Name: "gpt", Example: []int{256}, Classes: 50257, Vocab: 50257, Targets: 256}
	x := make([]float32, 8*256)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	if err := (tokensKind{}).Check(s, m); err != nil {
		t.Fatal(err)
	}
	src, err := Open(s, m, OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	for step := range 50 {
		for mb := range 4 {
			src.Train(step, mb, Inputs{F32: x}, true)
		}
	}
	grew := int64(heap()) - int64(before)
	if grew > 1<<20 {
		t.Errorf("the heap grew by %d bytes reading a 1 GiB shard", grew)
	}
	t.Logf("heap grew by %d bytes", grew)
	runtime.KeepAlive(src)
}
