package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a config with free ports for its stages ("ADDR0", "ADDR1"...).
func writeConfig(t *testing.T, text string, stagesN int) string {
	t.Helper()
	for i, addr := range freePorts(t, stagesN) {
		text = strings.ReplaceAll(text, fmt.Sprintf("ADDR%d", i), addr)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const tinyGPT = `
model: {name: gpt, dtype: float32, layers: 3, width: 16, heads: 2, context: 16, vocab: 256, tie_embeddings: TIED}
data: {dataset: text, corpus: "go:strings", glob: "*.go", max_bytes: 65536, tokenizer: byte, val_fraction: 0.1, batch_size: 8, micro_batches: 4}
train: {steps: 8, seed: 3, log_every: 4, eval_every: 4, evaluate: true, optimizer: {name: adam, lr: 0.003}}
schedule: SCHED
checkpoint: {every: 0}
stages:
`

// TestModelsLaunchEqualReference runs the GPT (tied and untied, two splits each)
// and the CNN (two splits) as separate processes over gRPC, against the
// one-process reference: losses, evaluations and weights must be bit-identical.
func TestModelsLaunchEqualReference(t *testing.T) {
	needData(t)
	type variant struct {
		name, config string
		stages       int
	}
	var runs []variant
	for _, tied := range []string{"false", "true"} {
		for _, split := range []struct {
			sched  string
			layers []string
		}{
			{"1f1b", []string{"0-1", "2-4"}},
			{"gpipe", []string{"0", "1-2", "3-4"}},
		} {
			text := strings.NewReplacer("TIED", tied, "SCHED", split.sched).Replace(tinyGPT)
			for i, l := range split.layers {
				text += fmt.Sprintf("  - {layers: %q, address: ADDR%d}\n", l, i)
			}
			runs = append(runs, variant{fmt.Sprintf("gpt/tied=%s/%s", tied, strings.Join(split.layers, ",")), text, len(split.layers)})
		}
	}
	for _, layers := range [][]string{{"0", "1-2"}, {"0-1", "2"}} {
		text := "model: {name: cnn, input: 784, channels: [4, 8], classes: 10}\n" +
			"data: {batch_size: 32, micro_batches: 4}\n" +
			"train: {steps: 6, log_every: 3, evaluate: false, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}\n" +
			"stages:\n"
		for i, l := range layers {
			text += fmt.Sprintf("  - {layers: %q, address: ADDR%d}\n", l, i)
		}
		runs = append(runs, variant{"cnn/" + strings.Join(layers, ","), text, len(layers)})
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			cfg := writeConfig(t, r.config, r.stages)
			refDir, pipeDir := t.TempDir(), t.TempDir()
			if res := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); res.err != nil {
				t.Fatalf("reference: %v\n%s", res.err, res.out)
			}
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", pipeDir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			sameRun(t, refDir, pipeDir, 0)
		})
	}
}

// TestSampleGeneratesText trains the tiny GPT briefly and samples from it.
func TestSampleGeneratesText(t *testing.T) {
	text := strings.NewReplacer("TIED", "true", "SCHED", "1f1b").Replace(tinyGPT) + "  - {layers: \"0-2\", address: ADDR0}\n  - {layers: \"3-4\", address: ADDR1}\n"
	cfg := writeConfig(t, text, 2)
	dir := t.TempDir()
	if res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", dir); res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	a := run(t, time.Minute, nil, "sample", "--run-dir", dir, "--prompt", "func ", "--tokens", "20", "--seed", "7")
	b := run(t, time.Minute, nil, "sample", "--run-dir", dir, "--prompt", "func ", "--tokens", "20", "--seed", "7")
	if a.err != nil {
		t.Fatalf("sample: %v\n%s", a.err, a.out)
	}
	if !strings.Contains(a.out, "func ") || !strings.Contains(a.out, "20 tokens from") {
		t.Errorf("sample output lacks the prompt or its report:\n%s", a.out)
	}
	if a.out != b.out {
		t.Errorf("the same seed gave different samples:\n%s\n%s", a.out, b.out)
	}
	if res := run(t, time.Minute, nil, "sample", "--run-dir", t.TempDir(), "--config", cfg, "--prompt", "x"); res.err == nil || !strings.Contains(res.out, "no final weights and no complete checkpoint") {
		t.Errorf("sampling an empty run: %v\n%s", res.err, res.out)
	}
}
