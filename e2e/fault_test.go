package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/stages"
)

// stagePID finds the process running stage i of the run in runDir.
func stagePID(t *testing.T, runDir string, i int) int {
	t.Helper()
	return processPID(runDir, "--stage", fmt.Sprint(i))
}

// processPID finds the stage process of the run in runDir whose command
// line also has each flag of flags next to its value.
func processPID(runDir string, flags ...string) int {
	want := append([]string{"--run-dir", runDir}, flags...)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if containsRun(args, want) {
			return pid
		}
	}
	return 0
}

// containsRun reports whether args is a stage command holding want's
// flags, each next to its value.
func containsRun(args, want []string) bool {
	joined := "\x00" + strings.Join(args, "\x00") + "\x00"
	if !strings.Contains(joined, "\x00stage\x00") {
		return false
	}
	for i := 0; i+1 < len(want); i += 2 {
		if !strings.Contains(joined, "\x00"+want[i]+"\x00"+want[i+1]+"\x00") {
			return false
		}
	}
	return true
}

// killAndAwaitRecovery kills pid (what names it) with SIGKILL and waits for
// the launch to finish on its own, failing the test if it does not; it
// returns the launch's output.
func killAndAwaitRecovery(t *testing.T, pid int, what string, out *syncBuffer, done chan error) string {
	t.Helper()
	if pid == 0 {
		t.Fatalf("%s's process not found:\n%s", what, out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("launch did not recover: %v\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("launch did not finish:\n%s", out.String())
	}
	return out.String()
}

// waitForStep polls the run's metrics until a step at least step is logged.
func waitForStep(t *testing.T, runDir string, step int, timeout time.Duration, out *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ms, _ := stages.ReadMetrics(filepath.Join(runDir, "metrics.jsonl"))
		if len(ms) > 0 && ms[len(ms)-1].Step >= step {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("step %d not reached within %v:\n%s", step, timeout, out.String())
}

// start runs pipetrain in the background.
func start(t *testing.T, env []string, args ...string) (*exec.Cmd, *syncBuffer, chan error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, done := startCmd(t, cmd)
	return cmd, out, done
}

// startCmd starts cmd in the background, its output and exit to come; the
// test's end kills it if it still runs.
func startCmd(t *testing.T, cmd *exec.Cmd) (*syncBuffer, chan error) {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd.Path, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return out, done
}

// noStageLeft checks that no stage process of the run is alive and that every
// stage's port can be bound again.
func noStageLeft(t *testing.T, cfgPath, runDir string) {
	t.Helper()
	c, err := configs.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Stages {
		if pid := stagePID(t, runDir, i); pid != 0 {
			t.Errorf("stage %d (pid %d) still running after launch exited", i, pid)
		}
		l, err := net.Listen("tcp", c.Stages[i].Address)
		if err != nil {
			t.Errorf("stage %d's port still bound: %v", i, err)
			continue
		}
		l.Close()
	}
}

// TestKilledStageRecoversBitIdentical kill -9s a middle stage of a 4-stage launch
// at a random step; launch must restart the job from its last complete checkpoint
// and end with the weights and losses of a run never interrupted, bit for bit.
func TestKilledStageRecoversBitIdentical(t *testing.T) {
	needData(t)
	const steps = 60
	cfg := withFreshAddresses(t, defaultConfig)
	env := []string{"PIPETRAIN_CHECKPOINT_EVERY=5", "PIPETRAIN_TRAIN_EVALUATE=false"}
	clean := t.TempDir()
	if r := run(t, 3*time.Minute, env, "launch", "--config", cfg, "--steps", fmt.Sprint(steps), "--run-dir", clean); r.err != nil {
		t.Fatalf("uninterrupted launch: %v\n%s", r.err, r.out)
	}

	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	killAt, victim := 8+rng.IntN(35), 1+rng.IntN(2)
	t.Logf("seed %d: killing stage %d at step %d", seed, victim, killAt)
	dir := t.TempDir()
	_, out, done := start(t, env, "launch", "--config", cfg, "--steps", fmt.Sprint(steps), "--run-dir", dir)
	waitForStep(t, dir, killAt, 2*time.Minute, out)
	text := killAndAwaitRecovery(t, stagePID(t, dir, victim), fmt.Sprintf("stage %d", victim), out, done)
	for _, want := range []string{fmt.Sprintf("stage %d failed", victim), "signal: killed", "restarting from the checkpoint of step", " lost), restart 1 of 3", "resumed from the checkpoint of step"} {
		if !strings.Contains(text, want) {
			t.Errorf("launch output lacks %q:\n%s", want, text)
		}
	}
	lost := regexp.MustCompile(fmt.Sprintf(`\[stage [0-9]\] pipetrain: .*(from|to) stage %d \(`, victim))
	if !lost.MatchString(text) {
		t.Errorf("no neighbour named stage %d as the stage it lost:\n%s", victim, text)
	}
	sameRun(t, clean, dir, steps)
	noStageLeft(t, cfg, dir)
}

// TestHungStageDetected SIGSTOPs a middle stage: a neighbour must notice within
// transport.recv_timeout, the launcher must blame the stopped stage (not the
// neighbour that gave up first, nor one waiting in turn), and the launch must
// end with no process left.
func TestHungStageDetected(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	const timeout = 3 * time.Second
	env := []string{"PIPETRAIN_TRANSPORT_RECV_TIMEOUT=" + timeout.String(), "PIPETRAIN_RECOVERY_MAX_RESTARTS=0", "PIPETRAIN_TRAIN_EVALUATE=false"}
	dir := t.TempDir()
	_, out, done := start(t, env, "launch", "--config", cfg, "--steps", "100000", "--run-dir", dir)
	waitForStep(t, dir, 5, 2*time.Minute, out)
	pid := stagePID(t, dir, 2)
	if pid == 0 {
		t.Fatalf("stage 2's process not found:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("launch still running a minute after stage 2 hung:\n%s", out.String())
	}
	took := time.Since(stopped)
	text := out.String()
	if err == nil {
		t.Fatalf("launch succeeded with stage 2 hung:\n%s", text)
	}
	if !strings.Contains(text, "stage 2 stopped making progress: it answered no status query") || !strings.Contains(text, "recv_timeout "+timeout.String()) {
		t.Errorf("the error does not blame stage 2 and name the timeout:\n%s", text)
	}
	if m := regexpBlamed.FindString(text); m != "" {
		t.Errorf("the launcher blamed a stage that kept going: %q\n%s", m, text)
	}
	// The detecting stage names the action it was in, e.g. "1B3" or "3F2".
	if !regexpAction.MatchString(text) {
		t.Errorf("the error does not name the action:\n%s", text)
	}
	t.Logf("launch ended %v after stage 2 hung (recv_timeout %v)", took.Round(time.Millisecond), timeout)
	if took > timeout+10*time.Second {
		t.Errorf("took %v to stop after a hang, recv_timeout %v", took, timeout)
	}
	noStageLeft(t, cfg, dir)
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// regexpBlamed matches the launcher blaming a stage other than 2 as failed first.
var regexpBlamed = regexp.MustCompile(`pipetrain: stage [013] failed \(`)

// regexpAction matches a stage error naming the action it was in: "stage 1, step 37: 1B3:".
var regexpAction = regexp.MustCompile(`stage [0-9]+, step [0-9]+: [0-9]+[FBIW][0-9]+`)

// TestLaunchOverUnixSockets runs the default config with its stages on Unix
// sockets: the same losses and weights as over TCP, bit for bit.
func TestLaunchOverUnixSockets(t *testing.T) {
	needData(t)
	tcp := withFreshAddresses(t, defaultConfig)
	sockets := t.TempDir()
	var addrs []string
	for i := range loadConfig(t, tcp).Stages {
		addrs = append(addrs, fmt.Sprintf("unix:%s/stage-%d.sock", sockets, i))
	}
	unix := withAddresses(t, tcp, addrs)
	env := []string{"PIPETRAIN_TRAIN_EVALUATE=false"}
	a, b := t.TempDir(), t.TempDir()
	if r := run(t, 2*time.Minute, env, "launch", "--config", tcp, "--steps", "10", "--run-dir", a); r.err != nil {
		t.Fatalf("over TCP: %v\n%s", r.err, r.out)
	}
	if r := run(t, 2*time.Minute, env, "launch", "--config", unix, "--steps", "10", "--run-dir", b); r.err != nil {
		t.Fatalf("over Unix sockets: %v\n%s", r.err, r.out)
	}
	sameRun(t, a, b, 10)
	if left, _ := filepath.Glob(filepath.Join(sockets, "*.sock")); len(left) != 0 {
		t.Errorf("socket files left behind: %v", left)
	}
}
