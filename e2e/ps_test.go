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
	return psConfigWith(t, mode, "")
}

// psConfigWith is psConfigFile with more settings (YAML lines) added.
func psConfigWith(t *testing.T, mode, more string) (string, []string) {
	t.Helper()
	ports := freePorts(t, 2)
	body := `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 192, micro_batches: 2}
train: {steps: 20, evaluate: true, optimizer: {name: adam, lr: 0.001}}
schedule: 1f1b
checkpoint: {every: 0}
` + more + fmt.Sprintf("parameter_servers: {count: 2, mode: %s, addresses: [%s]}", mode, strings.Join(ports, ", "))
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

// TestAsyncLaunchSurvivesAKilledWorker kill -9s stage 0 of worker 2 of an
// async launch (max_staleness 1) that restarts no worker
// (recovery.max_restarts 0): launch goes on without worker 2, stopping
// its other stage, and completes; the servers note worker 2's departure,
// apply every push of workers 0 and 1 (each its own update) and those
// worker 2 made before it died, each once.
func TestAsyncLaunchSurvivesAKilledWorker(t *testing.T) {
	needData(t)
	cfg, _ := psConfigWith(t, "async, max_staleness: 1", "recovery: {max_restarts: 0}\n")
	dir := t.TempDir()
	const steps = 60
	_, out, done := start(t, nil, "launch", "--config", cfg, "--steps", strconv.Itoa(steps), "--run-dir", dir)
	waitForStep(t, dir, 5, time.Minute, out)
	pid := processPID(dir, "--stage", "0", "--replica", "2")
	if pid == 0 {
		t.Fatalf("no process of stage 0 replica 2:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("launch failed with worker 2 killed: %v\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("launch still running 3 minutes after worker 2 was killed:\n%s", out.String())
	}
	text := out.String()
	for _, want := range []string{"the run goes on without replica 2", "of worker 2 left without its goodbye", fmt.Sprintf("done: %d steps", steps)} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the output:\n%s", want, text)
		}
	}
	summary := regexp.MustCompile(`stage (\d): (\d+) updates, 0 pushes dropped; .*; pushes applied by worker: 0: (\d+), 1: (\d+)(?:, 2: (\d+))?`)
	seen := 0
	for _, m := range summary.FindAllStringSubmatch(text, -1) {
		seen++
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		if n(3) != steps || n(4) != steps {
			t.Errorf("stage %s: workers 0 and 1 had %d and %d pushes applied, want %d each", m[1], n(3), n(4), steps)
		}
		if n(5) >= steps {
			t.Errorf("stage %s: worker 2, killed, had %d pushes applied of %d steps", m[1], n(5), steps)
		}
		if n(2) != n(3)+n(4)+n(5) {
			t.Errorf("stage %s: %d updates from %d pushes: a push applied twice or not at all", m[1], n(2), n(3)+n(4)+n(5))
		}
	}
	if seen != 3 { // server 0 holds stage 0's tensors, server 1 stages 0 and 1's
		t.Errorf("%d servers' stage summaries, want 3:\n%s", seen, text)
	}
}

