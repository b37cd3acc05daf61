package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/runlog"
)

// pausingStage is a fake stage that serves the launcher's requests on its
// standard input: it answers a pause with the boundary its shell snippet
// answer sets, and on "stop S" records S in RUN_DIR/stopped-STAGE-REPLICA,
// runs its snippet onstop and exits with the interrupted status.
func pausingStage(t *testing.T, answer, onstop string) string {
	return fakeStage(t, `dir=$7; replica=0; [ "$8" = --replica ] && replica=$9
trap 'exit 1' TERM
`+answer+`
while read -r line; do
  case "$line" in
  pause) echo "pipetrain-pause: step=$step" ;;
  "stop "*) s=${line#stop }; echo "$s" > "$dir/stopped-$stage-$replica"; `+onstop+`; exit 130 ;;
  esac
done
sleep 30
`)
}

// interrupted is a context whose cause is an interrupt, cancelled after d,
// with again as its second-interrupt channel.
func interrupted(d time.Duration, again <-chan struct{}) context.Context {
	ctx, cancel := context.WithCancelCause(WithSecondInterrupt(context.Background(), again))
	time.AfterFunc(d, func() { cancel(fmt.Errorf("%w (test)", ErrInterrupted)) })
	return ctx
}

// writeManifest commits a fake checkpoint of step in runDir.
func writeManifest(t *testing.T, runDir string, step int) {
	t.Helper()
	dir := checkpoint.StepDir(runlog.CheckpointDir(runDir), step)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, checkpoint.ManifestName), fmt.Appendf(nil, `{"step":%d}`, step), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Four processes (2 stages x 2 replicas) at different step boundaries when
// the interrupt comes: every one is told the largest boundary, stops there,
// and the launch says so and how to continue.
func TestInterruptStopsEveryProcessAtTheLargestBoundary(t *testing.T) {
	dir := t.TempDir()
	var out syncBuffer
	bin := pausingStage(t, `step=$((10 + 2*stage + replica))`,
		`[ "$stage$replica" = 00 ] && mkdir -p "$dir/checkpoints/step-000000$s" && echo "{\"step\":$s}" > "$dir/checkpoints/step-000000$s/manifest.json"`)
	err := Run(interrupted(200*time.Millisecond, nil), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 2, RunDir: dir, Out: &out})
	var ie *Interrupted
	if !errors.As(err, &ie) || !errors.Is(err, ErrInterrupted) {
		t.Fatalf("error %v, want an interrupt", err)
	}
	if ie.Step != 13 || ie.Checkpoint != 13 {
		t.Errorf("stopped after step %d with checkpoint %d, want 13 and 13 (stage 1 replica 1's boundary)\n%s", ie.Step, ie.Checkpoint, out.String())
	}
	for s := range 2 {
		for r := range 2 {
			got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("stopped-%d-%d", s, r)))
			if err != nil || strings.TrimSpace(string(got)) != "13" {
				t.Errorf("stage %d replica %d was told to stop after %q (%v), want 13", s, r, got, err)
			}
		}
	}
	want := "interrupted (test): every stage stopped after step 13; the checkpoint of step 13 is complete; continue with: pipetrain launch --resume " + dir
	if err.Error() != want {
		t.Errorf("error:\n%v\nwant\n%s", err, want)
	}
	if !strings.Contains(out.String(), "pipetrain: interrupted: every stage stops after step 13") {
		t.Errorf("the launch did not say where the stages stop:\n%s", out.String())
	}
	if strings.Contains(out.String(), "pipetrain-pause:") {
		t.Errorf("the pause answers reached the terminal:\n%s", out.String())
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "logs", "stage-1.replica-1.log")); !bytes.Contains(log, []byte("pipetrain-pause: step=13")) {
		t.Errorf("stage 1 replica 1's log lacks its answer:\n%s", log)
	}
}

