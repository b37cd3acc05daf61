package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
)

// TestRecipeWithReplicasEqualsReference launches a tied GPT on 2 stages × 2
// replicas with a whole recipe: adamw with weight decay, a warmup then
// cosine learning rate, gradient clipping by the global norm, and early
// stopping that no evaluation can satisfy (min_delta 10: the run stops
// after its first evaluation and two more, at step 6). Every process stops
// at that step, and the run equals its one-process reference bit for bit.
func TestRecipeWithReplicasEqualsReference(t *testing.T) {
	body := strings.Replace(gridGPT, "train: {steps: 30, evaluate: false, optimizer: {name: adam, lr: 0.003}}",
		`train: {steps: 30, evaluate: false, eval_every: 2, clip_grad_norm: 0.5,
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1},
  lr_schedule: {kind: cosine, warmup_steps: 2, min_lr: 0.0003},
  early_stop: {patience: 2, min_delta: 10}}`, 1) + "\nschedule: 1f1b"
	if body == gridGPT+"\nschedule: 1f1b" {
		t.Fatal("the GPT grid's train section changed; update this test")
	}
	cfg := gridConfig(t, body, []string{`"0-1"`, `"2-3"`}, 2)
	refDir, gridDir := t.TempDir(), t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
	if res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	got := sameRun(t, refDir, gridDir, 6)
	for _, m := range got {
		if m.LR == nil || m.GradNorm == nil {
			t.Errorf("step %d logs lr %v and grad_norm %v", m.Step, m.LR, m.GradNorm)
		}
	}
	if !strings.Contains(res.out, "early stop after step 6") || !strings.Contains(res.out, "pipetrain: done: 6 steps") {
		t.Errorf("the launch does not say it stopped early after step 6:\n%s", res.out)
	}
	meta, err := checkpoint.ReadMeta(filepath.Join(gridDir, "weights", "stage-1.safetensors"))
	if err != nil || meta["step"] != "6" {
		t.Errorf("stage 1's final weights are of step %q (%v), want 6", meta["step"], err)
	}
}
