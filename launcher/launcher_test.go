package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeStage writes a script that behaves like a stage: it prints a line, then does
// what its stage index says (the arguments are "stage --config C --stage N ...").
func fakeStage(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-pipetrain")
	script := "#!/bin/sh\nstage=$5\n" + body
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAllStagesSucceed(t *testing.T) {
	var out syncBuffer
	dir := t.TempDir()
	bin := fakeStage(t, "echo \"stage $stage up\"\necho \"args $*\"\nexit 0\n")
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 3, RunDir: dir, ExtraArgs: []string{"--steps", "7"}, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"[stage 0] stage 0 up", "[stage 2] stage 2 up", "[stage 1] args stage --config c.yaml --stage 1 --run-dir " + dir + " --steps 7"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	log, err := os.ReadFile(filepath.Join(dir, "logs", "stage-1.log"))
	if err != nil || !strings.HasPrefix(string(log), "stage 1 up\n") {
		t.Errorf("stage log: %q, %v", log, err)
	}
}

func TestOneFailureStopsTheRest(t *testing.T) {
	var out syncBuffer
	bin := fakeStage(t, `trap 'echo "stage $stage stopping"; exit 1' TERM
if [ "$stage" = 1 ]; then sleep 0.3; echo "boom: link broke"; exit 3; fi
sleep 30 & wait
`)
	start := time.Now()
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 3, RunDir: t.TempDir(), Out: &out, Grace: 5 * time.Second})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 1 || se.LastLine != "boom: link broke" {
		t.Fatalf("error %v, want stage 1's failure with its last line", err)
	}
	if !strings.Contains(err.Error(), "stage 1 failed (exit status 3); its last output: boom: link broke") {
		t.Errorf("message: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v: the other stages were not stopped", took)
	}
	if !strings.Contains(out.String(), "[stage 0] stage 0 stopping") || !strings.Contains(out.String(), "[stage 2] stage 2 stopping") {
		t.Errorf("the other stages were not asked to stop:\n%s", out.String())
	}
}

func TestStageIgnoringSIGTERMIsKilled(t *testing.T) {
	bin := fakeStage(t, `if [ "$stage" = 0 ]; then exit 2; fi
trap '' TERM
while true; do sleep 1; done
`)
	start := time.Now()
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: t.TempDir(), Out: &syncBuffer{}, Grace: 300 * time.Millisecond})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 0 {
		t.Fatalf("error %v, want stage 0's failure", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a stage ignoring SIGTERM kept launch waiting %v", took)
	}
}

func TestCancelStopsEveryStage(t *testing.T) {
	bin := fakeStage(t, "trap 'exit 1' TERM\nsleep 30 & wait\n")
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("interrupted by test")
	time.AfterFunc(300*time.Millisecond, func() { cancel(cause) })
	start := time.Now()
	err := Run(ctx, Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, RunDir: t.TempDir(), Out: &syncBuffer{}})
	if !errors.Is(err, cause) {
		t.Fatalf("error %v, want the cancellation cause", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v to stop", took)
	}
}

// With replicas every (stage, replica) runs as its own process, named so in
// the output and in the error; a process exiting with ExitRepeats says a
// restart would repeat its failure.
func TestReplicaProcessesAndRepeatedFailure(t *testing.T) {
	var out syncBuffer
	bin := fakeStage(t, `replica=$9
trap 'exit 1' TERM
echo "up: stage $stage replica $replica"
if [ "$stage" = 1 ] && [ "$replica" = 1 ]; then sleep 0.3; echo "replicas diverged"; exit 3; fi
sleep 30 & wait
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 2, RunDir: t.TempDir(), Out: &out, Grace: 5 * time.Second})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 1 || se.Replica != 1 || !se.Repeats() || se.Process() != "stage 1 replica 1" {
		t.Fatalf("error %v (%+v), want stage 1 replica 1's failure, one a restart repeats", err, se)
	}
	for s := range 2 {
		for r := range 2 {
			if want := fmt.Sprintf("[stage %d replica %d] up: stage %d replica %d", s, r, s, r); !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	}
	var plain *StageError
	err = Run(context.Background(), Options{Binary: fakeStage(t, "exit 1\n"), ConfigPath: "c.yaml", Stages: 1, RunDir: t.TempDir(), Out: &syncBuffer{}})
	if !errors.As(err, &plain) || plain.Repeats() {
		t.Errorf("exit 1: %v, Repeats %v; want a failure a restart may cure", err, plain != nil && plain.Repeats())
	}
}

// TestExpendableReplicaIsLeftBehind fails stage 0 of replica 2 of an
// Expendable run: its stage 1 is stopped, rank 0 is told both ranks are
// lost, and the run succeeds on replicas 0 and 1 alone.
func TestExpendableReplicaIsLeftBehind(t *testing.T) {
	var out syncBuffer
	bin := fakeStage(t, `replica=$9
trap 'exit 1' TERM
if [ "$stage" = 0 ] && [ "$replica" = 2 ]; then sleep 0.2; exit 3; fi
if [ "$replica" = 2 ]; then sleep 30 & wait; fi
if [ "$stage" = 0 ] && [ "$replica" = 0 ]; then timeout 3 cat; fi
sleep 1
echo "done: stage $stage replica $replica"
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 3, RunDir: t.TempDir(), Out: &out, Grace: 5 * time.Second,
		Expendable: func(replica int) bool { return replica != 0 }})
	if err != nil {
		t.Fatalf("run failed with replica 2 expendable: %v\n%s", err, out.String())
	}
	for _, want := range []string{"stage 0 replica 2 failed: exit status 3", "the run goes on without replica 2",
		"[stage 0 replica 0] lost 2", "[stage 0 replica 0] lost 5", "done: stage 1 replica 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestExpendableRunFailsWithItsLastReplica: a failure that would leave no
// replica stops the run as any failure does.
func TestExpendableRunFailsWithItsLastReplica(t *testing.T) {
	bin := fakeStage(t, `replica=$7
trap 'exit 1' TERM
if [ "$stage" = 0 ]; then sleep 0.2; exit 3; fi
sleep 30 & wait
`)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 1, RunDir: t.TempDir(), Out: &syncBuffer{}, Grace: 5 * time.Second,
		Expendable: func(int) bool { return true }})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != 0 {
		t.Fatalf("error %v, want stage 0's failure", err)
	}
}

