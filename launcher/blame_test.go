package launcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// diskFull is a fake 3-stage job in which stage 0 runs out of disk space:
// it prints its failure status (not waiting) and its error line, and exits
// after exit0 seconds (closing its links takes a while); stage 1 loses it,
// and stage 2 loses stage 1, each exiting at once with the status of a stage
// that gave up on a neighbour. Stage 0 ignores status queries, as a stage
// process on its way out does.
func diskFull(sleep1, sleep2, exit0 string) string {
	return `trap 'exit 1' TERM
case $stage in
0) trap '' USR1; sleep 0.05
   echo "pipetrain-status: stage=0 action=- peer=-1 for=1ms"
   echo "pipetrain: writing runs/x/metrics.jsonl: write runs/x/metrics.jsonl: no space left on device"
   echo "pipetrain-repeats: ran out of disk space in runs/x"
   sleep ` + exit0 + `; exit 3;;
1) sleep ` + sleep1 + `; echo "pipetrain-status: stage=1 action=1F3 peer=0 for=2ms"
   echo "pipetrain: stage 1, step 4: 1F3: waiting for activation of step 4 micro-batch 3 from stage 0 (127.0.0.1:7101): peer closed the link: EOF"; exit 1;;
2) sleep ` + sleep2 + `; echo "pipetrain-status: stage=2 action=2F3 peer=1 for=2ms"
   echo "pipetrain: stage 2, step 4: 2F3: waiting for activation of step 4 micro-batch 3 from stage 1 (127.0.0.1:7102): peer closed the link: EOF"; exit 1;;
esac
`
}

// TestCauseIsBlamedNotTheStageThatLostIt: whichever stage exits first, the
// launcher blames the stage whose failure was its own (not a lost neighbour),
// with its own error line, as a failure rather than a hang, and keeps what it
// said about restarting.
func TestCauseIsBlamedNotTheStageThatLostIt(t *testing.T) {
	for _, tc := range []struct{ name, sleep1, sleep2, exit0 string }{
		{"neighbours exit first", "0.1", "0.15", "0.8"},
		{"cause exits first", "0.3", "0.35", "0"},
		{"the farthest exits first", "0.2", "0.1", "0.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			err := Run(context.Background(), Options{Binary: fakeStage(t, diskFull(tc.sleep1, tc.sleep2, tc.exit0)), ConfigPath: "c.yaml", Stages: 3,
				RunDir: t.TempDir(), Out: &out, Grace: 2 * time.Second, QueryTimeout: 200 * time.Millisecond})
			var se *StageError
			if !errors.As(err, &se) || se.Stage != 0 || se.Hung {
				t.Fatalf("error %v (%+v), want stage 0's own failure", err, se)
			}
			want := "stage 0 failed (exit status 3): writing runs/x/metrics.jsonl: write runs/x/metrics.jsonl: no space left on device"
			if err.Error() != want {
				t.Errorf("message\n%s\nwant\n%s", err, want)
			}
			if !se.Repeats() || se.RepeatsWhy != "ran out of disk space in runs/x" {
				t.Errorf("Repeats %v, RepeatsWhy %q", se.Repeats(), se.RepeatsWhy)
			}
			if strings.Contains(out.String(), "pipetrain-repeats") {
				t.Errorf("the repeats line reached the terminal:\n%s", out.String())
			}
		})
	}
}

// goPanic is the output of a Go program that panicked in pipetrain's code.
const goPanic = `panic: runtime error: index out of range [324] with length 320

goroutine 1 [running]:
runtime.goPanicIndex(0x144, 0x140)
	/usr/lib/go/src/runtime/panic.go:115 +0x74
github.com/pipetrain/pipetrain/engine.(*Engine).oneHot(0xc0001a6000, {0xc000512000, 0x40, 0x40})
	/work/main/engine/engine.go:730 +0x1a5
github.com/pipetrain/pipetrain/engine.(*Engine).Forward(...)
	/work/main/engine/engine.go:340
main.main()
	/work/main/cmd/pipetrain/main.go:23 +0x7f`

// TestPanicIsQuotedByItsFirstLine: a stage that panics is blamed with its
// panic's message and the first frame in pipetrain's code, not the last line
// of its stack trace.
func TestPanicIsQuotedByItsFirstLine(t *testing.T) {
	bin := fakeStage(t, `trap 'exit 1' TERM
if [ "$stage" = 1 ]; then sleep 0.1; cat <<'EOF'
`+goPanic+`
EOF
exit 2; fi
sleep 30 & wait
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: t.TempDir(), Out: &syncBuffer{}, Grace: 2 * time.Second})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 1 {
		t.Fatalf("error %v, want stage 1's failure", err)
	}
	want := "stage 1 failed (exit status 2): panic: runtime error: index out of range [324] with length 320 (in engine.(*Engine).oneHot at /work/main/engine/engine.go:730)"
	if err.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", err, want)
	}
}

func TestReasonIsTheErrorLine(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"error last", []string{"stage 0: layers 0-1", "pipetrain: stage 0, step 3: boom"}, "stage 0, step 3: boom"},
		{"problems listed", []string{"pipetrain: c.yaml: 2 problems:", "  model.classes: must be at least 2", "  data.batch_size: must be at least 1"},
			"c.yaml: 2 problems: model.classes: must be at least 2; data.batch_size: must be at least 1"},
		// An earlier informational line is no error once output goes on.
		{"killed after a message", []string{"pipetrain: rank 1 of 4 from RANK: stage 1", "step 3/10 loss 2.0"}, ""},
		{"panic without pipetrain frames", []string{"fatal error: concurrent map writes", "", "goroutine 7 [running]:", "runtime.throw({0x1, 0x2})", "\t/go/src/runtime/panic.go:1 +0x1"},
			"fatal error: concurrent map writes"},
	} {
		var r reason
		for _, l := range tc.lines {
			r.add(l)
		}
		if got := r.String(); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFirstOfTwoCausesIsBlamed: when two stages fail by themselves (both find
// the disk full), the one that said so first is blamed, whichever exits first
// or is reached first from the stage that lost its neighbour.
func TestFirstOfTwoCausesIsBlamed(t *testing.T) {
	bin := fakeStage(t, `trap 'exit 1' TERM
case $stage in
0) sleep 0.05; echo "pipetrain-status: stage=0 action=- peer=-1 for=1ms"
   echo "pipetrain: stage 0: checkpoint of step 50: no space left on device"; sleep 0.25; exit 3;;
1) sleep 0.15; echo "pipetrain-status: stage=1 action=- peer=-1 for=1ms"
   echo "pipetrain: stage 1: checkpoint of step 50: no space left on device"; exit 3;;
2) sleep 0.2; echo "pipetrain-status: stage=2 action=2F0 peer=1 for=2ms"
   echo "pipetrain: stage 2, step 51: 2F0: waiting for activation from stage 1: peer closed the link: EOF"; exit 1;;
esac
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 3, RunDir: t.TempDir(), Out: &syncBuffer{}, Grace: 2 * time.Second})
	if want := "stage 0 failed (exit status 3): stage 0: checkpoint of step 50: no space left on device"; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}
