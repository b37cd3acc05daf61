package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const tinyLlama = `
model: {name: llama, dtype: float32, layers: 3, width: 16, heads: 4, kv_heads: KV, intermediate: 40, context: 16, vocab: 256, tie_embeddings: TIED}
data: {dataset: text, corpus: "go:strings", glob: "*.go", max_bytes: 65536, tokenizer: byte, val_fraction: 0.1, batch_size: 8, micro_batches: 4}
train: {steps: 8, seed: 3, log_every: 4, eval_every: 4, evaluate: true, optimizer: {name: adam, lr: 0.003}}
schedule: SCHED
checkpoint: {every: 0}
stages:
`

// TestLlamaLaunchEqualsReference runs the Llama as separate processes over
// gRPC, tied with grouped-query attention under zb-h1 (its second stage
// recomputing attention's probabilities) and untied under 1f1b, against the
// one-process reference: losses, evaluations and weights bit-identical.
func TestLlamaLaunchEqualsReference(t *testing.T) {
	for _, v := range []struct {
		tied, kv, sched string
		stages          []string
	}{
		{"true", "2", "zb-h1", []string{`{layers: "0-1", address: ADDR0}`, `{layers: "2-4", address: ADDR1, recompute: selective}`}},
		{"false", "4", "1f1b", []string{`{layers: "0-2", address: ADDR0}`, `{layers: "3-4", address: ADDR1}`}},
	} {
		t.Run(fmt.Sprintf("%s/tied=%s/kv=%s", v.sched, v.tied, v.kv), func(t *testing.T) {
			text := strings.NewReplacer("TIED", v.tied, "KV", v.kv, "SCHED", v.sched).Replace(tinyLlama)
			for _, s := range v.stages {
				text += "  - " + s + "\n"
			}
			cfg := writeConfig(t, text, len(v.stages))
			refDir, pipeDir := t.TempDir(), t.TempDir()
			if res := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); res.err != nil {
				t.Fatalf("reference: %v\n%s", res.err, res.out)
			}
			if res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", pipeDir); res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			sameRun(t, refDir, pipeDir, 0)
		})
	}
}