// rejoinStage is a fake stage for the rejoin tests: stage 0 of replica 2
// fails (in its restarted life too when failAgain), its stage 1 runs
// until stopped, and replica 0 waits until replica 2's restarted stage 0
// has started, so that it is still running when the restart comes. A
// restarted process asks for its step and says what it heard.
func rejoinStage(t *testing.T, failAgain bool) (bin, dir string) {
	dir = t.TempDir()
	again := ""
	if failAgain {
		again = `if [ "$stage" = 0 ]; then exit 3; fi`
	}
	bin = fakeStage(t, `replica=$9
trap 'exit 1' TERM
case "$*" in *"--rejoin 7"*)
	if [ "$stage" = 0 ]; then touch `+dir+`/rejoined; fi
	`+again+`
	echo "`+RejoinAsk+`"; read answer
	echo "rejoined: stage $stage replica $replica, $answer"; exit 0;;
esac
if [ "$stage" = 0 ] && [ "$replica" = 2 ]; then sleep 0.2; exit 3; fi
if [ "$replica" = 2 ]; then sleep 30 & wait; fi
if [ "$replica" = 0 ]; then for i in $(seq 600); do [ -e `+dir+`/rejoined ] && break; sleep 0.05; done; fi
echo "done: stage $stage replica $replica"
`)
	return bin, dir
}

// TestExpendableReplicaRejoins fails stage 0 of replica 2 of a run whose
// expendable replicas rejoin: its stage 1 is stopped, both start again
// with the step Rejoin gives, both hear the one fresher step it gives when
// the first asks, their logs keep the first life's lines, and the run
// succeeds with all three replicas.
func TestExpendableReplicaRejoins(t *testing.T) {
	var out syncBuffer
	bin, dir := rejoinStage(t, false)
	var mu sync.Mutex
	readings := 6 // Rejoin's first answer is 7, then 8, ...
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 3, RunDir: dir, Out: &out, Grace: 5 * time.Second,
		Expendable: func(replica int) bool { return replica != 0 },
		Rejoin: func(int) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			readings++
			return readings, nil
		}, Rejoins: 2})
	if err != nil {
		t.Fatalf("run failed with replica 2 rejoining: %v\n%s", err, out.String())
	}
	for _, want := range []string{"stage 0 replica 2 failed: exit status 3", "restarting replica 2 to rejoin the run (restart 1 of 2)",
		"[stage 0 replica 2] rejoined: stage 0 replica 2, rejoin 8", "[stage 1 replica 2] rejoined: stage 1 replica 2, rejoin 8", "done: stage 1 replica 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "goes on without replica 2") || strings.Contains(out.String(), "lost ") {
		t.Errorf("replica 2 was given up on:\n%s", out.String())
	}
	log, err := os.ReadFile(filepath.Join(dir, "logs", LogFile(1, 2, 3)))
	if want := "--- replica 2 restarted (restart 1), rejoining the run ---\n" + RejoinAsk + "\nrejoined: stage 1 replica 2, rejoin 8\n"; err != nil || !strings.HasSuffix(string(log), want) {
		t.Errorf("stage 1 replica 2's log: %q, %v; want it to end %q", log, err, want)
	}
}

// TestRejoinsAreBounded: a replica that fails again after its last
// allowed restart is left behind, and the run succeeds without it.
func TestRejoinsAreBounded(t *testing.T) {
	var out syncBuffer
	bin, dir := rejoinStage(t, true)
	err := Run(context.Background(), Options{Binary: bin, ConfigPath: "c.yaml", Stages: 2, Replicas: 3, RunDir: dir, Out: &out, Grace: 5 * time.Second,
		Expendable: func(replica int) bool { return replica != 0 },
		Rejoin:     func(int) (int, error) { return 7, nil }, Rejoins: 1})
	if err != nil {
		t.Fatalf("run failed with replica 2 left behind: %v\n%s", err, out.String())
	}
	for _, want := range []string{"restarting replica 2 to rejoin the run (restart 1 of 1)",
		"the run goes on without replica 2 (restarted 1 time already, the most allowed)", "done: stage 1 replica 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
