package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
)

// TestStepsBelowOneRefused: a --steps given as 0 or -1 is refused naming the
// flag, rather than read as "not given" and the config's steps trained.
func TestStepsBelowOneRefused(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false)
	for _, args := range [][]string{
		{"launch", "--config", cfgPath, "--steps", "0"},
		{"launch", "--config", cfgPath, "--steps", "-1"},
		{"launch", "--resume", runDir, "--config", cfgPath, "--steps", "0"},
		{"reference", "--config", cfgPath, "--steps", "0"},
		{"stage", "--config", cfgPath, "--stage", "0", "--steps", "-1"},
	} {
		_, err := runCommand(t, newRoot(), args...)
		if err == nil || !strings.Contains(err.Error(), "--steps "+args[len(args)-1]+": want 1 or more") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// TestRunDirHoldingARunRefused: launch and reference refuse a --run-dir that
// holds another run, saying what it holds and both ways out, and touch
// nothing of it; --force deletes every file of the run and nothing else.
func TestRunDirHoldingARunRefused(t *testing.T) {
	cfgPath, runDir := fakeRun(t, true)
	if err := os.WriteFile(filepath.Join(runDir, "metrics.jsonl"), []byte(`{"step":6,"loss":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := listFiles(t, runDir)
	for _, args := range [][]string{
		{"launch", "--config", cfgPath, "--run-dir", runDir},
		{"reference", "--config", cfgPath, "--run-dir", runDir},
	} {
		_, err := runCommand(t, newRoot(), args...)
		if err == nil {
			t.Fatalf("%v: not refused", args)
		}
		for _, want := range []string{runDir + " holds another run (checkpoints of steps 4; final weights of 2 stages; metrics up to step 6)",
			"--resume", "--force"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v: %q lacks %q", args, err, want)
			}
		}
		if after := listFiles(t, runDir); !slices.Equal(after, before) {
			t.Errorf("%v: the refused run directory changed:\n%v\nnow\n%v", args, before, after)
		}
	}
	if _, err := runCommand(t, newRoot(), "launch", "--resume", runDir, "--force"); err == nil || !strings.Contains(err.Error(), "--force deletes the run that --resume continues") {
		t.Errorf("--force with --resume: %v", err)
	}

	mine := filepath.Join(runDir, "notes.txt")
	for _, p := range []string{mine, filepath.Join(runDir, "logs", "stage-0.log"), filepath.Join(runDir, "events", "stage-0.jsonl")} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := claimRunDir(runDir, true, ""); err != nil {
		t.Fatal(err)
	}
	if got := listFiles(t, runDir); !slices.Equal(got, []string{"notes.txt"}) {
		t.Errorf("--force left %v, want only the file no run wrote", got)
	}
	if err := claimRunDir(runDir, false, ""); err != nil {
		t.Errorf("a directory holding no run refused: %v", err)
	}
	if err := claimRunDir(filepath.Join(runDir, "new"), false, ""); err != nil {
		t.Errorf("a new directory refused: %v", err)
	}
}

// listFiles lists the files under dir, relative, sorted.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestExportNamesStaleStageFiles: final weights of stages the config does
// not have (an earlier run of another split in the same directory) are named
// as such, not reported as a tensor held twice.
func TestExportNamesStaleStageFiles(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false)
	for _, s := range []int{2, 3} {
		ts := []checkpoint.Tensor{{Name: "fc2.bias", Shape: []int{3}, F32: make([]float32, 3)}}
		if err := checkpoint.Write(filepath.Join(runDir, "weights", checkpoint.PartFile(s)), ts, map[string]string{"stage": "2"}); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	_, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--out", out)
	if want := "the config has 2 stages, but stage-2.safetensors, stage-3.safetensors are there"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("export with stale stage files: %v, want %q", err, want)
	}
}

// captureStdout returns what f printed on standard output.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	was := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	defer func() { os.Stdout = was }()
	f()
	w.Close()
	return string(<-done)
}

// TestResumeNamesTheCheckpointsItSkips: a manifest edited to another step
// than its parts' makes its checkpoint unusable, and a resume falling back
// past it, or past a folder whose manifest is gone, says which and why.
func TestResumeNamesTheCheckpointsItSkips(t *testing.T) {
	cfgPath, runDir := fakeRun(t, true)
	cfg, err := configs.LoadUnchecked(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(runDir, "checkpoints")
	// A second checkpoint, of step 8, whose manifest says 80.
	for i := range 2 {
		ts := []checkpoint.Tensor{{Name: "w", Shape: []int{1}, F32: []float32{1}}}
		if _, err := checkpoint.WritePart(root, 8, i, ts, map[string]string{"stage": strconv.Itoa(i), "step": "8"}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := checkpoint.Commit(context.Background(), root, 8, 2, 0, cfg.TrainingDigest(), checkpoint.Keep(3), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	m.Step = 80
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(checkpoint.StepDir(root, 8), checkpoint.ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// And a folder of step 12 without its manifest.
	if _, err := checkpoint.WritePart(root, 12, 0, nil, map[string]string{"step": "12"}); err != nil {
		t.Fatal(err)
	}
	var from int
	out := captureStdout(t, func() { from, err = checkResumable(runDir, nil, cfg) })
	if err != nil || from != 4 {
		t.Fatalf("resume from step %d (%v), want 4", from, err)
	}
	for _, want := range []string{
		"skipping checkpoint: " + checkpoint.StepDir(root, 12) + ": no manifest.json: never committed",
		"skipping checkpoint: " + filepath.Join(checkpoint.StepDir(root, 8), "manifest.json") + ": the manifest says step 80, its part stage-0.safetensors says step 8",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("resume printed\n%s\nwithout %q", out, want)
		}
	}
}

// TestResumeOfAFinishedRun: a run that trained every step and saved its
// weights is said to be complete rather than run again; one whose
// checkpoint is past the steps asked is refused; one stopped after its last
// checkpoint but before its weights resumes.
func TestResumeOfAFinishedRun(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false) // final weights of step 6
	cfg, err := configs.LoadUnchecked(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Train.Steps = 6
	if err := checkUnfinished(runDir, 6, cfg); !errors.Is(err, errComplete) || !strings.Contains(err.Error(), runDir+" is complete: it trained all 6 steps and saved its weights; give --steps N (more than 6) to train on") {
		t.Errorf("a finished run: %v", err)
	}
	if err := checkUnfinished(runDir, 8, cfg); err == nil || errors.Is(err, errComplete) || !strings.Contains(err.Error(), "its checkpoint is of step 8, past the 6 steps to train; give --steps 9 or more") {
		t.Errorf("a checkpoint past the steps: %v", err)
	}
	if err := checkUnfinished(runDir, 4, cfg); err != nil {
		t.Errorf("a run to continue: %v", err)
	}
	if err := os.Remove(filepath.Join(runDir, "weights", "stage-1.safetensors")); err != nil {
		t.Fatal(err)
	}
	if err := checkUnfinished(runDir, 6, cfg); err != nil {
		t.Errorf("a run that stopped before saving stage 1's weights: %v", err)
	}
}

// TestExportNeedsForceToReplace: export refuses an --out that exists
// unless --force, and says which stage files it read unchecked (a run from
// before final weights had checksum files).
func TestExportNeedsForceToReplace(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false) // weights without checksum files
	out := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(out, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--out", out); err == nil || !strings.Contains(err.Error(), "--out "+out+" exists: give --force to replace it") {
		t.Errorf("export over a file: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "mine" {
		t.Error("a refused export replaced --out")
	}
	text, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--out", out, "--force")
	if err != nil {
		t.Fatalf("export --force: %v\n%s", err, text)
	}
	if want := "warning: " + filepath.Join(runDir, "weights", "stage-1.safetensors") + " has no checksum file stage-1.sha256"; !strings.Contains(text, want) {
		t.Errorf("export of unchecked weights printed\n%s\nwithout %q", text, want)
	}
	if err := checkpoint.VerifyFile(out); err != nil {
		t.Errorf("the export's checksum: %v", err)
	}
}
