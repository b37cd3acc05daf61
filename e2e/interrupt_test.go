package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/stages"
)

// TestInterruptCheckpointsAndResumes sends Ctrl-C's signal to a zb-v launch
// of 2 stages × 2 replicas (stage 0 computes the loss; four processes to
// agree on one step) with checkpoints turned off: launch must stop every
// process after one step, write the checkpoint of that step anyway, exit
// 130 printing the --resume command, and the resumed run must end with the
// losses and weights of a run never interrupted, bit for bit.
func TestInterruptCheckpointsAndResumes(t *testing.T) {
	needData(t)
	const steps = 100
	cfg := gridConfig(t, gridMLP+"\nschedule: zb-v\nvirtual_stages: 2", []string{`["0", "3"]`, `["1", "2"]`}, 2)
	args := []string{"launch", "--config", cfg, "--steps", strconv.Itoa(steps)}
	clean := t.TempDir()
	if r := run(t, 3*time.Minute, nil, append(args, "--run-dir", clean)...); r.err != nil {
		t.Fatalf("uninterrupted launch: %v\n%s", r.err, r.out)
	}

	dir := t.TempDir()
	cmd, out, done := start(t, nil, append(args, "--run-dir", dir)...)
	waitForStep(t, dir, 5, 2*time.Minute, out)
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("launch still running a minute after SIGINT:\n%s", out.String())
	}
	text := out.String()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit status %d after SIGINT, want 130:\n%s", code, text)
	}
	m := regexp.MustCompile(`pipetrain: interrupted \(interrupt\): every stage stopped after step (\d+); the checkpoint of step (\d+) is complete; continue with: pipetrain launch --resume (\S+)\n`).FindStringSubmatch(text)
	if m == nil || m[1] != m[2] || m[3] != dir {
		t.Fatalf("launch did not say where it stopped and how to continue:\n%s", text)
	}
	stop, _ := strconv.Atoi(m[1])
	if stop < 5 || stop >= steps {
		t.Fatalf("stopped after step %d; want a step after the 5th and before the last", stop)
	}
	man, err := checkpoint.ReadManifest(checkpoint.StepDir(stages.CheckpointDir(dir), stop))
	if err != nil {
		t.Fatalf("no committed checkpoint of step %d: %v", stop, err)
	}
	if err := man.Verify(); err != nil {
		t.Fatal(err)
	}
	logged, err := stages.ReadMetrics(dir + "/metrics.jsonl")
	if err != nil || len(logged) == 0 || logged[len(logged)-1].Step != stop {
		t.Fatalf("metrics end at %v (%v), want step %d", logged[len(logged)-1:], err, stop)
	}
	for s := range 2 {
		for r := range 2 {
			if want := fmt.Sprintf("stage %d replica %d stopped after step %d: the launch was interrupted", s, r, stop); !strings.Contains(text, want) {
				t.Errorf("output lacks %q:\n%s", want, text)
			}
		}
	}
	noStageLeft(t, cfg, dir)

	if r := run(t, 3*time.Minute, nil, "launch", "--resume", dir); r.err != nil {
		t.Fatalf("launch --resume: %v\n%s", r.err, r.out)
	} else if !strings.Contains(r.out, "from the checkpoint of step "+m[1]) {
		t.Errorf("the resume did not start from step %d:\n%s", stop, r.out)
	}
	sameRun(t, clean, dir, steps)
}

// TestInterruptCommitsThroughTheRendezvous: stages that meet at a
// rendezvous commit checkpoints through rank 0's ledger, which refuses
// steps off the checkpoint schedule; the step a Ctrl-C stops at is off it
// (checkpoints are off here) and must still commit, and the run resume
// from it.
func TestInterruptCommitsThroughTheRendezvous(t *testing.T) {
	needData(t)
	body := gridMLP + "\nschedule: 1f1b\nstages:\n  - {layers: \"0-1\", address: auto}\n  - {layers: \"2-3\", address: auto}\n"
	cfg := filepath.Join(t.TempDir(), "auto.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd, out, done := start(t, nil, "launch", "--config", cfg, "--steps", "400", "--run-dir", dir)
	waitForStep(t, dir, 5, 2*time.Minute, out)
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("launch still running a minute after SIGINT:\n%s", out.String())
	}
	text := out.String()
	m := regexp.MustCompile(`every stage stopped after step (\d+); the checkpoint of step (\d+) is complete`).FindStringSubmatch(text)
	if code := cmd.ProcessState.ExitCode(); code != 130 || m == nil || m[1] != m[2] {
		t.Fatalf("exit status %d after SIGINT; want 130 and a complete checkpoint:\n%s", code, text)
	}
	if strings.Contains(text, "refused") {
		t.Errorf("rank 0 refused a report:\n%s", text)
	}
	if r := run(t, 3*time.Minute, nil, "launch", "--resume", dir); r.err != nil {
		t.Fatalf("launch --resume: %v\n%s", r.err, r.out)
	} else if !strings.Contains(r.out, "from the checkpoint of step "+m[1]) {
		t.Errorf("the resume did not start from step %s:\n%s", m[1], r.out)
	}
}
