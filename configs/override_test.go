package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSetDataOverridesTheFile: --data settings set the data section's own
// fields (typed as in the file) and the dataset kind's own keys, beat the
// file, name themselves in the problems Validate finds, and refuse a key
// the section lacks with the nearest one.
func TestSetDataOverridesTheFile(t *testing.T) {
	cleanEnv(t)
	root := t.TempDir()
	config := filepath.Join(root, "gpt.yaml")
	text := `
model: {name: gpt, vocab: 256, context: 8, width: 8, heads: 2, layers: 2}
data: {dataset: tokens, train_shards: "tok/train_*.bin", batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadUnchecked(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetData([]string{"data.val_shards=tok/val.bin", "batch_size=16", "micro_batches=8"}); err != nil {
		t.Fatal(err)
	}
	if c.Data.Own["val_shards"] != "tok/val.bin" || c.Data.Own["train_shards"] != "tok/train_*.bin" || c.Data.BatchSize != 16 || c.MicroBatchSize() != 2 {
		t.Errorf("after --data: %+v", c.Data)
	}
	if err := c.SetData([]string{"data.batch_size=15"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--data data.batch_size=15: data.batch_size") {
		t.Errorf("a bad value from --data: %v, want the problem to name the setting", err)
	}
	for set, want := range map[string]string{
		"data.val_shard=x":    "data.val_shard is no key of the data section of dataset tokens (did you mean data.val_shards?)",
		"data.batch_size=two": `data.batch_size: "two" is no int`,
		"val_shards":          "want KEY=VALUE",
	} {
		if err := c.SetData([]string{set}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--data %s: %v, want %q", set, err, want)
		}
	}
}
