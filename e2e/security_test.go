package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/stages"
	"github.com/pipetrain/pipetrain/transport"
)

// authMLP is a 2-stage run whose addresses are auto and whose config sets
// no token: launch serves its rendezvous itself. Stage 1 serves metrics.
const authMLP = `model: {name: mlp, dtype: float32, input: 784, hidden: [64], classes: 10}
data: {batch_size: 32, micro_batches: 2}
train: {steps: 1000000, evaluate: false, optimizer: {name: sgd, lr: 0.05}}
checkpoint: {every: 0}
schedule: 1f1b
stages:
  - {layers: "0", address: auto}
  - {layers: "1", address: auto, metrics_address: "%s"}
`

// waitForLine waits for the n-th line of out matching re (n from 1) and
// returns re's first group in it, failing if the process ends first.
func waitForLine(t *testing.T, out *syncBuffer, done chan error, re string, n int) string {
	t.Helper()
	pattern := regexp.MustCompile(re)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if m := pattern.FindAllStringSubmatch(out.String(), -1); len(m) >= n {
			return m[n-1][1]
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the process ended (%v) before printing %q:\n%s", err, re, out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no line matching %q within a minute:\n%s", re, out.String())
	return ""
}

// stageToken is the token in the environment of the process of stage i of
// the run in runDir ("" without one).
func stageToken(t *testing.T, runDir string, i int) string {
	t.Helper()
	pid := stagePID(t, runDir, i)
	if pid == 0 {
		t.Fatalf("stage %d's process not found", i)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, configs.TokenVariable+"="); ok {
			return v
		}
	}
	return ""
}

// checkNotInCommandLines fails if secret is on the command line of the
// process pid or of any stage of the run in runDir: every user can read those.
func checkNotInCommandLines(t *testing.T, runDir string, pid int, secret string) {
	t.Helper()
	pids := []int{pid, stagePID(t, runDir, 0), stagePID(t, runDir, 1)}
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			t.Fatalf("pid %d: %v", p, err)
		}
		if strings.Contains(string(b), secret) {
			t.Errorf("pid %d's command line holds the token: %q", p, b)
		}
	}
}

// checkNotInRunDir fails if any file under runDir holds one of secrets.
func checkNotInRunDir(t *testing.T, runDir string, secrets ...string) {
	t.Helper()
	files := 0
	err := filepath.WalkDir(runDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("%s holds the launch's token", path)
			}
		}
		return nil
	})
	if err != nil || files < 3 {
		t.Fatalf("reading the run directory: %v (%d files)", err, files)
	}
}

// probeWithoutToken plays a local process of another user that knows the
// launch's ports but not its token: it joins the rendezvous as rank 1,
// gathers a file into rank 0's run directory, dials stage 1's link as stage
// 0 and reads stage 1's metrics. Each must be refused for the missing token.
func probeWithoutToken(t *testing.T, cfg *configs.Config, rendezvous, link, metrics string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := cluster.RendezvousOptions{Timeout: 5 * time.Second}
	me := cluster.Entry{Rank: 1, Address: "127.0.0.1:1", ConfigDigest: cfg.Digest(), Build: cluster.Build()}
	if _, err := cluster.JoinRendezvous(ctx, rendezvous, me, o); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Errorf("joining the rendezvous at %s without the token: %v; want it refused for the token", rendezvous, err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "weights"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "weights", "stage-1.safetensors"), []byte("poison"), 0o600); err != nil {
		t.Fatal(err)
	}
	co := cluster.Coordinator{Addr: rendezvous, Rank: 1, Options: o}
	if _, err := co.Gather(ctx, dir, []string{"weights/stage-1.safetensors"}); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Errorf("gathering into rank 0's run directory without the token: %v; want it refused for the token", err)
	}
	hello := transport.Hello{Stage: 0, Stages: 2, ConfigDigest: cfg.Digest(), DType: transport.Float32, Shapes: [][]int{{16, 64}}}
	if l, err := transport.Dial(ctx, link, hello, transport.Options{ConnectTimeout: 5 * time.Second}); !errors.Is(err, transport.ErrUnauthenticated) {
		if l != nil {
			l.Close()
		}
		t.Errorf("dialing stage 1's link at %s without the token: %v; want it refused for the token", link, err)
	}
	if code, _, err := get(t, "http://"+metrics+"/metrics", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("reading stage 1's metrics without the token: status %d %v, want 401", code, err)
	}
}

