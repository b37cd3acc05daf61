// Package e2e runs the pipetrain binary as users do: one OS process per stage,
// talking gRPC on 127.0.0.1, compared with the one-process reference.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/testenv"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pipetrain-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "pipetrain")
	build := exec.Command("go", "build", "-o", binary, "../cmd/pipetrain")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building pipetrain:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const defaultConfig = "../configs/fmnist-mlp-4stage.yaml"

func needData(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist"); err != nil {
		testenv.RequireOrSkip(t, "Debian package dataset-fashion-mnist (installed by make deps)", err.Error())
	}
}

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var ls []net.Listener
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// withFreshAddresses copies a config, giving its stages free ports so tests can run
// next to each other and next to a user's runs.
func withFreshAddresses(t *testing.T, path string) string {
	t.Helper()
	return withAddresses(t, path, freePorts(t, len(loadConfig(t, path).Stages)))
}

// withRecompute copies a config whose stages are written {layers: ...} with
// every stage set to recompute: full.
func withRecompute(t *testing.T, path string) string {
	t.Helper()
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(text), "- {layers:", "- {recompute: full, layers:")
	if s == string(text) {
		t.Fatalf("%s: no stage written {layers: ...}", path)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// withAddresses copies a config with stage i at addrs[i].
func withAddresses(t *testing.T, path string, addrs []string) string {
	t.Helper()
	c := loadConfig(t, path)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	for i, addr := range addrs {
		s = strings.Replace(s, c.Stages[i].Address, addr, 1)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func loadConfig(t *testing.T, path string) *configs.Config {
	t.Helper()
	c, err := configs.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type result struct {
	out  string
	err  error
	took time.Duration
}

func run(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("pipetrain %v did not finish within %v:\n%s", args, timeout, buf.String())
	}
	return result{buf.String(), err, time.Since(start)}
}

// sameRun requires run got to have logged exactly steps steps (0: any number)
// with the losses and evaluations of run want, and the same final weights, bit
// for bit. It returns got's metrics.
func sameRun(t *testing.T, want, got string, steps int) []stages.Metric {
	t.Helper()
	a, err := stages.ReadMetrics(filepath.Join(want, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := stages.ReadMetrics(filepath.Join(got, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || len(a) != len(b) || (steps > 0 && len(a) != steps) {
		t.Fatalf("steps logged: %d in %s, %d in %s; want %d", len(a), want, len(b), got, steps)
	}
	for i := range a {
		if a[i].Step != b[i].Step || a[i].Loss != b[i].Loss || fmt.Sprint(a[i].Eval) != fmt.Sprint(b[i].Eval) {
			t.Errorf("step %d: loss %v eval %v, want %v %v", a[i].Step, b[i].Loss, b[i].Eval, a[i].Loss, a[i].Eval)
		}
	}
	wa := weights(t, want)
	if len(wa) == 0 {
		t.Fatalf("%s has no weights", want)
	}
	if err := checkpoint.Diff(wa, weights(t, got)); err != nil {
		t.Fatalf("weights differ: %v", err)
	}
	return b
}

// sameEval requires run got's evaluation after its last step (eval.json) to
// be run want's, byte for byte: the shortest decimal that reads back as the
// same float64, so the loss and the accuracy bit for bit.
func sameEval(t *testing.T, want, got string) {
	t.Helper()
	a, err := os.ReadFile(filepath.Join(want, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(got, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e stages.EvalResult
	if err := json.Unmarshal(a, &e); err != nil || e.Examples == 0 {
		t.Fatalf("%s/eval.json: %v, %d examples:\n%s", want, err, e.Examples, a)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("evaluations differ:\n%s/eval.json:\n%s%s/eval.json:\n%s", want, a, got, b)
	}
}

// reference trains cfg in one process, with the BLAS threads a stage of
// the pipelined run gets (so the two can be compared bit for bit), and
// returns its run directory.
func reference(t *testing.T, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", dir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	return dir
}

func weights(t *testing.T, runDir string) map[string]checkpoint.Tensor {
	t.Helper()
	w, err := checkpoint.ReadAll(filepath.Join(runDir, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestLaunchEqualsReference trains the default 4-stage config for 30 steps with each
// schedule (interleaved and interleaved-zb on the 8-layer interleaved config, over
// the ring; zb-v and dualpipev on the 8-layer V configs, whose stage 0 computes
// the loss), and with 1f1b and zb-h1 on every stage recomputing its forwards,
// in separate processes over gRPC, and requires every step's loss, the test
// evaluation after the last step (eval.json) and the final weights to equal
// the one-process reference's bit for bit.
func TestLaunchEqualsReference(t *testing.T) {
	needData(t)
	const steps = "30"
	cfg := withFreshAddresses(t, defaultConfig)
	interleaved := withFreshAddresses(t, "../configs/fmnist-mlp-interleaved.yaml")
	zbv := withFreshAddresses(t, "../configs/fmnist-mlp-zbv.yaml")
	dualpipev := withFreshAddresses(t, "../configs/fmnist-mlp-dualpipev.yaml")
	recomputing := withRecompute(t, cfg)
	type variant struct {
		sched     string
		micro     int  // 0: the config's 8
		recompute bool // every stage: recompute: full
	}
	runs := []variant{{"1f1b", 16, false}, {"zb-h1", 4, false}, {"interleaved", 4, false}, {"zb-v", 16, false}, {"1f1b", 0, true}, {"zb-h1", 0, true}}
	for _, sched := range schedule.Names() {
		runs = append(runs, variant{sched, 0, false})
	}
	for _, r := range runs {
		sched := r.sched
		name := sched
		if r.micro > 0 {
			name = fmt.Sprintf("%s/m%d", sched, r.micro)
		}
		if r.recompute {
			name += "/recompute"
		}
		t.Run(name, func(t *testing.T) {
			cfg := cfg
			switch {
			case r.recompute:
				cfg = recomputing
			case sched == "interleaved" || sched == "interleaved-zb":
				cfg = interleaved
			case sched == "zb-v":
				cfg = zbv
			case sched == "dualpipev":
				cfg = dualpipev
			}
			env := []string{"PIPETRAIN_SCHEDULE=" + sched, "PIPETRAIN_TRAIN_EVALUATE=true"}
			if r.micro > 0 {
				env = append(env, fmt.Sprintf("PIPETRAIN_DATA_MICRO_BATCHES=%d", r.micro))
			}
			refDir, pipeDir := t.TempDir(), t.TempDir()
			if r := run(t, 3*time.Minute, env, "reference", "--pipeline-threads", "--config", cfg, "--steps", steps, "--run-dir", refDir); r.err != nil {
				t.Fatalf("reference: %v\n%s", r.err, r.out)
			}
			res := run(t, 3*time.Minute, env, "launch", "--config", cfg, "--steps", steps, "--run-dir", pipeDir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			for i := range 4 {
				if !strings.Contains(res.out, fmt.Sprintf("[stage %d] stage %d: done", i, i)) {
					t.Errorf("stage %d did not report done:\n%s", i, res.out)
				}
			}
			pipe := sameRun(t, refDir, pipeDir, 30)
			sameEval(t, refDir, pipeDir)
			if !(pipe[29].Loss < pipe[0].Loss) {
				t.Errorf("loss did not fall: %v -> %v", pipe[0].Loss, pipe[29].Loss)
			}
			if n := len(weights(t, pipeDir)); n < 8 {
				t.Errorf("%d weight tensors, want 8", n)
			}
			pics := t.TempDir()
			prof := run(t, time.Minute, nil, "profile", pipeDir, "--trace", filepath.Join(pics, "t.json"), "--svg", filepath.Join(pics, "t.svg"), "--html", filepath.Join(pics, "t.html"))
			wants := []string{"theory %", "sim %", "bottleneck: stage", "link", "stragglers"}
			if r.recompute {
				wants = append(wants, "RF ms")
			}
			for _, want := range wants {
				if prof.err != nil || !strings.Contains(prof.out, want) {
					t.Errorf("profile lacks %q (%v):\n%s", want, prof.err, prof.out)
				}
			}
			// Each stage process recorded the clock it ran on: one boot id,
			// so the profile never shifts them apart.
			boot, host := strings.TrimSpace(readFile("/proc/sys/kernel/random/boot_id")), hostname(t)
			for i := range 4 {
				var c struct {
					Host   string `json:"host"`
					BootID string `json:"boot_id"`
				}
				if err := json.Unmarshal([]byte(readFile(filepath.Join(pipeDir, "events", fmt.Sprintf("stage-%d.clock.json", i)))), &c); err != nil ||
					c.BootID == "" || c.BootID != boot || c.Host != host {
					t.Errorf("stage %d's clock record: %+v (%v), want boot id %q, host %q", i, c, err, boot, host)
				}
			}
			if want := "clocks: not shifted: stages 0-3 share one clock (boot id " + boot[:min(8, len(boot))] + "…, host " + host + ")\n"; !strings.Contains(prof.out, want) {
				t.Errorf("profile lacks %q:\n%s", want, prof.out)
			}
			var trace struct {
				TraceEvents []map[string]any `json:"traceEvents"`
			}
			if err := json.Unmarshal([]byte(readFile(filepath.Join(pics, "t.json"))), &trace); err != nil || len(trace.TraceEvents) == 0 {
				t.Errorf("trace: %v, %d events", err, len(trace.TraceEvents))
			}
			if !strings.Contains(readFile(filepath.Join(pics, "t.svg")), "<svg") || !strings.Contains(readFile(filepath.Join(pics, "t.html")), "<svg") {
				t.Error("no SVG timeline written")
			}
		})
	}
}

// TestDemoReachesAccuracy runs the demo as `make demo` does (200 steps of the
// default config, 4 processes) and checks the test accuracy launch prints.
func TestDemoReachesAccuracy(t *testing.T) {
	needData(t)
	dir := t.TempDir()
	r := run(t, 5*time.Minute, nil, "launch", "--config", withFreshAddresses(t, defaultConfig), "--run-dir", dir)
	if r.err != nil {
		t.Fatalf("launch: %v\n%s", r.err, r.out)
	}
	m := regexp.MustCompile(`pipetrain: test accuracy ([0-9.]+)% on 10000 test images`).FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("launch printed no test accuracy:\n%s", r.out)
	}
	var acc float64
	fmt.Sscan(m[1], &acc)
	if acc <= 80 {
		t.Errorf("test accuracy %.2f%% after 200 steps, want above 80%%", acc)
	}
	ms, err := stages.ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil || len(ms) != 200 {
		t.Fatalf("metrics: %d lines, %v", len(ms), err)
	}
	t.Logf("test accuracy %.2f%%, loss %.4f -> %.4f", acc, ms[0].Loss, ms[199].Loss)
}

// TestNeighbourNeverComesUp starts a middle stage alone: it must give up within its
// connect timeout and say which neighbour it waited for.
func TestNeighbourNeverComesUp(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	r := run(t, time.Minute, []string{"PIPETRAIN_TRANSPORT_CONNECT_TIMEOUT=2s"}, "stage", "--config", cfg, "--stage", "1", "--run-dir", t.TempDir())
	if r.err == nil {
		t.Fatalf("stage 1 ran without neighbours:\n%s", r.out)
	}
	if r.took > 20*time.Second {
		t.Errorf("took %v to give up with a 2s timeout", r.took)
	}
	for _, want := range []string{"stage 1", "stage 0", "did not connect", "stage 2", "not reachable", "2s"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("message lacks %q:\n%s", want, r.out)
		}
	}
}

// TestLaunchStopsAllWhenOneStageFails takes stage 2's port before launching: stage 2
// cannot listen, and launch must stop the others, name stage 2, and exit non-zero.
func TestLaunchStopsAllWhenOneStageFails(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	c, err := configs.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", c.Stages[2].Address)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := run(t, time.Minute, []string{"PIPETRAIN_TRANSPORT_CONNECT_TIMEOUT=20s"}, "launch", "--config", cfg, "--steps", "5", "--run-dir", t.TempDir())
	if r.err == nil {
		t.Fatalf("launch succeeded with stage 2's port taken:\n%s", r.out)
	}
	if !regexp.MustCompile(`pipetrain: stage 2 failed \(exit status 1\): .*cannot listen on .*` + regexp.QuoteMeta(c.Stages[2].Address)).MatchString(r.out) {
		t.Errorf("launch did not name stage 2 and its address:\n%s", r.out)
	}
	if r.took > 15*time.Second {
		t.Errorf("launch took %v to stop after stage 2 failed at once", r.took)
	}
}

// TestInterruptStopsEveryStage sends Ctrl-C's signal to launch mid-run.
func TestInterruptStopsEveryStage(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	dir := t.TempDir()
	cmd := exec.Command(binary, "launch", "--config", cfg, "--steps", "100000", "--run-dir", dir)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(readFile(filepath.Join(dir, "metrics.jsonl")), `"step":3,`) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no progress within a minute:\n%s", buf.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if code := cmd.ProcessState.ExitCode(); err == nil || code != 130 {
			t.Errorf("exit code %d after SIGINT, want 130\n%s", code, buf.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("launch still running 20s after SIGINT:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "interrupted") {
		t.Errorf("no interruption message:\n%s", buf.String())
	}
	// Every stage was a child of launch; none may outlive it.
	out, _ := exec.Command("pgrep", "-f", "stage --config "+cfg).Output()
	if len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("stage processes left running: %s", out)
	}
}

// TestStagesFromDifferentConfigsRefuseEachOther runs stage 0 and stage 1 with
// different step counts (so different config digests): both must refuse the link.
func TestStagesFromDifferentConfigsRefuseEachOther(t *testing.T) {
	needData(t)
	cfg := withFreshAddresses(t, defaultConfig)
	env := []string{"PIPETRAIN_TRANSPORT_CONNECT_TIMEOUT=10s"}
	results := make(chan result, 2)
	for i, steps := range []string{"10", "11"} {
		go func() {
			results <- run(t, time.Minute, env, "stage", "--config", cfg, "--stage", fmt.Sprint(i), "--steps", steps, "--run-dir", t.TempDir())
		}()
	}
	for range 2 {
		r := <-results
		if r.err == nil {
			t.Errorf("a stage accepted a neighbour with another config:\n%s", r.out)
		}
		if !strings.Contains(r.out, "config digest") || !strings.Contains(r.out, "stage 0") || !strings.Contains(r.out, "stage 1") {
			t.Errorf("refusal does not name both stages and the digest:\n%s", r.out)
		}
		// Both hear the refusal itself, not their 10s connect timeout.
		if r.took > 8*time.Second {
			t.Errorf("took %v to refuse", r.took)
		}
	}
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// TestPlanFixesUnbalancedConfig runs the planner on a config whose first stage
// holds all the wide layers: it must move the boundary, predict a speedup, and
// write a config that validates and keeps the stages' other settings.
func TestPlanFixesUnbalancedConfig(t *testing.T) {
	out := filepath.Join(t.TempDir(), "planned.yaml")
	r := run(t, 3*time.Minute, nil, "plan", "--config", "../configs/fmnist-mlp-unbalanced-2stage.yaml", "--schedules", "1f1b", "--micro-batches", "8", "--reps", "3", "--out", out)
	if r.err != nil {
		t.Fatalf("plan: %v\n%s", r.err, r.out)
	}
	m := regexp.MustCompile(`predicted speedup over the given config: ([0-9.]+)x`).FindStringSubmatch(r.out)
	if m == nil {
		t.Fatalf("no speedup reported:\n%s", r.out)
	}
	var speedup float64
	fmt.Sscan(m[1], &speedup)
	if speedup < 1.1 {
		t.Errorf("predicted speedup %.2f for a split with stage 1 idle most of the time", speedup)
	}
	c, err := configs.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Stages[0].Layers[0] == "0-3" || c.Stages[0].CPUs != "0" || c.Stages[1].CPUs != "1" {
		t.Errorf("planned stages %+v", c.Stages)
	}
	// A second plan does not overwrite the first without --force.
	before := readFile(out)
	r = run(t, time.Minute, nil, "plan", "--config", "../configs/fmnist-mlp-unbalanced-2stage.yaml", "--out", out)
	if r.err == nil || !strings.Contains(r.out, "--out "+out+" exists; --force replaces it") || readFile(out) != before {
		t.Errorf("plan over an existing output: %v\n%s", r.err, r.out)
	}
}
