package configs

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/data"
)

// llmcShard writes an llm.c shard of n byte-sized uint16 tokens.
func llmcShard(t *testing.T, path string, n int) {
	t.Helper()
	b := make([]byte, 1024)
	binary.LittleEndian.PutUint32(b[0:], 20240520)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint32(b[8:], uint32(n))
	for i := range n {
		b = binary.LittleEndian.AppendUint16(b, uint16(i*31%256))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTokensConfigValidates: a GPT config of dataset tokens loads and its
// shards, found beside the config, pass the data check; a shard a glob no
// longer matches is refused by key before any stage starts; the kind's keys
// are unknown to a config of another dataset.
func TestTokensConfigValidates(t *testing.T) {
	cleanEnv(t)
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "tok"), 0o755); err != nil {
		t.Fatal(err)
	}
	llmcShard(t, filepath.Join(root, "tok", "train_000.bin"), 300)
	llmcShard(t, filepath.Join(root, "tok", "train_001.bin"), 300)
	llmcShard(t, filepath.Join(root, "tok", "val_000.bin"), 100)
	config := filepath.Join(root, "gpt.yaml")
	text := `
model: {name: gpt, vocab: 256, context: 8, width: 8, heads: 2, layers: 2}
data: {dataset: tokens, train_shards: "tok/train_*.bin", val_shards: tok/val_000.bin, batch_size: 8, micro_batches: 4}
train: {steps: 5, evaluate: true, optimizer: {name: sgd, lr: 0.1}}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); err != nil {
		t.Fatalf("good shards: %v", err)
	}

	os.Remove(filepath.Join(root, "tok", "val_000.bin"))
	if err := c.CheckData(); err == nil || !strings.HasPrefix(err.Error(), config+": data.val_shards: data: open "+filepath.Join(root, "tok", "val_000.bin")) {
		t.Errorf("missing validation shard: err = %v", err)
	}
	t.Setenv("PIPETRAIN_MODEL_VOCAB", "200")
	if c, err = Load(config); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); !errors.Is(err, data.ErrBadData) || !strings.Contains(err.Error(), "train_000.bin: token id 217 at token 7 (byte offset 1038)") {
		t.Errorf("vocab 200: err = %v", err)
	}

	text = strings.Replace(text, "dataset: tokens", "dataset: text, corpus: tok", 1)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(config); err == nil || !strings.Contains(err.Error(), "train_shards") {
		t.Errorf("train_shards with dataset text: err = %v", err)
	}
}
