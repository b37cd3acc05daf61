package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShardedOptimizerEqualsReference launches grids of stages × replicas
// with all_reduce.shard_optimizer, each replica keeping the optimizer state
// of its share of every stage's weights, and requires every step's loss and
// the final weights to equal the one-process reference's bit for bit: 1 × 2,
// 2 × 2 and 3 × 2 grids under gpipe, 1f1b and zb-h1, with AdamW (weight
// decay on the weights alone, a warmup and cosine schedule) and with SGD
// with momentum, and the GPT with tied embeddings and clipped gradients.
// Each replica logs its share of the optimizer state: half the whole.
func TestShardedOptimizerEqualsReference(t *testing.T) {
	needData(t)
	const adamw = "{name: adamw, lr: 0.001, weight_decay: 0.1}, lr_schedule: {kind: cosine, warmup_steps: 5}"
	mlp := func(opt, sched string) string {
		body := strings.Replace(gridMLP, "{name: sgd, lr: 0.05, momentum: 0.9}", opt, 1)
		return strings.Replace(body, "checkpoint: {every: 0}", "checkpoint: {every: 0}\nschedule: "+sched, 1)
	}
	sgd := "{name: sgd, lr: 0.05, momentum: 0.9}"
	two, three := []string{`"0-1"`, `"2-3"`}, []string{`"0-1"`, `"2"`, `"3"`}
	cases := []struct {
		name   string
		body   string
		layers []string
	}{
		{"gpipe/adamw/1x2", mlp(adamw, "gpipe"), []string{`"0-3"`}},
		{"zb-h1/sgd/1x2", mlp(sgd, "zb-h1"), []string{`"0-3"`}},
		{"1f1b/adamw/2x2", mlp(adamw, "1f1b"), two},
		{"gpipe/sgd/2x2", mlp(sgd, "gpipe"), two},
		{"zb-h1/adamw/3x2", mlp(adamw, "zb-h1"), three},
		{"1f1b/sgd/3x2", mlp(sgd, "1f1b"), three},
		{"gpt-tied-clipped/2x2", strings.Replace(gridGPT, "{name: adam, lr: 0.003}}", "{name: adamw, lr: 0.003, weight_decay: 0.1}, clip_grad_norm: 0.5}", 1) + "\nschedule: zb-h1", two},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := strings.Replace(c.body, "all_reduce: {", "all_reduce: {shard_optimizer: true, ", 1)
			cfg := gridConfig(t, body, c.layers, 2)
			refDir, gridDir := t.TempDir(), t.TempDir()
			if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
				t.Fatalf("reference: %v\n%s", r.err, r.out)
			}
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			sameRun(t, refDir, gridDir, 30)
			halvedState(t, res.out, len(c.layers))
		})
	}
}

var shardLine = regexp.MustCompile(`\[stage (\d+) replica (\d+)\] [^\n]*optimizer state (\d+) bytes, this replica's share of (\d+) \(all_reduce.shard_optimizer\)`)

// halvedState requires every process of a grid of two replicas to log its
// share of the optimizer state: half the whole, give or take a bucket's
// rounding, and the two replicas' shares to add up to it.
func halvedState(t *testing.T, out string, stages int) {
	t.Helper()
	mine := map[int]int64{}
	whole := map[int]int64{}
	seen := 0
	for _, m := range shardLine.FindAllStringSubmatch(out, -1) {
		s, _ := strconv.Atoi(m[1])
		b, _ := strconv.ParseInt(m[3], 10, 64)
		w, _ := strconv.ParseInt(m[4], 10, 64)
		mine[s] += b
		whole[s] = w
		seen++
		if d := b - w/2; d > w/100 || d < -w/100 {
			t.Errorf("stage %s replica %s keeps %d bytes of optimizer state, half of %d is %d", m[1], m[2], b, w, w/2)
		}
	}
	if seen != 2*stages {
		t.Fatalf("%d processes logged their share of the optimizer state, want %d:\n%s", seen, 2*stages, out)
	}
	for s := range stages {
		if mine[s] != whole[s] || whole[s] == 0 {
			t.Errorf("stage %d: the replicas keep %d bytes together, the whole state is %d", s, mine[s], whole[s])
		}
	}
}

