package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSampleAfterTokenizedRun: text tokenized by data tokenize trains a GPT
// as dataset tokens, and pipetrain sample decodes with the tokenizer
// recorded beside the shards, drawing only ids the tokenizer has from a
// model whose vocabulary is padded beyond them.
func TestSampleAfterTokenizedRun(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "story.txt")
	story := strings.Repeat("the cat sat on the mat; the dog ate the log.\n", 400)
	if err := os.WriteFile(text, []byte(story), 0o644); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "tok")
	res := run(t, time.Minute, nil, "data", "tokenize", "--tokenizer", "char", "--out", tok, "--shard-tokens", "8000", text)
	if res.err != nil {
		t.Fatalf("data tokenize: %v\n%s", res.err, res.out)
	}
	for _, want := range []string{"tok/train_000000.bin: 8000 tokens", "tok/train_000002.bin: 200 tokens", "tok/val_000000.bin: 1800 tokens", "tok/tokenizer.json: char tokenizer, 16 ids; 18000 bytes of text"} {
		if !strings.Contains(res.out, want) {
			t.Errorf("data tokenize does not print %q:\n%s", want, res.out)
		}
	}
	config := strings.NewReplacer("TIED", "true", "SCHED", "1f1b").Replace(tinyGPT) + "  - {layers: \"0-2\", address: ADDR0}\n  - {layers: \"3-4\", address: ADDR1}\n"
	config = strings.Replace(config, "vocab: 256", "vocab: 64", 1)
	config = strings.Replace(config, `dataset: text, corpus: "go:strings", glob: "*.go", max_bytes: 65536, tokenizer: byte, val_fraction: 0.1`,
		`dataset: tokens, train_shards: "`+tok+`/train_*.bin", val_shards: "`+tok+`/val_*.bin"`, 1)
	cfg := writeConfig(t, config, 2)
	runDir := t.TempDir()
	if res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", runDir); res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	a := run(t, time.Minute, nil, "sample", "--run-dir", runDir, "--prompt", "the cat ", "--tokens", "200", "--temperature", "3", "--seed", "7")
	if a.err != nil {
		t.Fatalf("sample: %v\n%s", a.err, a.out)
	}
	if !strings.Contains(a.out, "the cat ") || !strings.Contains(a.out, "200 tokens from") {
		t.Errorf("sample output lacks the prompt or its report:\n%s", a.out)
	}
	os.Remove(filepath.Join(tok, "tokenizer.json"))
	b := run(t, time.Minute, nil, "sample", "--run-dir", runDir, "--prompt", "the cat ", "--tokens", "5")
	if b.err == nil || !strings.Contains(b.out, "no tokenizer.json beside") {
		t.Errorf("sample without the tokenizer file: %v\n%s", b.err, b.out)
	}
}