// TestAsyncLaunchRestartsAKilledWorker kill -9s stage 0 of worker 2 of an
// async launch (max_staleness 1) after step 5: launch restarts both of
// worker 2's processes, which rejoin at one step, the one replica 0 had
// logged when they asked; the servers log the departure and the rejoin,
// the rejoined stages finish; the run completes, and on
// each server and stage workers 0 and 1 had all their pushes applied and
// worker 2 those before its death plus one for each step from its rejoin
// on, each push one update.
func TestAsyncLaunchRestartsAKilledWorker(t *testing.T) {
	needData(t)
	cfg, _ := psConfigFile(t, "async, max_staleness: 1")
	dir := t.TempDir()
	const steps = 60
	_, out, done := start(t, nil, "launch", "--config", cfg, "--steps", strconv.Itoa(steps), "--run-dir", dir)
	waitForStep(t, dir, 5, time.Minute, out)
	pid := processPID(dir, "--stage", "0", "--replica", "2")
	if pid == 0 {
		t.Fatalf("no process of stage 0 replica 2:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("launch failed with worker 2 killed: %v\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("launch still running 3 minutes after worker 2 was killed:\n%s", out.String())
	}
	text := out.String()
	for _, want := range []string{"restarting replica 2 to rejoin the run (restart 1 of 3)", fmt.Sprintf("done: %d steps", steps),
		"[stage 0 replica 2] stage 0 replica 2: rejoins the run at step", "[stage 1 replica 2] stage 1 replica 2: done in"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the output:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`pipetrain: stage 0 replica 2 failed \(signal: killed\).*; restarting replica 2 to rejoin`).MatchString(text) {
		t.Errorf("the restart does not blame the killed stage 0 replica 2:\n%s", text)
	}
	if strings.Contains(text, "goes on without replica 2") {
		t.Errorf("worker 2 was left behind, not restarted:\n%s", text)
	}
	// What each server's stage group had of worker 2 when it departed, and
	// the step it rejoined at.
	type group struct{ server, stage string }
	before, rejoined := map[group]int{}, map[group]int{}
	for _, m := range regexp.MustCompile(`\[ps (\d)\] parameter server \d: stage (\d) of worker 2 left without its goodbye \(killed, failed, or its connection lost\) after (\d+) push`).FindAllStringSubmatch(text, -1) {
		before[group{m[1], m[2]}], _ = strconv.Atoi(m[3])
	}
	for _, m := range regexp.MustCompile(`\[ps (\d)\] parameter server \d: stage (\d) of worker 2 rejoined, restarted: it trains from step (\d+) on`).FindAllStringSubmatch(text, -1) {
		rejoined[group{m[1], m[2]}], _ = strconv.Atoi(m[3])
	}
	// Both stages of worker 2 rejoin at one step, the one the servers saw.
	at := map[string]bool{}
	for _, m := range regexp.MustCompile(`\[stage \d replica 2\] stage \d replica 2: rejoins the run at step (\d+),`).FindAllStringSubmatch(text, -1) {
		at[m[1]] = true
	}
	for g, step := range rejoined {
		at[strconv.Itoa(step)] = true
		if len(at) != 1 {
			t.Errorf("worker 2's stages and servers name %d steps it rejoined at (server %s stage %s: %d):\n%s", len(at), g.server, g.stage, step, text)
			break
		}
	}
	summary := regexp.MustCompile(`\[ps (\d)\] parameter server \d: stage (\d): (\d+) updates, 0 pushes dropped; .*; pushes applied by worker: 0: (\d+), 1: (\d+), 2: (\d+)`)
	seen := 0
	for _, m := range summary.FindAllStringSubmatch(text, -1) {
		seen++
		g := group{m[1], m[2]}
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		from, ok := rejoined[g]
		if _, left := before[g]; !left || !ok {
			t.Errorf("server %s stage %s: departure logged %v, rejoin logged %v", g.server, g.stage, left, ok)
			continue
		}
		if n(4) != steps || n(5) != steps {
			t.Errorf("server %s stage %s: workers 0 and 1 had %d and %d pushes applied, want %d each", g.server, g.stage, n(4), n(5), steps)
		}
		// From step `from` (1-based) to the last, one push a step.
		if want := before[g] + steps - from + 1; n(6) != want || n(6) <= before[g] {
			t.Errorf("server %s stage %s: worker 2 had %d pushes applied, want the %d before its death and %d from step %d on", g.server, g.stage, n(6), before[g], steps-from+1, from)
		}
		if n(3) != n(4)+n(5)+n(6) {
			t.Errorf("server %s stage %s: %d updates from %d pushes: a push applied twice or not at all", g.server, g.stage, n(3), n(4)+n(5)+n(6))
		}
	}
	if seen != 3 { // server 0 holds stage 0's tensors, server 1 stages 0 and 1's
		t.Errorf("%d servers' stage summaries, want 3:\n%s", seen, text)
	}
	if t.Failed() {
		os.WriteFile(dir+"/launch.out", []byte(text), 0o644)
	}
}

// TestSyncLaunchStopsAtAKilledWorker: in sync mode every step waits for
// every worker's push, so kill -9 of a worker's stage stops the job, as a
// stage's death does without servers: launch fails naming the killed
// process and restarts no worker.
func TestSyncLaunchStopsAtAKilledWorker(t *testing.T) {
	needData(t)
	cfg, _ := psConfigFile(t, "sync")
	dir := t.TempDir()
	_, out, done := start(t, nil, "launch", "--config", cfg, "--steps", "100000", "--run-dir", dir)
	waitForStep(t, dir, 5, time.Minute, out)
	pid := processPID(dir, "--stage", "0", "--replica", "2")
	if pid == 0 {
		t.Fatalf("no process of stage 0 replica 2:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("launch succeeded with a sync worker killed:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("launch still running a minute after worker 2 was killed:\n%s", out.String())
	}
	text := out.String()
	if !strings.Contains(text, "stage 0 replica 2 failed (signal: killed)") {
		t.Errorf("the failure does not name the killed stage 0 replica 2:\n%s", text)
	}
	if strings.Contains(text, "rejoin") || strings.Contains(text, "goes on without") {
		t.Errorf("a sync worker was restarted or left behind:\n%s", text)
	}
}
