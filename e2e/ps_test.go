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
			profileShowsServers(t, dir)
			if t.Failed() {
				os.WriteFile(dir+"/launch.out", []byte(res.out), 0o644)
			}
		})
	}
}

// profileShowsServers checks that the launched servers wrote their event
// logs in the run directory and that the profile shows their work: each
// of the 3 stages' groups (stage 0 on both servers, stage 1 on one) made
// its 20 updates from 60 pushes.
func profileShowsServers(t *testing.T, dir string) {
	t.Helper()
	res := run(t, time.Minute, nil, "profile", dir)
	if res.err != nil {
		t.Fatalf("profile: %v\n%s", res.err, res.out)
	}
	_, table, ok := strings.Cut(res.out, "each server's work on each stage's tensors")
	if !ok {
		t.Fatalf("profile shows no servers' table:\n%s", res.out)
	}
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[2] == "20" && f[3] == "60" {
			rows++
		}
	}
	if rows != 3 {
		t.Errorf("profile: %d of the servers' stages show 20 updates of 60 pushes, want 3:\n%s", rows, res.out)
	}
}

// psConfigFile writes a 2-stage, 3-worker config with 2 parameter servers
// on free ports and returns its path and the servers' addresses.
func psConfigFile(t *testing.T, mode string) (string, []string) {
	return psConfigWith(t, mode, 20, "checkpoint: {every: 0}")
}