// interrupt stops a launch with SIGINT, which checkpoints an agreed step,
// and waits for it to exit.
func interrupt(t *testing.T, launch *exec.Cmd, out *syncBuffer, done chan error) {
	t.Helper()
	if err := launch.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("interrupted launch: %v, want exit status 130:\n%s", err, out.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the interrupted launch did not stop:\n%s", out.String())
	}
}

// TestLaunchAuthenticatesItsRendezvous launches a config of auto addresses
// that sets no token, as another local user would find it: the rendezvous
// (joins and gathers), stage 1's link and its metrics refuse a process
// without the token. The stages share one fresh random token, which the
// metrics accept; it is in their environment only, on no command line and
// in no file of the run directory. A restart after a killed stage keeps it
// and refuses the same probes; launch --resume makes a new one.
func TestLaunchAuthenticatesItsRendezvous(t *testing.T) {
	needData(t)
	dir := t.TempDir()
	metrics := freePorts(t, 1)[0]
	path := filepath.Join(dir, "auto.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(authMLP, metrics)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig(t, path)
	runDir := filepath.Join(dir, "run")
	launch, out, done := start(t, nil, "launch", "--config", path, "--run-dir", runDir)
	const served, listens = `\[stage 0\] pipetrain: serving the rendezvous for 2 processes at (\S+) `, `\[stage 1\] pipetrain: stage 1 listens on (\S+);`
	rendezvous, link := waitForLine(t, out, done, served, 1), waitForLine(t, out, done, listens, 1)
	waitForStep(t, runDir, 2, time.Minute, out)

	probeWithoutToken(t, cfg, rendezvous, link, metrics)

	token := stageToken(t, runDir, 0)
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(token) {
		t.Fatalf("stage 0's %s is %q; want 32 random bytes in hex", configs.TokenVariable, token)
	}
	if other := stageToken(t, runDir, 1); other != token {
		t.Fatalf("stages 0 and 1 hold different tokens")
	}
	if code, _, err := get(t, "http://"+metrics+"/metrics", token); err != nil || code != http.StatusOK {
		t.Errorf("reading stage 1's metrics with the launch's token: status %d %v, want 200", code, err)
	}
	checkNotInCommandLines(t, runDir, launch.Process.Pid, token)

	// A supervised restart starts every process again, with the launch's
	// token, and they guard the new rendezvous and links with it.
	const progress = `\[stage 1\] (step \d+/)`
	logged := len(regexp.MustCompile(progress).FindAllString(out.String(), -1))
	killed := stagePID(t, runDir, 1)
	if err := syscall.Kill(killed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitForLine(t, out, done, `(pipetrain: stage 1 failed after step \d+; restarting from .*, restart 1 of 3)`, 1)
	rendezvous, link = waitForLine(t, out, done, served, 2), waitForLine(t, out, done, listens, 2)
	waitForLine(t, out, done, progress, logged+2) // the one it may have printed as it was killed, then the restart's
	for i := range 2 {
		if got := stageToken(t, runDir, i); got != token {
			t.Errorf("restarted stage %d holds another token than the launch's", i)
		}
	}
	probeWithoutToken(t, cfg, rendezvous, link, metrics)
	checkNotInCommandLines(t, runDir, launch.Process.Pid, token)
	interrupt(t, launch, out, done)
	checkNotInRunDir(t, runDir, token)

	// The resumed launch restarts every process, with a token of its own.
	ms, err := stages.ReadMetrics(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil || len(ms) == 0 {
		t.Fatalf("metrics of the interrupted run: %v", err)
	}
	from := ms[len(ms)-1].Step
	launch, out, done = start(t, nil, "launch", "--resume", runDir)
	waitForLine(t, out, done, `(pipetrain: resuming \S+ from the checkpoint of step \d+)`, 1)
	waitForStep(t, runDir, from+2, time.Minute, out)
	resumed := stageToken(t, runDir, 0)
	if resumed == "" || resumed == token {
		t.Errorf("the resumed launch's token is %q; want a fresh one", resumed)
	}
	checkNotInCommandLines(t, runDir, launch.Process.Pid, resumed)
	interrupt(t, launch, out, done)
	checkNotInRunDir(t, runDir, token, resumed)
}
