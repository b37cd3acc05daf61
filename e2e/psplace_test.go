package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// psAutoConfig writes psConfigWith's run (2 stages × 3 workers, 2 servers)
// with every address auto and no server addresses: the rendezvous places
// the servers as ranks 6 and 7.
func psAutoConfig(t *testing.T, mode string, steps int, extra string) string {
	t.Helper()
	body := `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 192, micro_batches: 2}
` + fmt.Sprintf("train: {steps: %d, evaluate: true, optimizer: {name: adam, lr: 0.001}}\n", steps) + `schedule: 1f1b
` + extra + "\n" + fmt.Sprintf("parameter_servers: {count: 2, mode: %s}\n", mode) + `data_parallel: 3
stages:
  - {layers: "0-1", addresses: [auto, auto, auto]}
  - {layers: "2-3", addresses: [auto, auto, auto]}
`
	path := filepath.Join(t.TempDir(), "ps-auto.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startEngineRanks is startRanks for a world of 8 whose last two ranks,
// the servers, take their ranks from other engines' variables: rank 6 from
// a Kubernetes Indexed Job's, rank 7 from Slurm's.
func startEngineRanks(t *testing.T, cfg string, dirs []string, port string, extra ...string) []rankProc {
	t.Helper()
	procs := make([]rankProc, len(dirs))
	for rank := len(dirs) - 1; rank >= 0; rank-- {
		env := []string{fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("WORLD_SIZE=%d", len(dirs))}
		switch rank {
		case 6:
			env = []string{"JOB_COMPLETION_INDEX=6"}
		case 7:
			env = []string{"SLURM_PROCID=7", "SLURM_NTASKS=8"}
		}
		env = append(env, "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
		cmd, out, done := start(t, env, append([]string{"stage", "--config", cfg, "--run-dir", dirs[rank]}, extra...)...)
		procs[rank] = rankProc{rank: rank, pid: cmd.Process.Pid, out: out, done: done}
	}
	return procs
}

// TestServersAreRanksOfTheRendezvous runs 2 parameter servers and 3
// workers of a 2-stage pipeline whose addresses are all auto, where the
// servers are ranks 6 and 7 of the job: launched on this machine, and as
// 8 processes with only their rank and MASTER_ADDR/MASTER_PORT in their
// environment, each with a run directory of its own: ranks 0-5 with
// torchrun's RANK and WORLD_SIZE=8, rank 6 with an Indexed Job's
// JOB_COMPLETION_INDEX and rank 7 with Slurm's SLURM_PROCID and
// SLURM_NTASKS=8, ranks 6 and 7 running the servers from the stage command.
// Each server registers at the rendezvous and the workers find it there;
// both runs equal the one-process reference bit for bit.
func TestServersAreRanksOfTheRendezvous(t *testing.T) {
	needData(t)
	cfg := psAutoConfig(t, "sync", 20, "checkpoint: {every: 0}")
	ref := reference(t, cfg)
	t.Run("launch", func(t *testing.T) {
		dir := t.TempDir()
		res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", dir)
		if res.err != nil {
			t.Fatalf("launch: %v\n%s", res.err, res.out)
		}
		if !strings.Contains(res.out, "serving the rendezvous for 8 processes (6 stage processes and 2 parameter servers)") {
			t.Errorf("the rendezvous did not count the servers:\n%s", res.out)
		}
		for i := range 2 {
			for _, want := range []string{
				fmt.Sprintf("[ps %d] pipetrain: parameter server %d is rank %d of 8", i, i, 6+i),
				fmt.Sprintf("[ps %d] parameter server %d: done", i, i),
			} {
				if !strings.Contains(res.out, want) {
					t.Errorf("no %q:\n%s", want, res.out)
				}
			}
		}
		sameRun(t, ref, dir, 20)
		sameEval(t, ref, dir)
	})
	t.Run("engine envs", func(t *testing.T) {
		dirs := make([]string, 8)
		for r := range dirs {
			dirs[r] = t.TempDir()
		}
		port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
		procs := startEngineRanks(t, cfg, dirs, port)
		for r, err := range awaitRanks(t, procs, 3*time.Minute) {
			if err != nil {
				t.Fatalf("rank %d: %v\n%s", r, err, procs[r].out.String())
			}
		}
		for i := range 2 {
			out := procs[6+i].out.String()
			for _, want := range []string{
				fmt.Sprintf("pipetrain: rank %d of 8 from %s: parameter server %d", 6+i, []string{"JOB_COMPLETION_INDEX (Kubernetes Indexed Job)", "SLURM_PROCID/SLURM_NTASKS (Slurm)"}[i], i),
				fmt.Sprintf("parameter server %d: done", i),
			} {
				if !strings.Contains(out, want) {
					t.Errorf("rank %d: no %q:\n%s", 6+i, want, out)
				}
			}
		}
		sameRun(t, ref, dirs[0], 20)
		sameEval(t, ref, dirs[0])
	})
}

// TestServersAsRanksResume checkpoints a run whose servers are ranks 6 and
// 7 of the rendezvous, each of the 8 ranks with a run directory of its
// own: 10 steps with a checkpoint every 5, committed through rank 0's
// ledger once every stage's and server's part is in (each server's folder
// gets the manifest, which lists both servers' parts), then every rank
// resumes with --resume to step 20; the servers resume from the step every
// rank holds and the run equals the 20-step reference bit for bit.
func TestServersAsRanksResume(t *testing.T) {
	needData(t)
	cfg := psAutoConfig(t, "sync", 20, "checkpoint: {every: 5}")
	ref := reference(t, cfg)
	dirs := make([]string, 8)
	for r := range dirs {
		dirs[r] = t.TempDir()
	}
	attempt := func(extra ...string) []rankProc {
		port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
		procs := startEngineRanks(t, cfg, dirs, port, extra...)
		for r, err := range awaitRanks(t, procs, 3*time.Minute) {
			if err != nil {
				t.Fatalf("rank %d (%v): %v\n%s", r, extra, err, procs[r].out.String())
			}
		}
		return procs
	}
	attempt("--steps", "10")
	for i := range 2 {
		m, err := os.ReadFile(filepath.Join(dirs[6+i], "checkpoints", "step-00000010", "manifest.json"))
		if err != nil {
			t.Fatalf("server %d's folder has no committed checkpoint of step 10: %v", i, err)
		}
		for _, want := range []string{`"servers": 2`, `"file": "ps-0.safetensors"`, `"file": "ps-1.safetensors"`} {
			if !strings.Contains(string(m), want) {
				t.Errorf("server %d's manifest of step 10 lacks %s:\n%s", i, want, m)
			}
		}
	}
	procs := attempt("--resume")
	for i := range 2 {
		want := fmt.Sprintf("parameter server %d: resumed from the checkpoint of step 10, which every process holds", i)
		if out := procs[6+i].out.String(); !strings.Contains(out, want) {
			t.Errorf("rank %d: no %q:\n%s", 6+i, want, out)
		}
	}
	sameRun(t, ref, dirs[0], 20)
	sameEval(t, ref, dirs[0])
}
