package generate

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
)

// TestPick: temperature 0 takes the most likely token; above it, a seeded
// draw repeats and follows the distribution.
func TestPick(t *testing.T) {
	logits := []float64{0.1, 2.5, -1, 2.4}
	if got := pick(logits, 0, rand.New(rand.NewPCG(1, 1))); got != 1 {
		t.Errorf("temperature 0 picked %d, want 1", got)
	}
	draw := func(seed uint64) []int {
		rng := rand.New(rand.NewPCG(seed, 2))
		var out []int
		for range 200 {
			out = append(out, pick(logits, 1, rng))
		}
		return out
	}
	a, b := draw(7), draw(7)
	counts := map[int]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("the same seed drew %d and %d at %d", a[i], b[i], i)
		}
		counts[a[i]]++
	}
	if counts[1]+counts[3] < 150 || counts[2] > 10 {
		t.Errorf("draws %v do not follow the logits %v", counts, logits)
	}
}

// TestPromptRefusedByCharacter: a prompt character the corpus lacks is
// named as the character at its position, not as its first UTF-8 byte.
func TestPromptRefusedByCharacter(t *testing.T) {
	tok, err := data.NewCharTokenizer([]byte("func Index(s string) int"))
	if err != nil {
		t.Fatal(err)
	}
	g := &Generator{tok: tok}
	_, err = g.Generate([]byte("func é"), 5, 0, 1)
	want := "prompt: data: character 'é' at position 5 is not in the character vocabulary"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

// TestTokenizerOfTokenShards: after data tokenize, a tokens run's sampler
// decodes with the tokenizer recorded beside its training shards; --tokenizer
// overrides it; shards without one are refused, naming the flag.
func TestTokenizerOfTokenShards(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("once upon a time, a cat.\n", 200)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := data.Tokenize([]string{text}, data.TokenizeOptions{Tokenizer: "char", Out: filepath.Join(dir, "tok"), ValFraction: 0.1}); err != nil {
		t.Fatal(err)
	}
	config := func(shards string) *configs.Config {
		yaml := "model: {name: gpt, vocab: 64, context: 8, width: 16, heads: 2, layers: 1}\n" +
			"data: {dataset: tokens, train_shards: \"" + shards + "\", batch_size: 4, micro_batches: 2}\n" +
			"train: {steps: 1, evaluate: false}\nschedule: gpipe\nstages:\n  - {layers: \"0-1\", address: 127.0.0.1:7000}\n  - {layers: \"2\", address: 127.0.0.1:7001}\n"
		path := filepath.Join(dir, "run.yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := configs.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := config("tok/train_*.bin")
	tok, err := Tokenizer(c, "")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := data.NewCharTokenizer([]byte("once upon a time, a cat.\n"))
	ids, err := tok.Encode([]byte("a cat"))
	wantIDs, _ := want.Encode([]byte("a cat"))
	if err != nil || tok.Vocab() != want.Vocab() || !slices.Equal(ids, wantIDs) {
		t.Errorf("the shards' tokenizer: %d ids, encodes \"a cat\" as %v (%v); want the text's char tokenizer, %d ids, %v", tok.Vocab(), ids, err, want.Vocab(), wantIDs)
	}
	if tok, err := Tokenizer(c, "byte"); err != nil || tok.Vocab() != 256 {
		t.Errorf("--tokenizer byte: %v, %v", tok, err)
	}
	os.Remove(filepath.Join(dir, "tok", data.TokenizerFile))
	if _, err := Tokenizer(c, ""); err == nil || !strings.Contains(err.Error(), "no tokenizer.json beside") || !strings.Contains(err.Error(), "give --tokenizer") {
		t.Errorf("shards without a tokenizer: %v", err)
	}
}
