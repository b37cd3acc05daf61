package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
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
		for _, want := range []string{runDir + " holds another run (checkpoints of steps 4; final weights of 2 stages; metrics up to step 6; metrics.jsonl)",
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