// A process that does not answer the pause, and a second interrupt, each
// stop every stage at once; the launch names the newest complete checkpoint.
func TestInterruptStopsAtOnce(t *testing.T) {
	t.Run("silent stage", func(t *testing.T) {
		dir := t.TempDir()
		writeManifest(t, dir, 5)
		writeManifest(t, dir, 10)
		// Stage 1 reads nothing: it never answers.
		bin := pausingStage(t, `step=12; if [ "$stage" = 1 ]; then sleep 30 & wait; fi`, ":")
		start := time.Now()
		err := Run(interrupted(200*time.Millisecond, nil), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: dir, Out: &syncBuffer{}, PauseTimeout: 300 * time.Millisecond, Grace: 500 * time.Millisecond})
		var ie *Interrupted
		if !errors.As(err, &ie) || !errors.Is(err, ErrInterrupted) || ie.Step != -1 {
			t.Fatalf("error %v, want an interrupt that stopped at once", err)
		}
		want := "interrupted (test): every stage stopped at once (stage 1 did not answer the pause request within 300ms); the newest complete checkpoint is of step 10; continue with: pipetrain launch --resume " + dir
		if err.Error() != want {
			t.Errorf("error:\n%v\nwant\n%s", err, want)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("took %v", took)
		}
		if _, err := os.Stat(filepath.Join(dir, "stopped-0-0")); err == nil {
			t.Error("stage 0 was told a stop step though stage 1 never answered")
		}
	})
	t.Run("second interrupt", func(t *testing.T) {
		dir := t.TempDir()
		again := make(chan struct{})
		time.AfterFunc(600*time.Millisecond, func() { close(again) })
		// Told to stop, the stages go on (a long last step).
		bin := pausingStage(t, `step=3`, "sleep 30 & wait")
		start := time.Now()
		err := Run(interrupted(200*time.Millisecond, again), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: dir, Out: &syncBuffer{}, Grace: 500 * time.Millisecond})
		var ie *Interrupted
		if !errors.As(err, &ie) || ie.Why != "interrupted again" {
			t.Fatalf("error %v, want an interrupt stopped at once by the second", err)
		}
		if !strings.HasSuffix(err.Error(), "no checkpoint to continue from: the run must start again from step 0") {
			t.Errorf("error: %v", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("took %v to stop after the second interrupt", took)
		}
	})
	t.Run("stage fails while stopping", func(t *testing.T) {
		bin := pausingStage(t, `step=3`, `if [ "$stage" = 1 ]; then echo "disk full"; exit 1; fi; sleep 30 & wait`)
		err := Run(interrupted(200*time.Millisecond, nil), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: t.TempDir(), Out: &syncBuffer{}, Grace: 500 * time.Millisecond})
		var ie *Interrupted
		if !errors.As(err, &ie) || !strings.Contains(ie.Why, "stage 1 failed (exit status 1); its last output: disk full while stopping") {
			t.Fatalf("error %v, want stage 1's failure named", err)
		}
	})
}

// Stages that reach the run's end at the agreed step finish it: no error.
func TestInterruptAtTheLastStepFinishes(t *testing.T) {
	bin := fakeStage(t, `while read -r line; do
  case "$line" in pause) echo "pipetrain-pause: step=50" ;; "stop "*) exit 0 ;; esac
done
`)
	if err := Run(interrupted(200*time.Millisecond, nil), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: t.TempDir(), Out: &syncBuffer{}}); err != nil {
		t.Fatalf("stages that finished the run: %v", err)
	}
}

func TestServePauses(t *testing.T) {
	var out bytes.Buffer
	var stops []int
	boundary := -1
	var rejoins []int
	in := "noise\npause\nstop x\nrejoin 5\nrejoin -1\nstop 7\n"
	ServePauses(strings.NewReader(in), &out, func() int { boundary++; return boundary }, func(s int) { stops = append(stops, s) }, func(int) {},
		func(s int) { rejoins = append(rejoins, s) })
	if out.String() != "pipetrain-pause: step=0\n" {
		t.Errorf("answers %q", out.String())
	}
	if fmt.Sprint(stops) != "[7]" || fmt.Sprint(rejoins) != "[5]" {
		t.Errorf("stop steps %v, rejoin steps %v; want [7] and [5]", stops, rejoins)
	}
	for _, c := range []struct {
		line string
		step int
		ok   bool
	}{{formatPauseAnswer(-1), -1, true}, {formatPauseAnswer(42), 42, true}, {"pipetrain-pause: step=x", 0, false}, {"step=3", 0, false}} {
		if step, ok := parsePauseAnswer(c.line); step != c.step || ok != c.ok {
			t.Errorf("parsePauseAnswer(%q) = %d, %v; want %d, %v", c.line, step, ok, c.step, c.ok)
		}
	}
}
