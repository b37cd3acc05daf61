package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestResumeKeepsTheRunsOverrides launches with PIPETRAIN_* overrides, one of
// them a setting the checkpoints depend on, then resumes with none given: the
// resume must continue from the last checkpoint with the run's own settings
// and end equal, bit for bit, to the same run never stopped.
func TestResumeKeepsTheRunsOverrides(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	env := []string{"PIPETRAIN_CHECKPOINT_EVERY=5", "PIPETRAIN_TRAIN_EVALUATE=false", "PIPETRAIN_TRAIN_OPTIMIZER_LR=0.003", "PIPETRAIN_TRAIN_LOG_EVERY=1"}
	clean := t.TempDir()
	if r := run(t, 2*time.Minute, env, "launch", "--config", cfg, "--steps", "14", "--run-dir", clean); r.err != nil {
		t.Fatalf("uninterrupted launch: %v\n%s", r.err, r.out)
	}
	dir := t.TempDir()
	if r := run(t, 2*time.Minute, env, "launch", "--config", cfg, "--steps", "10", "--run-dir", dir); r.err != nil {
		t.Fatalf("first launch: %v\n%s", r.err, r.out)
	}
	r := run(t, 2*time.Minute, nil, "launch", "--resume", dir, "--steps", "14")
	if r.err != nil {
		t.Fatalf("resume: %v\n%s", r.err, r.out)
	}
	if !strings.Contains(r.out, "resuming "+dir+" from the checkpoint of step 10") || !strings.Contains(r.out, "resumed from the checkpoint of step 10") {
		t.Errorf("the resume does not say it continues from step 10:\n%s", r.out)
	}
	if strings.Contains(r.out, "skipping checkpoint") || strings.Contains(r.out, "starting from step 0") {
		t.Errorf("the resume passed over the run's checkpoint:\n%s", r.out)
	}
	sameRun(t, clean, dir, 14)
}

// TestResumeRefusesChangedSettings resumes with a setting the checkpoints
// depend on changed (by a variable, then by editing the file): launch must
// refuse before any stage starts, name the setting, its two values and where
// the new one came from, and leave the checkpoints as they were.
func TestResumeRefusesChangedSettings(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	env := []string{"PIPETRAIN_CHECKPOINT_EVERY=5", "PIPETRAIN_TRAIN_EVALUATE=false"}
	dir := t.TempDir()
	if r := run(t, 2*time.Minute, env, "launch", "--config", cfg, "--steps", "5", "--run-dir", dir); r.err != nil {
		t.Fatalf("first launch: %v\n%s", r.err, r.out)
	}
	before, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*", "*"))

	r := run(t, time.Minute, []string{"PIPETRAIN_TRAIN_OPTIMIZER_LR=0.01", "PIPETRAIN_TRAIN_EVAL_EVERY=2"}, "launch", "--resume", dir, "--steps", "10")
	if r.err == nil {
		t.Fatalf("resume with another learning rate succeeded:\n%s", r.out)
	}
	for _, want := range []string{"train.optimizer.lr: 0.001, now 0.01 (from PIPETRAIN_TRAIN_OPTIMIZER_LR=0.01)", "cannot resume"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, r.out)
		}
	}
	if strings.Contains(r.out, "eval_every") {
		t.Errorf("train.eval_every was named, but checkpoints do not depend on it:\n%s", r.out)
	}
	if strings.Contains(r.out, "[stage") {
		t.Errorf("a stage started before the refusal:\n%s", r.out)
	}

	// The file itself edited since the run started.
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(text), "hidden: [512, 256, 128]", "hidden: [512, 256, 64]", 1)
	if edited == string(text) {
		t.Fatal("the default config's hidden layers are not where the test expects them")
	}
	if err := os.WriteFile(cfg, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	r = run(t, time.Minute, nil, "launch", "--resume", dir, "--steps", "10")
	if r.err == nil || !strings.Contains(r.out, "model.hidden[2]: 128, now 64 (from "+cfg+")") {
		t.Errorf("resume after editing model.hidden: %v\n%s", r.err, r.out)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*", "*"))
	if strings.Join(before, ",") != strings.Join(after, ",") || len(after) == 0 {
		t.Errorf("checkpoints changed by refused resumes: %v, now %v", before, after)
	}
}

// TestResumeNeedsTheSecretAgain: a token given by variable is never written
// to the run directory, so a resume must be given it again, and says so.
func TestResumeNeedsTheSecretAgain(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	const secret = "s3cret-value-never-on-disk"
	env := []string{"PIPETRAIN_CHECKPOINT_EVERY=5", "PIPETRAIN_TRAIN_EVALUATE=false", "PIPETRAIN_TRANSPORT_TOKEN=" + secret}
	dir := t.TempDir()
	if r := run(t, 2*time.Minute, env, "launch", "--config", cfg, "--steps", "5", "--run-dir", dir); r.err != nil {
		t.Fatalf("first launch: %v\n%s", r.err, r.out)
	}
	info, err := os.ReadFile(filepath.Join(dir, "launch.json"))
	if err != nil || strings.Contains(string(info), secret) || !strings.Contains(string(info), "PIPETRAIN_TRANSPORT_TOKEN") {
		t.Fatalf("launch.json (%v) holds the secret, or does not name its variable:\n%s", err, info)
	}
	r := run(t, time.Minute, nil, "launch", "--resume", dir, "--steps", "7")
	if r.err == nil || !strings.Contains(r.out, "the run was launched with PIPETRAIN_TRANSPORT_TOKEN set; set it again") {
		t.Fatalf("resume without the token: %v\n%s", r.err, r.out)
	}
	r = run(t, 2*time.Minute, env[2:], "launch", "--resume", dir, "--steps", "7")
	if r.err != nil || !strings.Contains(r.out, "resumed from the checkpoint of step 5") {
		t.Fatalf("resume with the token: %v\n%s", r.err, r.out)
	}
}
