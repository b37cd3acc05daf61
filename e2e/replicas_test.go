package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/stages"
)

// gridConfig writes a config of p stages × r replicas from its stage
// layers and the rest of its YAML, every process on a free port.
func gridConfig(t *testing.T, body string, layers []string, replicas int) string {
	t.Helper()
	ports := freePorts(t, len(layers)*replicas)
	var b strings.Builder
	fmt.Fprintf(&b, "%s\ndata_parallel: %d\nstages:\n", body, replicas)
	for s, l := range layers {
		fmt.Fprintf(&b, "  - {layers: %s, addresses: [%s]}\n", l, strings.Join(ports[s*replicas:(s+1)*replicas], ", "))
	}
	path := filepath.Join(t.TempDir(), "grid.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const gridMLP = `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 128, micro_batches: 4}
train: {steps: 30, evaluate: false, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
all_reduce: {bucket_bytes: 65536, check_every: 10}
checkpoint: {every: 0}`

const gridGPT = `model: {name: gpt, dtype: float32, layers: 2, width: 32, heads: 2, context: 32, vocab: 256, tie_embeddings: true}
data: {dataset: text, corpus: "go:strings", glob: "*.go", tokenizer: byte, batch_size: 16, micro_batches: 2}
train: {steps: 30, evaluate: false, optimizer: {name: adam, lr: 0.003}}
all_reduce: {bucket_bytes: 20000, check_every: 5}
checkpoint: {every: 0}`

// TestReplicasEqualReference trains grids of stages × replicas for 30 steps
// in separate processes (every process's gradients summed over its replicas'
// ring) and requires every step's loss and the final weights to equal the
// one-process reference's bit for bit: each schedule at 2 × 2 (zb-v's and
// dualpipev's loss gathered on stage 0, which holds both ends of their V), pure data
// parallelism at 1 × 2 and 1 × 3, and the GPT with tied embeddings at 2 × 2,
// also with its gradients clipped by their global norm; and gpipe, 1F1B and
// ZB-H1 at 1 × 2, 2 × 2 and 3 × 2 with the all-reduces over ring streams
// and over the gRPC links (all_reduce.transport); and reduce-to-one
// (all_reduce.algorithm) at 1 × 2, 2 × 2 and 1 × 3.
func TestReplicasEqualReference(t *testing.T) {
	needData(t)
	cases := []struct {
		name     string
		body     string
		layers   []string
		replicas int
	}{
		{"gpipe/2x2", gridMLP + "\nschedule: gpipe", []string{`"0-1"`, `"2-3"`}, 2},
		{"1f1b/2x2", gridMLP + "\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2},
		{"zb-h1/2x2", gridMLP + "\nschedule: zb-h1", []string{`"0-1"`, `"2-3"`}, 2},
		{"interleaved/2x2", gridMLP + "\nschedule: interleaved\nvirtual_stages: 2", []string{`["0", "2"]`, `["1", "3"]`}, 2},
		{"zb-v/2x2", gridMLP + "\nschedule: zb-v\nvirtual_stages: 2", []string{`["0", "3"]`, `["1", "2"]`}, 2},
		{"interleaved-zb/2x2", gridMLP + "\nschedule: interleaved-zb\nvirtual_stages: 2", []string{`["0", "2"]`, `["1", "3"]`}, 2},
		{"dualpipev/2x2", gridMLP + "\nschedule: dualpipev\nvirtual_stages: 2", []string{`["0", "3"]`, `["1", "2"]`}, 2},
		{"1f1b/1x2", gridMLP + "\nschedule: 1f1b", []string{`"0-3"`}, 2},
		{"adam/1x3", strings.Replace(gridMLP, "{name: sgd, lr: 0.05, momentum: 0.9}", "{name: adam, lr: 0.001}", 1) + "\nschedule: 1f1b\ndata:\n  batch_size: 192\n  micro_batches: 2",
			[]string{`"0-3"`}, 3},
		{"gpt-tied/2x2", gridGPT + "\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2},
		{"gpt-tied-clipped/2x2", strings.Replace(gridGPT, "{name: adam, lr: 0.003}}", "{name: adam, lr: 0.003}, clip_grad_norm: 0.5}", 1) + "\nschedule: zb-h1", []string{`"0-1"`, `"2-3"`}, 2},
	}
	// The plain schedules on every grid shape, over each all_reduce.transport
	// (the cases above take the default, stream).
	for _, tr := range []string{"stream", "grpc"} {
		for _, sched := range []string{"gpipe", "1f1b", "zb-h1"} {
			for _, g := range []struct {
				name   string
				layers []string
			}{{"1x2", []string{`"0-3"`}}, {"2x2", []string{`"0-1"`, `"2-3"`}}, {"3x2", []string{`"0"`, `"1"`, `"2-3"`}}} {
				body := strings.Replace(gridMLP, "check_every: 10}", "check_every: 10, transport: "+tr+"}", 1)
				cases = append(cases, struct {
					name     string
					body     string
					layers   []string
					replicas int
				}{tr + "/" + sched + "/" + g.name, body + "\nschedule: " + sched, g.layers, 2})
			}
		}
	}
	// all_reduce.algorithm reduce-to-one, over each transport, and at 1 × 3,
	// where it folds in another order than the ring.
	r2o := func(tr string) string {
		return strings.Replace(gridMLP, "check_every: 10}", "check_every: 10, algorithm: reduce-to-one, transport: "+tr+"}", 1)
	}
	cases = append(cases, []struct {
		name     string
		body     string
		layers   []string
		replicas int
	}{
		{"reduce-to-one/gpipe/1x2", r2o("stream") + "\nschedule: gpipe", []string{`"0-3"`}, 2},
		{"reduce-to-one/1f1b/2x2", r2o("stream") + "\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2},
		{"reduce-to-one/gpipe/2x2/grpc", r2o("grpc") + "\nschedule: gpipe", []string{`"0-1"`, `"2-3"`}, 2},
		{"reduce-to-one/adam/1x3", strings.Replace(r2o("stream"), "{name: sgd, lr: 0.05, momentum: 0.9}", "{name: adam, lr: 0.001}", 1) + "\nschedule: 1f1b\ndata:\n  batch_size: 192\n  micro_batches: 2",
			[]string{`"0-3"`}, 3},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := c.body
			if strings.Contains(body, "\ndata:\n") {
				// A case's own data section replaces the shared one.
				body = strings.Replace(body, "data: {batch_size: 128, micro_batches: 4}\n", "", 1)
			}
			cfg := gridConfig(t, body, c.layers, c.replicas)
			refDir, gridDir := t.TempDir(), t.TempDir()
			if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
				t.Fatalf("reference: %v\n%s", r.err, r.out)
			}
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			for s := range c.layers {
				for r := range c.replicas {
					if !strings.Contains(res.out, fmt.Sprintf("[stage %d replica %d] stage %d", s, r, s)) {
						t.Errorf("stage %d replica %d did not run:\n%s", s, r, res.out)
					}
				}
			}
			got := sameRun(t, refDir, gridDir, 30)
			if !(got[29].Loss < got[0].Loss) {
				t.Errorf("loss did not fall: %v -> %v", got[0].Loss, got[29].Loss)
			}
			// Every replica logged its all-reduces.
			for r := range c.replicas {
				name := "stage-0.jsonl"
				if r > 0 {
					name = fmt.Sprintf("stage-0.replica-%d.jsonl", r)
				}
				if ev := readFile(filepath.Join(gridDir, "events", name)); !strings.Contains(ev, `"kind":"AR"`) {
					t.Errorf("replica %d logged no all-reduce in %s", r, name)
				}
			}
		})
	}
}

// replicaPID finds the process of stage s, replica r of the launch in runDir.
func replicaPID(t *testing.T, runDir string, s, r int) int {
	t.Helper()
	return processPID(runDir, "--stage", fmt.Sprint(s), "--replica", fmt.Sprint(r))
}

// TestKilledReplicaRecoversBitIdentical kill -9s one replica's process of a
// 2 × 2 launch at a random step: launch must restart every process from the
// last complete checkpoint (written by the replicas 0), and the run must
// end with the uninterrupted run's losses and weights, bit for bit.
func TestKilledReplicaRecoversBitIdentical(t *testing.T) {
	needData(t)
	const steps = 40
	cfg := gridConfig(t, strings.Replace(gridMLP, "checkpoint: {every: 0}", "checkpoint: {every: 5}", 1)+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	args := []string{"launch", "--config", cfg, "--steps", fmt.Sprint(steps)}
	clean := t.TempDir()
	if r := run(t, 3*time.Minute, nil, append(args, "--run-dir", clean)...); r.err != nil {
		t.Fatalf("uninterrupted launch: %v\n%s", r.err, r.out)
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	killAt, stage := 8+rng.IntN(20), rng.IntN(2)
	t.Logf("seed %d: killing stage %d replica 1 at step %d", seed, stage, killAt)
	dir := t.TempDir()
	_, out, done := start(t, nil, append(args, "--run-dir", dir)...)
	waitForStep(t, dir, killAt, 2*time.Minute, out)
	text := killAndAwaitRecovery(t, replicaPID(t, dir, stage, 1), fmt.Sprintf("stage %d replica 1", stage), out, done)
	for _, want := range []string{fmt.Sprintf("stage %d replica 1 failed", stage), "signal: killed", "restarting from the checkpoint of step",
		fmt.Sprintf("stage %d replica 1: resumed from the checkpoint of step", stage)} {
		if !strings.Contains(text, want) {
			t.Errorf("launch output lacks %q:\n%s", want, text)
		}
	}
	sameRun(t, clean, dir, steps)
	for s := range 2 {
		for r := range 2 {
			if pid := replicaPID(t, dir, s, r); pid != 0 {
				t.Errorf("stage %d replica %d (pid %d) still running after launch exited", s, r, pid)
			}
		}
	}
}

// TestCompressedAllReduceKeepsReplicasIdentical runs 1 × 2 with the
// all-reduce's messages cast to 16 bits, each replica a rank with a run
// directory of its own, so that each writes its own checkpoint: the two
// replicas' checkpoints of the last step (weights and optimizer state) must
// hold the same bits, the run must pass the digest check every 5 steps, and
// the loss must stay close to the uncompressed reference's.
func TestCompressedAllReduceKeepsReplicasIdentical(t *testing.T) {
	needData(t)
	const steps = 30
	grid := strings.Replace(gridMLP, "check_every: 10", "check_every: 5", 1)
	grid = strings.Replace(grid, "checkpoint: {every: 0}", fmt.Sprintf("checkpoint: {every: %d}", steps), 1)
	grid += "\nschedule: 1f1b\ndata_parallel: 2\nstages:\n  - {layers: \"0-3\", addresses: [auto, auto]}\n"
	write := func(name, body string) string {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	want := readMetrics(t, reference(t, write("grid.yaml", grid)))
	for _, c := range []string{"bf16", "fp16"} {
		cfg := write(c+".yaml", grid+"transport: {compression: "+c+"}\n")
		dirs := []string{t.TempDir(), t.TempDir()}
		port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
		procs := startRanks(t, cfg, dirs, port)
		for r, err := range awaitRanks(t, procs, 3*time.Minute) {
			if err != nil {
				t.Fatalf("%s: rank %d: %v\n%s", c, r, err, procs[r].out.String())
			}
		}
		sameReplicaCheckpoints(t, c, dirs, steps)
		got := readMetrics(t, dirs[0])
		last := len(got) - 1
		if len(got) != len(want) || got[last].Loss == want[last].Loss {
			t.Errorf("%s: %d steps, final loss %v: want %d steps and a loss changed by rounding (reference %v)", c, len(got), got[last].Loss, len(want), want[last].Loss)
		}
		if d := got[last].Loss - want[last].Loss; d > 0.05*want[last].Loss || d < -0.05*want[last].Loss {
			t.Errorf("%s: final loss %v, reference %v: more than 5%% apart", c, got[last].Loss, want[last].Loss)
		}
	}
}

// sameReplicaCheckpoints requires stage 0's checkpoint part of step in each
// replica's run directory to hold the same tensors, bit for bit.
func sameReplicaCheckpoints(t *testing.T, what string, dirs []string, step int) {
	t.Helper()
	parts := make([]map[string]checkpoint.Tensor, len(dirs))
	for r, dir := range dirs {
		path := filepath.Join(checkpoint.StepDir(stages.CheckpointDir(dir), step), checkpoint.PartFile(0))
		ts, meta, err := checkpoint.Read(path)
		if err != nil {
			t.Fatalf("%s: replica %d: %v", what, r, err)
		}
		if meta["step"] != fmt.Sprint(step) {
			t.Fatalf("%s: replica %d: %s is of step %q, want %d", what, r, path, meta["step"], step)
		}
		parts[r] = map[string]checkpoint.Tensor{}
		for _, x := range ts {
			parts[r][x.Name] = x
		}
	}
	for r := 1; r < len(parts); r++ {
		if len(parts[r]) == 0 || len(parts[r]) != len(parts[0]) {
			t.Errorf("%s: replica 0's checkpoint holds %d tensors, replica %d's %d", what, len(parts[0]), r, len(parts[r]))
		} else if err := checkpoint.Diff(parts[0], parts[r]); err != nil {
			t.Errorf("%s: replicas 0 and %d hold different weights after step %d: %v", what, r, step, err)
		}
	}
}

func readMetrics(t *testing.T, dir string) []stages.Metric {
	t.Helper()
	m, err := stages.ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil || len(m) == 0 {
		t.Fatalf("%s: %d metrics (%v)", dir, len(m), err)
	}
	return m
}

// TestHungReplicaBlamed SIGSTOPs stage 1 of replica 1 in a 2 × 2 launch. Its
// pipeline neighbour waits for it, and replica 0 waits on the all-reduce ring
// for that neighbour; whichever gives up first, the launcher must follow the
// waits across the ring and blame the stopped process, and leave none behind.
func TestHungReplicaBlamed(t *testing.T) {
	needData(t)
	cfg := gridConfig(t, gridMLP+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	env := []string{"PIPETRAIN_TRANSPORT_RECV_TIMEOUT=3s", "PIPETRAIN_RECOVERY_MAX_RESTARTS=0"}
	dir := t.TempDir()
	_, out, done := start(t, env, "launch", "--config", cfg, "--steps", "100000", "--run-dir", dir)
	waitForStep(t, dir, 5, 2*time.Minute, out)
	pid := replicaPID(t, dir, 1, 1)
	if pid == 0 {
		t.Fatalf("stage 1 replica 1's process not found:\n%s", out.String())
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("launch succeeded with a stopped process:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("launch did not end:\n%s", out.String())
	}
	if text := out.String(); !strings.Contains(text, "stage 1 replica 1 stopped making progress") {
		t.Errorf("the stopped process was not blamed:\n%s", text)
	}
	for s := range 2 {
		for r := range 2 {
			if pid := replicaPID(t, dir, s, r); pid != 0 {
				t.Errorf("stage %d replica %d (pid %d) still running after launch exited", s, r, pid)
			}
		}
	}
}

// TestRanksFromEnvironment starts the four processes of a 2 × 2 grid by hand,
// as a cluster engine would, with no --stage: each finds its place from the
// rank its environment gives (torchrun's, Slurm's or a Kubernetes Indexed
// Job's variables), and the run equals the reference.
func TestRanksFromEnvironment(t *testing.T) {
	needData(t)
	cfg := gridConfig(t, gridMLP+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	refDir, dir := t.TempDir(), t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	envs := [][]string{
		{"RANK=0", "WORLD_SIZE=4"},
		{"RANK=1", "WORLD_SIZE=4"},
		{"SLURM_PROCID=2", "SLURM_NTASKS=4"},
		{"JOB_COMPLETION_INDEX=3"},
	}
	type proc struct {
		out  *syncBuffer
		done chan error
	}
	var procs []proc
	for _, e := range envs {
		_, out, done := start(t, e, "stage", "--config", cfg, "--run-dir", dir)
		procs = append(procs, proc{out, done})
	}
	for rank, p := range procs {
		select {
		case err := <-p.done:
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", rank, err, p.out.String())
			}
		case <-time.After(3 * time.Minute):
			t.Fatalf("rank %d did not finish:\n%s", rank, p.out.String())
		}
		s, r := rank/2, rank%2
		if want := fmt.Sprintf("pipetrain: rank %d of 4 from ", rank); !strings.Contains(p.out.String(), want) ||
			!strings.Contains(p.out.String(), fmt.Sprintf("stage %d replica %d: done", s, r)) {
			t.Errorf("rank %d did not run as stage %d replica %d:\n%s", rank, s, r, p.out.String())
		}
	}
	sameRun(t, refDir, dir, 30)
}

// TestRendezvousGivesAddresses starts a 2 × 2 grid whose addresses are all
// auto, each process with only its rank and the rendezvous (MASTER_ADDR,
// MASTER_PORT) in its environment: rank 0 serves the table, every process
// binds a free port and learns the others', and the run equals the reference.
// A launch of the same config finds its own rendezvous.
func TestRendezvousGivesAddresses(t *testing.T) {
	needData(t)
	path := filepath.Join(t.TempDir(), "auto.yaml")
	body := gridMLP + "\nschedule: 1f1b\ndata_parallel: 2\nstages:\n  - {layers: \"0-1\", addresses: [auto, auto]}\n  - {layers: \"2-3\", addresses: [auto, auto]}\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	refDir, dir := t.TempDir(), t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", path, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
	type proc struct {
		out  *syncBuffer
		done chan error
	}
	var procs []proc
	for rank := 3; rank >= 0; rank-- { // rank 0, which serves the table, last
		env := []string{fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
		_, out, done := start(t, env, "stage", "--config", path, "--run-dir", dir)
		procs = append(procs, proc{out, done})
	}
	for i, p := range procs {
		select {
		case err := <-p.done:
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", 3-i, err, p.out.String())
			}
		case <-time.After(3 * time.Minute):
			t.Fatalf("rank %d did not finish:\n%s", 3-i, p.out.String())
		}
		if !strings.Contains(p.out.String(), "the rendezvous at 127.0.0.1:"+port+" gave every process's address") {
			t.Errorf("rank %d did not use the rendezvous:\n%s", 3-i, p.out.String())
		}
	}
	sameRun(t, refDir, dir, 30)
	launched := t.TempDir()
	if r := run(t, 3*time.Minute, nil, "launch", "--config", path, "--run-dir", launched); r.err != nil {
		t.Fatalf("launch: %v\n%s", r.err, r.out)
	}
	sameRun(t, refDir, launched, 30)
}
