package data

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestByteTokenizer(t *testing.T) {
	var tok ByteTokenizer
	text := []byte("héllo\x00\xff")
	ids, err := tok.Encode(text)
	if err != nil || len(ids) != len(text) || ids[len(ids)-1] != 255 {
		t.Fatalf("Encode: %v, %v", ids, err)
	}
	back, err := tok.Decode(ids)
	if err != nil || string(back) != string(text) {
		t.Fatalf("Decode: %q, %v", back, err)
	}
	if _, err := tok.Decode([]int32{1, 256}); err == nil || !strings.Contains(err.Error(), "token id 256 at position 1") {
		t.Errorf("bad id: %v", err)
	}
	if tok.Vocab() != 256 {
		t.Errorf("Vocab %d", tok.Vocab())
	}
}

func TestCharTokenizer(t *testing.T) {
	tok, err := NewCharTokenizer([]byte("banana bread"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(tok.Symbols()); got != " abdenr" || tok.Vocab() != 7 {
		t.Fatalf("symbols %q, vocab %d", got, tok.Vocab())
	}
	ids, err := tok.Encode([]byte("bread"))
	if err != nil || !slices.Equal(ids, []int32{2, 6, 4, 1, 3}) {
		t.Fatalf("Encode: %v, %v", ids, err)
	}
	back, err := tok.Decode(ids)
	if err != nil || string(back) != "bread" {
		t.Fatalf("Decode: %q, %v", back, err)
	}
	if _, err := tok.Encode([]byte("bax")); err == nil || !strings.Contains(err.Error(), `character 'x' at position 2`) {
		t.Errorf("unknown byte: %v", err)
	}
	if _, err := tok.Decode([]int32{7}); err == nil || !strings.Contains(err.Error(), "outside the vocabulary [0, 7)") {
		t.Errorf("bad id: %v", err)
	}
	if _, err := NewCharTokenizer([]byte("aaaa")); err == nil || !strings.Contains(err.Error(), "1 distinct bytes") {
		t.Errorf("one symbol: %v", err)
	}
}

// writeTree creates files (path -> content) under a new temporary directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadCorpus(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"a.go": "A", "a/b.go": "B", "a/z.txt": "Z", "sub/c.go": "CC", "d.go.txt": "D",
	})
	for _, c := range []struct {
		glob string
		max  int64
		want string
	}{
		{"*.go", 0, "ABCC"}, // whole-path order: "a.go" < "a/b.go" < "sub/c.go"
		{"*.go", 3, "ABC"},  // the cap cuts the last file
		{"*.go", 2, "AB"},
		{"", 0, "ABZDCC"},
		{"*.txt", 0, "ZD"},
	} {
		got, err := LoadCorpus(dir, c.glob, c.max)
		if err != nil || string(got) != c.want {
			t.Errorf("glob %q max %d: %q, %v; want %q", c.glob, c.max, got, err, c.want)
		}
	}
	if got, err := LoadCorpus(filepath.Join(dir, "sub/c.go"), "*.txt", 0); err != nil || string(got) != "CC" {
		t.Errorf("single file (pattern ignored): %q, %v", got, err)
	}
	errs := []struct {
		path, glob, want string
	}{
		{dir, "*.rs", "has no files matching"},
		{dir, "[", "file pattern"},
		{filepath.Join(dir, "nope"), "", "no such file"},
		{writeTree(t, map[string]string{"e.go": ""}), "*.go", "is empty"},
	}
	for _, e := range errs {
		if _, err := LoadCorpus(e.path, e.glob, 0); err == nil || !strings.Contains(err.Error(), e.want) {
			t.Errorf("%s %q: error %v, want %q", e.path, e.glob, err, e.want)
		}
	}
}