// TestShardedReplicaRecoversBitIdentical kill -9s replica 1 of stage 1 in a
// sharded 2 × 2 launch at a random step: every process restarts from the
// last complete checkpoint, whose parts the replicas 0 wrote with the
// optimizer state gathered from both shards, and the run ends with the
// uninterrupted run's losses and weights, bit for bit.
func TestShardedReplicaRecoversBitIdentical(t *testing.T) {
	needData(t)
	const steps = 40
	body := strings.Replace(gridMLP, "checkpoint: {every: 0}", "checkpoint: {every: 5}", 1)
	body = strings.Replace(body, "{name: sgd, lr: 0.05, momentum: 0.9}", "{name: adam, lr: 0.001}", 1)
	body = strings.Replace(body, "all_reduce: {", "all_reduce: {shard_optimizer: true, ", 1)
	cfg := gridConfig(t, body+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	args := []string{"launch", "--config", cfg, "--steps", fmt.Sprint(steps)}
	clean := t.TempDir()
	if r := run(t, 3*time.Minute, nil, append(args, "--run-dir", clean)...); r.err != nil {
		t.Fatalf("uninterrupted launch: %v\n%s", r.err, r.out)
	}
	seed := time.Now().UnixNano()
	killAt := 8 + rand.New(rand.NewPCG(uint64(seed), 3)).IntN(20)
	t.Logf("seed %d: killing stage 1 replica 1 at step %d", seed, killAt)
	dir := t.TempDir()
	_, out, done := start(t, nil, append(args, "--run-dir", dir)...)
	waitForStep(t, dir, killAt, 2*time.Minute, out)
	text := killAndAwaitRecovery(t, replicaPID(t, dir, 1, 1), "stage 1 replica 1", out, done)
	for _, want := range []string{"restarting from the checkpoint of step", "stage 1 replica 1: resumed from the checkpoint of step"} {
		if !strings.Contains(text, want) {
			t.Errorf("launch output lacks %q:\n%s", want, text)
		}
	}
	sameRun(t, clean, dir, steps)
}

// TestShardedRanksCheckpointTheWholeState runs a sharded 1 × 2 as two ranks
// with run directories of their own, so that each writes its own checkpoint
// part: both parts of the last step must hold the bits the unsharded run's
// part holds, weights and whole optimizer state, and the run must equal the
// reference.
func TestShardedRanksCheckpointTheWholeState(t *testing.T) {
	needData(t)
	const steps = 30
	grid := strings.Replace(gridMLP, "checkpoint: {every: 0}", fmt.Sprintf("checkpoint: {every: %d}", steps), 1)
	grid = strings.Replace(grid, "all_reduce: {", "all_reduce: {shard_optimizer: true, ", 1)
	grid += "\nschedule: 1f1b\ndata_parallel: 2\nstages:\n  - {layers: \"0-3\", addresses: [auto, auto]}\n"
	cfg := filepath.Join(t.TempDir(), "grid.yaml")
	if err := os.WriteFile(cfg, []byte(grid), 0o644); err != nil {
		t.Fatal(err)
	}
	want := reference(t, cfg)
	dirs := []string{t.TempDir(), t.TempDir()}
	port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
	procs := startRanks(t, cfg, dirs, port)
	for r, err := range awaitRanks(t, procs, 3*time.Minute) {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, procs[r].out.String())
		}
	}
	// The unsharded run, launched, checkpoints the same bits.
	unsharded := filepath.Join(t.TempDir(), "unsharded.yaml")
	if err := os.WriteFile(unsharded, []byte(strings.Replace(grid, "shard_optimizer: true, ", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	whole := t.TempDir()
	if r := run(t, 3*time.Minute, nil, "launch", "--config", unsharded, "--run-dir", whole); r.err != nil {
		t.Fatalf("unsharded launch: %v\n%s", r.err, r.out)
	}
	sameReplicaCheckpoints(t, "sharded ranks and the unsharded launch", append(dirs, whole), steps)
	sameRun(t, want, dirs[0], steps)
}