// psConfigWith is psConfigFile's config with steps steps and the extra
// top-level lines extra.
func psConfigWith(t *testing.T, mode string, steps int, extra string) (string, []string) {
	t.Helper()
	ports := freePorts(t, 2)
	body := `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 192, micro_batches: 2}
` + fmt.Sprintf("train: {steps: %d, evaluate: true, optimizer: {name: adam, lr: 0.001}}\n", steps) + `schedule: 1f1b
` + extra + "\n" + fmt.Sprintf("parameter_servers: {count: 2, mode: %s, addresses: [%s]}", mode, strings.Join(ports, ", "))
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
// launch without restarts: every worker stage that talks to it fails
// naming its address, and launch exits with an error instead of hanging.
func TestKilledServerStopsTheJob(t *testing.T) {
	needData(t)
	cfg, addrs := psConfigWith(t, "sync", 20, "checkpoint: {every: 0}\nrecovery: {max_restarts: 0}")
	dir := t.TempDir()
	text, err := launchAndKill(t, cfg, dir, 100000, "server 1", func() int { return serverPID(cfg, 1) }, time.Minute)
	if err == nil {
		t.Fatalf("launch succeeded with a server killed:\n%s", text)
	}
	if want := "parameter server at " + addrs[1]; !strings.Contains(text, want) {
		t.Errorf("no error names %q:\n%s", want, text)
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
	cfg, _ := psConfigWith(t, "async, max_staleness: 1", 20, "checkpoint: {every: 0}\nrecovery: {max_restarts: 0}")
	dir := t.TempDir()
	const steps = 60
	text := launchKillingWorker2(t, cfg, dir, steps)
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

// killServerAfter waits until the launch writing runDir has logged step,
// then kill -9s parameter server i of the config at cfg.
func killServerAfter(t *testing.T, cfg, runDir string, i, step int, out *syncBuffer) {
	t.Helper()
	waitForStep(t, runDir, step, time.Minute, out)
	pid := serverPID(cfg, i)
	if pid == 0 {
		t.Fatalf("no process of server %d:\n%s", i, out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// TestKilledServerResumesFromTheCheckpoint kill -9s parameter server 1 of
// a sync launch that checkpoints every 5 steps, after step 8: the servers
// restart from their shards of the newest committed checkpoint and the
// stages from their parts, by launch itself (recovery.max_restarts) or by
// launch --resume, and the run ends with every step's loss, the weights and
// the evaluation of the one-process reference bit for bit (which a run
// never interrupted equals: TestParameterServersEqualReference). Launch
// names the server that died, which the stages' errors name only by address.
func TestKilledServerResumesFromTheCheckpoint(t *testing.T) {
	needData(t)
	const steps = 40
	refCfg, _ := psConfigWith(t, "sync", steps, "checkpoint: {every: 5}")
	ref := reference(t, refCfg)
	for _, how := range []string{"restart", "resume"} {
		t.Run(how, func(t *testing.T) {
			restarts := map[string]int{"restart": 1, "resume": 0}[how]
			cfg, addrs := psConfigWith(t, "sync", steps, fmt.Sprintf("checkpoint: {every: 5}\nrecovery: {max_restarts: %d}", restarts))
			dir := t.TempDir()
			_, out, done := start(t, nil, "launch", "--config", cfg, "--run-dir", dir)
			killServerAfter(t, cfg, dir, 1, 8, out)
			var err error
			select {
			case err = <-done:
			case <-time.After(3 * time.Minute):
				t.Fatalf("launch still running 3 minutes after server 1 was killed:\n%s", out.String())
			}
			text := out.String()
			for _, want := range []string{"parameter server at " + addrs[1], "pipetrain: parameter server 1 had failed (signal: killed) before the stages did"} {
				if !strings.Contains(text, want) {
					t.Errorf("no %q in launch's output:\n%s", want, text)
				}
			}
			if how == "resume" {
				if err == nil || !strings.Contains(text, "pipetrain launch --resume "+dir) {
					t.Fatalf("launch without restarts: %v; want a failure that says how to resume:\n%s", err, text)
				}
				r := run(t, 3*time.Minute, nil, "launch", "--resume", dir)
				if r.err != nil {
					t.Fatalf("launch --resume: %v\n%s", r.err, r.out)
				}
				text = r.out
			} else if err != nil {
				t.Fatalf("launch with a restart: %v\n%s", err, text)
			}
			m := regexp.MustCompile(`\[ps 1\] parameter server 1: resumed from the checkpoint of step (\d+)`).FindStringSubmatch(text)
			if m == nil {
				t.Fatalf("server 1 did not resume from a checkpoint:\n%s", text)
			}
			t.Logf("%s: the servers resumed from the checkpoint of step %s", how, m[1])
			if from, _ := strconv.Atoi(m[1]); from < 5 || from%5 != 0 {
				t.Errorf("server 1 resumed from step %d; want a checkpoint of checkpoint.every 5 at or after step 5", from)
			}
			if !strings.Contains(text, "[ps 0] parameter server 0: resumed from the checkpoint of step "+m[1]) {
				t.Errorf("server 0 did not resume from step %s:\n%s", m[1], text)
			}
			if !strings.Contains(text, fmt.Sprintf("stage 1: %d updates", steps)) {
				t.Errorf("no server ended with stage 1's %d updates:\n%s", steps, text)
			}
			sameRun(t, ref, dir, steps)
			sameEval(t, ref, dir)
			if t.Failed() {
				t.Logf("launch's output:\n%s\n%s", out.String(), text)
			}
		})
	}
}

// TestInterruptedServersResume sends Ctrl-C's signal to a sync launch with
// parameter servers that checkpoints every 5 steps: every process stops,
// launch exits 130 naming the newest complete checkpoint (the servers keep
// their state only at checkpoint.every's steps, so the step the stages stop
// at has a checkpoint only when it is one of those), and launch --resume
// ends with the reference's losses, weights and evaluation bit for bit.
func TestInterruptedServersResume(t *testing.T) {
	needData(t)
	const steps = 40
	cfg, _ := psConfigWith(t, "sync", steps, "checkpoint: {every: 5}")
	ref := reference(t, cfg)
	dir := t.TempDir()
	cmd, out, done := start(t, nil, "launch", "--config", cfg, "--run-dir", dir)
	waitForStep(t, dir, 7, time.Minute, out)
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
	m := regexp.MustCompile(`every stage stopped after step (\d+); (?:its checkpoint was not committed, the newest complete one is of step (\d+)|the checkpoint of step (\d+) is complete); continue with`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("launch did not say where it stopped and which checkpoint to continue from:\n%s", text)
	}
	stop, _ := strconv.Atoi(m[1])
	from, _ := strconv.Atoi(m[2] + m[3])
	t.Logf("stopped after step %d; the newest complete checkpoint is of step %d", stop, from)
	if from != stop-stop%5 || from < 5 {
		t.Errorf("stopped after step %d with the checkpoint of step %d complete; want that of step %d", stop, from, stop-stop%5)
	}
	noStageLeft(t, cfg, dir)
	for i := range 2 {
		if pid := serverPID(cfg, i); pid != 0 {
			t.Errorf("server %d (pid %d) still running after launch exited", i, pid)
		}
	}
	r := run(t, 3*time.Minute, nil, "launch", "--resume", dir)
	if r.err != nil {
		t.Fatalf("launch --resume: %v\n%s", r.err, r.out)
	}
	if want := fmt.Sprintf("parameter server 1: resumed from the checkpoint of step %d", from); !strings.Contains(r.out, want) {
		t.Errorf("no %q in the resumed launch's output:\n%s", want, r.out)
	}
	sameRun(t, ref, dir, steps)
	sameEval(t, ref, dir)
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
	text := launchKillingWorker2(t, cfg, dir, steps)
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
// stage's death does without servers: with recovery.max_restarts 0 (no
// restart of the job from a checkpoint), launch fails naming the killed
// process, and restarts no worker.
func TestSyncLaunchStopsAtAKilledWorker(t *testing.T) {
	needData(t)
	cfg, _ := psConfigWith(t, "sync", 20, "checkpoint: {every: 0}\nrecovery: {max_restarts: 0}")
	dir := t.TempDir()
	text, err := launchAndKill(t, cfg, dir, 100000, "stage 0 replica 2", worker2Stage0(dir), time.Minute)
	if err == nil {
		t.Fatalf("launch succeeded with a sync worker killed:\n%s", text)
	}
	if !strings.Contains(text, "stage 0 replica 2 failed (signal: killed)") {
		t.Errorf("the failure does not name the killed stage 0 replica 2:\n%s", text)
	}
	if strings.Contains(text, "rejoin") || strings.Contains(text, "goes on without") {
		t.Errorf("a sync worker was restarted or left behind:\n%s", text)
	}
}

// launchAndKill launches cfg for steps steps in dir, kill -9s the process
// find names (who, in messages) after step 5, and returns launch's output
// and its result once it ends, failing the test if it has not within wait.
func launchAndKill(t *testing.T, cfg, dir string, steps int, who string, find func() int, wait time.Duration) (string, error) {
	t.Helper()
	_, out, done := start(t, nil, "launch", "--config", cfg, "--steps", strconv.Itoa(steps), "--run-dir", dir)
	waitForStep(t, dir, 5, time.Minute, out)
	pid := find()
	if pid == 0 {
		t.Fatalf("no process of %s:\n%s", who, out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(wait):
		t.Fatalf("launch still running %v after %s was killed:\n%s", wait, who, out.String())
	}
	return "", nil
}

// worker2Stage0 finds stage 0 of worker 2 among dir's processes.
func worker2Stage0(dir string) func() int {
	return func() int { return processPID(dir, "--stage", "0", "--replica", "2") }
}

// launchKillingWorker2 is launchAndKill of stage 0 of worker 2, requiring
// the launch to succeed anyway.
func launchKillingWorker2(t *testing.T, cfg, dir string, steps int) string {
	t.Helper()
	text, err := launchAndKill(t, cfg, dir, steps, "stage 0 replica 2", worker2Stage0(dir), 3*time.Minute)
	if err != nil {
		t.Fatalf("launch failed with worker 2 killed: %v\n%s", err, text)
	}
	return text
}