func TestNewText(t *testing.T) {
	corpus := []byte(strings.Repeat("0123456789", 10))
	text, err := NewText(corpus, ByteTokenizer{}, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	if len(text.Train) != 90 || len(text.Val) != 10 || text.Val[0] != '0' || text.Train[89] != '9' {
		t.Errorf("train %d tokens, val %d (first %d)", len(text.Train), len(text.Val), text.Val[0])
	}
	if text, _ := NewText(corpus, ByteTokenizer{}, 0); len(text.Val) != 0 || len(text.Train) != 100 {
		t.Errorf("no validation: %d/%d", len(text.Train), len(text.Val))
	}
	for _, f := range []float64{-0.1, 1} {
		if _, err := NewText(corpus, ByteTokenizer{}, f); err == nil {
			t.Errorf("fraction %v: no error", f)
		}
	}
	tok, _ := NewCharTokenizer([]byte("ab"))
	if _, err := NewText([]byte("abc"), tok, 0.1); err == nil {
		t.Error("unencodable corpus: no error")
	}
}

func TestTextSampler(t *testing.T) {
	const n, context, batch = 50, 8, 6
	for _, bad := range [][3]int{{8, 8, 1}, {50, 0, 1}, {50, 8, 0}} {
		if _, err := NewTextSampler(1, bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("n %d context %d batch %d: no error", bad[0], bad[1], bad[2])
		}
	}
	a, _ := NewTextSampler(42, n, context, batch)
	b, _ := NewTextSampler(42, n, context, batch)
	other, _ := NewTextSampler(43, n, context, batch)
	steps := make([][]int, 40)
	seen := map[int]bool{}
	for step := range steps {
		steps[step] = a.Starts(step)
		if len(steps[step]) != batch {
			t.Fatalf("step %d: %d windows", step, len(steps[step]))
		}
		for _, s := range steps[step] {
			if s < 0 || s+context+1 > n {
				t.Fatalf("step %d: window at %d overruns %d tokens", step, s, n)
			}
			seen[s] = true
		}
	}
	// A fresh sampler visiting steps out of order agrees; another seed does not.
	for _, step := range []int{31, 0, 7, 39} {
		if got := b.Starts(step); !slices.Equal(got, steps[step]) {
			t.Errorf("step %d: %v, first sampler %v", step, got, steps[step])
		}
	}
	if slices.Equal(other.Starts(0), steps[0]) && slices.Equal(other.Starts(1), steps[1]) {
		t.Error("seeds 42 and 43 give the same windows")
	}
	if slices.Equal(steps[0], steps[1]) {
		t.Error("steps 0 and 1 give the same windows")
	}
	if len(seen) != n-context {
		t.Errorf("240 draws hit %d of %d possible starts", len(seen), n-context)
	}
}

func TestValidationBatches(t *testing.T) {
	got, err := ValidationBatches(25, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 4}, {8, 12}, {16, 20}} // window 20 ends at token 24, the last
	if !slices.EqualFunc(got, want, slices.Equal[[]int]) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, _ := ValidationBatches(24, 4, 2); len(got) != 2 {
		t.Errorf("24 tokens: %v, want two batches (5 windows, the fifth dropped)", got)
	}
	for _, bad := range [][3]int{{8, 4, 2}, {4, 4, 1}, {25, 0, 1}, {25, 4, 0}} {
		if _, err := ValidationBatches(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestGatherWindows(t *testing.T) {
	tokens := []int32{10, 11, 12, 13, 14, 15}
	x := make([]float32, 6)
	y := make([]int, 6)
	GatherWindows(tokens, []int{2, 0}, 3, x, y)
	if !slices.Equal(x, []float32{12, 13, 14, 10, 11, 12}) || !slices.Equal(y, []int{13, 14, 15, 11, 12, 13}) {
		t.Errorf("x %v y %v", x, y)
	}
}

// TestGoSourceCorpus loads the default corpus, the strings package of the Go
// standard library: every Go toolchain that can run this test ships its sources.
func TestGoSourceCorpus(t *testing.T) {
	dir, err := GoSourceDir("strings")
	if err != nil {
		t.Fatal(err)
	}
	corpus, err := LoadCorpus(dir, "*.go", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewCharTokenizer(corpus)
	if err != nil {
		t.Fatal(err)
	}
	text, err := NewText(corpus, tok, 0.1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d bytes, %d symbols, %d training and %d validation tokens", dir, len(corpus), tok.Vocab(), len(text.Train), len(text.Val))
	if len(corpus) < 10000 || tok.Vocab() < 50 {
		t.Errorf("suspiciously small corpus: %d bytes, %d symbols", len(corpus), tok.Vocab())
	}
}
