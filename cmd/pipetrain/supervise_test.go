package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
	"github.com/pipetrain/pipetrain/transport"
)

// permanent is one failure of each kind a restart would repeat, and what a
// stage says of it.
var permanent = []struct {
	name string
	err  error
	why  string
}{
	{"disk full", fmt.Errorf("stage 0: writing metrics: %w", &os.PathError{Op: "write", Path: "runs/x/metrics.jsonl", Err: syscall.ENOSPC}),
		"ran out of disk space in runs/x"},
	{"quota", fmt.Errorf("checkpoint: %w", &os.PathError{Op: "write", Path: "runs/x/checkpoints/step-50/stage-0.safetensors", Err: syscall.EDQUOT}),
		"ran out of its disk quota in runs/x/checkpoints/step-50"},
	{"non-finite", fmt.Errorf("loss became NaN at step 4 (stage 1): %w", stages.ErrNonFinite), "computed a NaN or infinite value (training diverged)"},
	{"bad data", fmt.Errorf("data: train-labels: label 5 of example 3 is not below model.classes 5: %w", data.ErrBadData), "found data the model cannot train on"},
	{"replicas", fmt.Errorf("stage 0: step 9: %w", stages.ErrDiverged), "found its replicas diverged"},
	{"config invalid", &configs.Problems{Path: "c.yaml", Items: []string{"model.classes: must be at least 2"}}, "refused its config"},
	{"config unreadable", refusedConfig{errors.New("c.yaml: yaml: line 3: did not find expected key")}, "refused its config"},
}

// TestExitStatusSaysWhatARestartWouldRepeat: a stage that failed in a way a
// restart would repeat exits with ExitRepeats and says why on a line of its
// own; a failure a restart may cure (a lost neighbour) exits 1, an interrupt 130.
func TestExitStatusSaysWhatARestartWouldRepeat(t *testing.T) {
	stage := stageCmd()
	for _, tc := range permanent {
		var stderr bytes.Buffer
		if code := exitStatus(stage, tc.err, &stderr); code != launcher.ExitRepeats || stderr.String() != launcher.FormatRepeats(tc.why)+"\n" {
			t.Errorf("%s: exit %d, printed %q; want %d and %q", tc.name, code, stderr.String(), launcher.ExitRepeats, launcher.FormatRepeats(tc.why))
		}
	}
	for _, tc := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("stage 1, step 4: 1F3: waiting for stage 0: %w", transport.ErrPeerClosed), 1},
		{fmt.Errorf("stage 1: %w", context.DeadlineExceeded), 1},
		{fmt.Errorf("%w (terminated)", launcher.ErrInterrupted), 130},
	} {
		var stderr bytes.Buffer
		if code := exitStatus(stage, tc.err, &stderr); code != tc.code || stderr.Len() != 0 {
			t.Errorf("%v: exit %d, printed %q; want %d and nothing", tc.err, code, stderr.String(), tc.code)
		}
	}
	// Only a stage prints the line, for its launcher; a launch that gave up
	// on such a stage exits with the same status.
	var stderr bytes.Buffer
	if code := exitStatus(launchCmd(), permanent[0].err, &stderr); code != launcher.ExitRepeats || stderr.Len() != 0 {
		t.Errorf("launch: exit %d, printed %q", code, stderr.String())
	}
}

// fakeJob is a stage program for superviseRun: every start appends a line to
// RUN_DIR/starts, then the script body runs (stage index in $stage, the run
// directory in $dir).
func fakeJob(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-pipetrain")
	script := "#!/bin/sh\nstage=$5\ndir=$7\necho start >> \"$dir/starts\"\n" + body
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func starts(t *testing.T, dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "starts"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "start")
}

func superviseConfig() *configs.Config {
	return &configs.Config{Recovery: configs.Recovery{MaxRestarts: 3}}
}

// TestSuperviseRunDoesNotRestartWhatWouldRepeat: for each kind of failure a
// restart would repeat, the job runs once and the launch says why it stops.
func TestSuperviseRunDoesNotRestartWhatWouldRepeat(t *testing.T) {
	for _, tc := range permanent {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			exitStatus(stageCmd(), tc.err, &stderr)
			bin := fakeJob(t, fmt.Sprintf(`echo '{"step":10,"loss":1}' > "$dir/metrics.jsonl"
echo 'pipetrain: %s'
printf '%%s' '%s'
exit %d
`, tc.err, stderr.String(), launcher.ExitRepeats))
			dir := t.TempDir()
			var out bytes.Buffer
			err := superviseRun(context.Background(), superviseConfig(), launcher.Options{Binary: bin, ConfigPath: "c.yaml", Stages: 1, RunDir: dir, Out: &out})
			want := "pipetrain: not restarting: stage 0 " + tc.why + "; a restart would fail the same way"
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "stage 0 failed (exit status 3): "+tc.err.Error()) {
				t.Errorf("error:\n%v\nwant it to name the failure and say %q", err, want)
			}
			if n := starts(t, dir); n != 1 {
				t.Errorf("the job ran %d times, want once", n)
			}
		})
	}
}

// TestRestartWithoutCheckpointSaysFromTheStart: a failure a restart may cure
// is restarted; without a checkpoint the restart is from the start, and the
// launch says so rather than naming a checkpoint of step 0.
func TestRestartWithoutCheckpointSaysFromTheStart(t *testing.T) {
	bin := fakeJob(t, `case " $* " in *" --resume "*) exit 0;; esac
echo '{"step":50,"loss":1}' > "$dir/metrics.jsonl"
echo "pipetrain: stage 0, step 51: 0F2: sending activation to stage 1: peer closed the link: EOF"
exit 1
`)
	dir := t.TempDir()
	var out bytes.Buffer
	if err := superviseRun(context.Background(), superviseConfig(), launcher.Options{Binary: bin, ConfigPath: "c.yaml", Stages: 1, RunDir: dir, Out: &out}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if want := "pipetrain: stage 0 failed after step 50; restarting from the start (no checkpoint yet; 50 steps lost), restart 1 of 3\n"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
	if n := starts(t, dir); n != 2 {
		t.Errorf("the job ran %d times, want twice", n)
	}
}
