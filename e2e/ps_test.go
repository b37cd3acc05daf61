package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestParameterServersEqualReference launches 2 parameter servers and 3
// workers of a 2-stage pipeline as 8 processes over gRPC, in sync mode and
// in async mode with max_staleness 0, and requires every step's loss, the
// final weights and the test evaluation to equal the one-process
// reference's bit for bit.
func TestParameterServersEqualReference(t *testing.T) {
	needData(t)
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			cfg, _ := psConfigFile(t, mode)
			ref := reference(t, cfg)
			dir := t.TempDir()
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", dir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			for i := range 2 {
				if !strings.Contains(res.out, fmt.Sprintf("[ps %d] parameter server %d: done", i, i)) {
					t.Errorf("server %d did not finish:\n%s", i, res.out)
				}
			}
			if !strings.Contains(res.out, "stage 1: 20 updates, 0 pushes dropped") {
				t.Errorf("no server made stage 1's 20 updates:\n%s", res.out)
			}
			sameRun(t, ref, dir, 20)
			sameEval(t, ref, dir)
			if t.Failed() {
				os.WriteFile(dir+"/launch.out", []byte(res.out), 0o644)
			}
		})
	}
}

// psConfigFile writes a 2-stage, 3-worker config with 2 parameter servers
// on free ports and returns its path and the servers' addresses.
func psConfigFile(t *testing.T, mode string) (string, []string) {
	t.Helper()
	ports := freePorts(t, 2)
	body := `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 192, micro_batches: 2}
train: {steps: 20, evaluate: true, optimizer: {name: adam, lr: 0.001}}
schedule: 1f1b
checkpoint: {every: 0}
` + fmt.Sprintf("parameter_servers: {count: 2, mode: %s, addresses: [%s]}", mode, strings.Join(ports, ", "))
	return gridConfig(t, body, []string{`"0-1"`, `"2-3"`}, 3), ports
}

// serverPID finds the process of parameter server i of the config at path.
func serverPID(path string, i int) int {
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
		args := "\x00" + string(b)
		if strings.Contains(args, "\x00ps-server\x00") && strings.Contains(args, "\x00"+path+"\x00") && strings.Contains(args, fmt.Sprintf("\x00--index\x00%d\x00", i)) {
			return pid
		}
	}
	return 0
}

// TestKilledServerStopsTheJob kill -9s parameter server 1 of a running
// launch: every worker stage that talks to it fails naming its address,
// and launch exits with an error instead of hanging (the servers keep no
// checkpoints yet, so the run cannot resume).
func TestKilledServerStopsTheJob(t *testing.T) {
	needData(t)
	cfg, addrs := psConfigFile(t, "sync")
	dir := t.TempDir()
	_, out, done := start(t, nil, "launch", "--config", cfg, "--steps", "100000", "--run-dir", dir)
	waitForStep(t, dir, 5, time.Minute, out)
	pid := serverPID(cfg, 1)
	if pid == 0 {
		t.Fatalf("no process of server 1:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("launch succeeded with a server killed:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("launch still running a minute after server 1 was killed:\n%s", out.String())
	}
	if want := "parameter server at " + addrs[1]; !strings.Contains(out.String(), want) {
		t.Errorf("no error names %q:\n%s", want, out.String())
	}
}
