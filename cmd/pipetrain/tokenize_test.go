package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataTokenize: the command writes the shards and the tokenizer file,
// prints each with its tokens, draws no progress for a small input, and
// refuses a run without --out or --tokenizer.
func TestDataTokenize(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("abc\n", 250)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCommand(t, newRoot(), "data", "tokenize", "--tokenizer", "char", "--out", filepath.Join(dir, "tok"), "--shard-tokens", "600", "--val-fraction", "0.2", text)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := strings.Join([]string{
		filepath.Join(dir, "tok", "train_000000.bin") + ": 600 tokens",
		filepath.Join(dir, "tok", "train_000001.bin") + ": 200 tokens",
		filepath.Join(dir, "tok", "val_000000.bin") + ": 200 tokens",
		filepath.Join(dir, "tok", "tokenizer.json") + ": char tokenizer, 4 ids; 1000 bytes of text",
	}, "\n") + "\n"
	if out != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out, want)
	}
	if out, err := runCommand(t, newRoot(), "data", "inspect", filepath.Join(dir, "tok", "val_000000.bin")); err != nil || !strings.Contains(out, "llm.c version 1, uint16, 200 tokens, token ids 0 to 3") {
		t.Errorf("inspect of a shard written: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--tokenizer", "byte", text}, {"--out", filepath.Join(dir, "x"), text}} {
		if out, err := runCommand(t, newRoot(), append([]string{"data", "tokenize"}, args...)...); err == nil || !strings.Contains(err.Error(), "--tokenizer and --out are required") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
}
