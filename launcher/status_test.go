package launcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStatusLineRoundTrips(t *testing.T) {
	for _, s := range []Status{
		{Stage: 2, Action: "2B3c1", Peer: 3, For: 2500 * time.Millisecond},
		{Stage: 0, Peer: -1, For: time.Microsecond},
	} {
		got, ok := ParseStatus(FormatStatus(s))
		if !ok || got != s {
			t.Errorf("%+v: parsed back as %+v, %v", s, got, ok)
		}
	}
	for _, line := range []string{"step 3/10 loss 2.0", "pipetrain-status: stage=x peer=1 for=1s", "pipetrain-status: stage=1 action=- for=1s"} {
		if _, ok := ParseStatus(line); ok {
			t.Errorf("%q parsed as a status line", line)
		}
	}
}

// waitChain is a fake job in which stage 0 gives up waiting for stage 1 after
// 0.3s; stages 1 and 3 answer status queries saying they wait for stage 2;
// stage 2 behaves as the body given.
func waitChain(stage2 string) string {
	return `trap 'exit 1' TERM
case $stage in
0) sleep 0.3; echo "pipetrain-status: stage=0 action=0B1 peer=1 for=3s"; echo "stage 0, step 4: 0B1: nothing arrived from stage 1"; exit 1;;
1) trap 'echo "pipetrain-status: stage=1 action=1B1 peer=2 for=2.9s"' USR1;;
2) ` + stage2 + `;;
3) trap 'echo "pipetrain-status: stage=3 action=3F2 peer=2 for=2.8s"' USR1;;
esac
while :; do sleep 30 & wait; done
`
}

// TestHungStageIsBlamed: the stage at the end of the chain of waits is blamed,
// whether it answers nothing (stopped) or says it is computing, and the
// message keeps the stage that failed and its last output.
func TestHungStageIsBlamed(t *testing.T) {
	for _, tc := range []struct {
		name, stage2, why string
	}{
		{"silent", `trap '' USR1`, "it answered no status query within 500ms: stopped, or hung"},
		{"computing", `trap 'echo "pipetrain-status: stage=2 action=2F5 peer=-1 for=31s"' USR1`, "stage 2 has been computing 2F5 for 31s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			bin := fakeStage(t, waitChain(tc.stage2))
			err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 4, RunDir: t.TempDir(), Out: &out, Grace: 2 * time.Second, QueryTimeout: 500 * time.Millisecond})
			var se *StageError
			if !errors.As(err, &se) || se.Stage != 2 || !se.Hung || se.Detector != 0 {
				t.Fatalf("error %v (%+v), want stage 2 blamed as hung, found by stage 0", err, se)
			}
			msg := err.Error()
			for _, want := range []string{"stage 2 stopped making progress: " + tc.why, "stage 0 has waited 3s in 0B1 for stage 1", "stage 1 has waited 2.9s in 1B1 for stage 2",
				"stage 0 failed (exit status 1); its last output: stage 0, step 4: 0B1: nothing arrived from stage 1"} {
				if !strings.Contains(msg, want) {
					t.Errorf("message lacks %q:\n%s", want, msg)
				}
			}
			if strings.Contains(out.String(), "pipetrain-status") {
				t.Errorf("status lines reached the terminal:\n%s", out.String())
			}
		})
	}
}

// TestFailureWithoutWaitIsItsOwn: a stage that fails while not waiting on a
// neighbour is blamed itself, as before.
func TestFailureWithoutWaitIsItsOwn(t *testing.T) {
	var out syncBuffer
	bin := fakeStage(t, `trap 'exit 1' TERM
if [ "$stage" = 1 ]; then sleep 0.2; echo "pipetrain-status: stage=1 action=1F0 peer=-1 for=1ms"; echo "out of memory"; exit 2; fi
trap 'echo "pipetrain-status: stage=$stage action=- peer=1 for=1s"' USR1
while :; do sleep 30 & wait; done
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 3, RunDir: t.TempDir(), Out: &out, Grace: 2 * time.Second, QueryTimeout: 300 * time.Millisecond})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 1 || se.Hung || se.LastLine != "out of memory" {
		t.Fatalf("error %v, want stage 1's own failure", err)
	}
}

// TestNeighboursOfAKilledStageSpeakFirst: when a stage dies of a signal, the
// others get a moment to fail by themselves, naming the stage they lost,
// before the launcher stops them.
func TestNeighboursOfAKilledStageSpeakFirst(t *testing.T) {
	var out syncBuffer
	bin := fakeStage(t, `trap 'echo "stage $stage: terminated"; exit 1' TERM
if [ "$stage" = 1 ]; then sleep 0.2; kill -9 $$; fi
sleep 0.4; echo "stage $stage: lost stage 1: connection reset"; exit 1
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 3, RunDir: t.TempDir(), Out: &out, Grace: 2 * time.Second})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 1 {
		t.Fatalf("error %v, want stage 1 blamed", err)
	}
	text := out.String()
	for _, want := range []string{"[stage 0] stage 0: lost stage 1", "[stage 2] stage 2: lost stage 1"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "terminated") {
		t.Errorf("a neighbour was stopped before it could name the stage it lost:\n%s", text)
	}
}

func TestStatusNamesRingWaits(t *testing.T) {
	s := Status{Stage: 0, Replica: 1, Action: "", Peer: 0, Ring: true, PeerReplica: 0, For: 3 * time.Second}
	line := FormatStatus(s)
	got, ok := ParseStatus(line)
	if !ok || got != s {
		t.Fatalf("ParseStatus(%q) = %+v, %v; want %+v", line, got, ok, s)
	}
	if want := "stage 0 replica 1 has waited 3s for stage 0 replica 0 (the all-reduce ring)"; got.String() != want {
		t.Errorf("String() = %q, want %q", got.String(), want)
	}
	// A process without replicas prints what it always printed.
	plain := FormatStatus(Status{Stage: 2, Action: "2B1", Peer: 3, For: time.Second})
	if strings.Contains(plain, "replica") {
		t.Errorf("plain status %q names replicas", plain)
	}
	if got, ok := ParseStatus(plain); !ok || got.Ring || got.Replica != 0 {
		t.Errorf("ParseStatus(%q) = %+v, %v", plain, got, ok)
	}
}
