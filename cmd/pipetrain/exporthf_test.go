package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

const exportLlamaConfig = `model: {name: llama, layers: 2, width: 8, heads: 2, kv_heads: 1, intermediate: 12, context: 4, vocab: 16}
data: {dataset: text, batch_size: 4, micro_batches: 2}
stages:
  - {layers: "0-1", address: 127.0.0.1:7301}
  - {layers: "2-3", address: 127.0.0.1:7302}
`

// fakeLlamaRun writes a run directory as a two-stage run of
// exportLlamaConfig leaves it: each stage's final weights.
func fakeLlamaRun(t *testing.T) (cfgPath, runDir string) {
	t.Helper()
	dir := t.TempDir()
	cfgPath, runDir = filepath.Join(dir, "run.yaml"), filepath.Join(dir, "run")
	if err := os.WriteFile(cfgPath, []byte(exportLlamaConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.LoadUnchecked(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	stages := [][]checkpoint.Tensor{nil, nil}
	for _, p := range params {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i)
		}
		s := 0
		if strings.HasPrefix(p.Name, "block1") || strings.HasPrefix(p.Name, "head") {
			s = 1
		}
		stages[s] = append(stages[s], checkpoint.Tensor{Name: p.Name, Shape: p.Shape, F32: v})
	}
	if err := os.MkdirAll(filepath.Join(runDir, "weights"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, ts := range stages {
		meta := map[string]string{"step": "6", "config_digest": cfg.Digest(), "stage": string(rune('0' + i))}
		if err := checkpoint.Write(filepath.Join(runDir, "weights", checkpoint.PartFile(i)), ts, meta); err != nil {
			t.Fatal(err)
		}
	}
	return cfgPath, runDir
}

// TestExportFormatHF: export --format hf writes a Hugging Face directory,
// sharded beyond --shard-size, that model.from and train.init_from read
// back as the run's weights; an existing directory is replaced only with
// --force, and a model without Hugging Face names is refused.
func TestExportFormatHF(t *testing.T) {
	cfgPath, runDir := fakeLlamaRun(t)
	out := filepath.Join(t.TempDir(), "llama-hf")
	text, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--format", "hf", "--out", out, "--shard-size", "1KB", "--list")
	if err != nil {
		t.Fatalf("export: %v\n%s", err, text)
	}
	if !strings.Contains(text, "exported model llama, step 6: 21 tensors") || !strings.Contains(text, "4.9 KiB in 6 safetensors files, from") || !strings.Contains(text, "to the Hugging Face checkpoint "+out) ||
		!strings.Contains(text, "model.layers.0.self_attn.k_proj.weight") {
		t.Errorf("export printed:\n%s", text)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(out, checkpoint.HFConfigName))
	if err := json.Unmarshal(b, &cfg); err != nil || cfg["model_type"] != "llama" || cfg["num_key_value_heads"] != 1.0 || cfg["torch_dtype"] != "float32" {
		t.Errorf("config.json: %v %s", err, b)
	}
	if _, err := os.Stat(filepath.Join(out, checkpoint.HFIndexName)); err != nil {
		t.Errorf("no index for shards of 1KB: %v", err)
	}
	// The directory is a checkpoint model.from and init_from read.
	yaml := filepath.Join(t.TempDir(), "from.yaml")
	os.WriteFile(yaml, []byte("model: {from: "+out+", context: 4}\n"), 0o644)
	back, err := configs.LoadUnchecked(yaml)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Build(back.Model)
	if err != nil {
		t.Fatal(err)
	}
	w, err := checkpoint.ReadInit(m, out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q := w["block0.attn.q.weight"]; q.Shape[0] != 8 || q.F32[1] != 1 || q.F32[8] != 8 {
		t.Errorf("block0.attn.q.weight read back as %v %v", q.Shape, q.F32[:9])
	}
	if _, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--format", "hf", "--out", out); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("an existing --out: %v, want a refusal asking for --force", err)
	}
	if text, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--format", "hf", "--out", out, "--force"); err != nil {
		t.Errorf("--force: %v\n%s", err, text)
	}
	if _, err := os.Stat(filepath.Join(out, checkpoint.HFIndexName)); err == nil {
		t.Error("the replaced directory kept the index of the sharded export")
	}
	mlpCfg, mlpRun := fakeRun(t, false)
	if _, err := runCommand(t, newRoot(), "export", mlpRun, "--config", mlpCfg, "--format", "hf", "--out", filepath.Join(t.TempDir(), "x")); err == nil || !strings.Contains(err.Error(), "model mlp has no Hugging Face layout") {
		t.Errorf("an mlp: %v", err)
	}
}
