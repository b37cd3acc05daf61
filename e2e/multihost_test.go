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

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/internal/netns"
	"github.com/pipetrain/pipetrain/internal/testenv"
	"github.com/pipetrain/pipetrain/stages"
)

// privateMLP is a 4-stage run long enough to be killed between checkpoints.
const privateMLP = `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 64, micro_batches: 4}
train: {steps: 240, evaluate: true, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
checkpoint: {every: 20, keep: 2}
schedule: 1f1b
stages:
  - {layers: "0", address: auto}
  - {layers: "1", address: auto}
  - {layers: "2", address: auto}
  - {layers: "3", address: auto}
`

// rankProc is one rank's process, started by hand as an engine would.
type rankProc struct {
	rank int
	pid  int
	out  *syncBuffer
	done chan error
}

// hostBLASEnv is the test's kernel settings (OPENBLAS_CORETYPE and the
// like, and PIPETRAIN_BLAS, which make test-blas sets to gonum), for ranks
// started with an environment of their own. The reference they are held to
// runs with the test's environment, and other kernels round differently;
// the hosts of a real job run one machine image alike.
func hostBLASEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OPENBLAS_") || strings.HasPrefix(kv, "PIPETRAIN_BLAS=") {
			out = append(out, kv)
		}
	}
	return out
}

// startRanks starts world ranks of cfg, rank r with run directory dirs[r],
// each with only its rank and the rendezvous in its environment, rank 0
// last (it serves the rendezvous, and the others wait for it).
func startRanks(t *testing.T, cfg string, dirs []string, port string, extra ...string) []rankProc {
	t.Helper()
	procs := make([]rankProc, len(dirs))
	for rank := len(dirs) - 1; rank >= 0; rank-- {
		env := []string{fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("WORLD_SIZE=%d", len(dirs)), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
		cmd, out, done := start(t, env, append([]string{"stage", "--config", cfg, "--run-dir", dirs[rank]}, extra...)...)
		procs[rank] = rankProc{rank: rank, pid: cmd.Process.Pid, out: out, done: done}
	}
	return procs
}

// awaitRanks waits for every rank to end, and returns their errors.
func awaitRanks(t *testing.T, procs []rankProc, timeout time.Duration) []error {
	t.Helper()
	errs := make([]error, len(procs))
	deadline := time.After(timeout)
	for i, p := range procs {
		select {
		case errs[i] = <-p.done:
		case <-deadline:
			t.Fatalf("rank %d did not end within %v:\n%s", p.rank, timeout, p.out.String())
		}
	}
	return errs
}

// awaitCommitted waits until the checkpoint folder root holds the manifest of
// a step at least step, and returns that step.
func awaitCommitted(t *testing.T, root string, step int, timeout time.Duration, procs []rankProc) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "step-"))
			if err != nil || n < step {
				continue
			}
			if _, err := os.Stat(filepath.Join(root, e.Name(), checkpoint.ManifestName)); err == nil {
				return n
			}
		}
		time.Sleep(time.Millisecond)
	}
	var outs []string
	for _, p := range procs {
		outs = append(outs, p.out.String())
	}
	t.Fatalf("no checkpoint of step %d or later committed in %s within %v:\n%s", step, root, timeout, strings.Join(outs, "\n"))
	return 0
}

// TestPrivateRunDirectories runs four ranks, each with a run directory of its
// own, as on hosts that share no disk: checkpoints commit through rank 0's
// rendezvous with every folder holding only its own part, a rank killed
// mid-run brings the job down, the restarted ranks agree on the newest
// checkpoint they all hold and finish bit-identical to the reference, and
// rank 0's folder ends up with every rank's logs and weights.
func TestPrivateRunDirectories(t *testing.T) {
	needData(t)
	cfg := filepath.Join(t.TempDir(), "private.yaml")
	if err := os.WriteFile(cfg, []byte(privateMLP), 0o644); err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)
	dirs := make([]string, 4)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
	procs := startRanks(t, cfg, dirs, port, "--resume")
	committed := awaitCommitted(t, stages.CheckpointDir(dirs[2]), 60, 3*time.Minute, procs)
	if err := syscall.Kill(procs[2].pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, err := range awaitRanks(t, procs, 2*time.Minute) {
		if err == nil {
			t.Fatalf("rank %d finished although rank 2 was killed:\n%s", i, procs[i].out.String())
		}
	}
	// Each folder holds its own part and no other.
	for rank, dir := range dirs {
		step := checkpoint.StepDir(stages.CheckpointDir(dir), committed)
		for s := range 4 {
			_, err := os.Stat(filepath.Join(step, checkpoint.PartFile(s)))
			if (s == rank) != (err == nil) {
				t.Errorf("rank %d's folder, step %d: stage %d's part present = %v", rank, committed, s, err == nil)
			}
		}
	}

	port = strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
	procs = startRanks(t, cfg, dirs, port, "--resume")
	resumed := regexp.MustCompile(`resumed from the checkpoint of step (\d+), which every process holds`)
	for i, err := range awaitRanks(t, procs, 3*time.Minute) {
		if err != nil {
			t.Fatalf("rank %d after the restart: %v\n%s", i, err, procs[i].out.String())
		}
		m := resumed.FindStringSubmatch(procs[i].out.String())
		if m == nil {
			t.Fatalf("rank %d did not resume from a checkpoint:\n%s", i, procs[i].out.String())
		}
		if i == 0 {
			t.Logf("killed rank 2 once step %d was committed; resumed from step %s", committed, m[1])
		}
		if step, _ := strconv.Atoi(m[1]); step < committed {
			t.Errorf("rank %d resumed from step %d; step %d was committed before the kill", i, step, committed)
		}
	}
	if out := procs[3].out.String(); !strings.Contains(out, "sent") || !strings.Contains(out, "to rank 0") {
		t.Errorf("rank 3 sent no logs to rank 0:\n%s", out)
	}
	sameRun(t, refDir, dirs[0], 240)
	for s := range 4 {
		if _, err := os.Stat(filepath.Join(dirs[0], "events", fmt.Sprintf("stage-%d.jsonl", s))); err != nil {
			t.Errorf("rank 0's folder lacks stage %d's events: %v", s, err)
		}
	}
	if r := run(t, time.Minute, nil, "profile", dirs[0]); r.err != nil || !strings.Contains(r.out, "bubble") {
		t.Errorf("profile of the gathered folder: %v\n%s", r.err, r.out)
	}

	// gather on demand brings back what rank 0's folder lost.
	lost := filepath.Join(dirs[0], "events", "stage-3.jsonl")
	want, _ := os.ReadFile(lost)
	os.Remove(lost)
	port = strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
	procs = nil
	for rank := 3; rank >= 0; rank-- {
		env := []string{fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}
		_, out, done := start(t, env, "gather", "--config", cfg, "--run-dir", dirs[rank])
		procs = append(procs, rankProc{rank: rank, out: out, done: done})
	}
	for i, err := range awaitRanks(t, procs, time.Minute) {
		if err != nil {
			t.Fatalf("gather, rank %d: %v\n%s", procs[i].rank, err, procs[i].out.String())
		}
	}
	if got, err := os.ReadFile(lost); err != nil || string(got) != string(want) {
		t.Errorf("gather did not bring back %s intact (%d of %d bytes, %v)", lost, len(got), len(want), err)
	}
}

// TestPrivateRunDirectoriesWithReplicas: on a 2 × 2 grid every replica
// keeps its own copy of its stage's part, the replicas' parts are the same
// bytes (the commit checks), and a restart agrees on the last step.
func TestPrivateRunDirectoriesWithReplicas(t *testing.T) {
	needData(t)
	body := strings.Replace(gridMLP, "checkpoint: {every: 0}", "checkpoint: {every: 10, keep: 2}", 1) +
		"\nschedule: 1f1b\ndata_parallel: 2\nstages:\n  - {layers: \"0-1\", addresses: [auto, auto]}\n  - {layers: \"2-3\", addresses: [auto, auto]}\n"
	cfg := filepath.Join(t.TempDir(), "grid.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)
	dirs := make([]string, 4)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	for attempt := range 2 {
		port := strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
		procs := startRanks(t, cfg, dirs, port, "--resume")
		for i, err := range awaitRanks(t, procs, 3*time.Minute) {
			if err != nil {
				t.Fatalf("attempt %d, rank %d: %v\n%s", attempt, i, err, procs[i].out.String())
			}
			if attempt == 1 && !strings.Contains(procs[i].out.String(), "resumed from the checkpoint of step 30, which every process holds") {
				t.Fatalf("rank %d did not resume from the last step:\n%s", i, procs[i].out.String())
			}
		}
		sameRun(t, refDir, dirs[0], 30)
	}
	var sums []string
	for rank, dir := range dirs {
		m, err := checkpoint.ReadManifest(checkpoint.StepDir(stages.CheckpointDir(dir), 30))
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		if err := m.VerifyPart(rank / 2); err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		sums = append(sums, m.Parts[rank/2].SHA256)
	}
	if sums[0] == sums[2] || fmt.Sprint(sums[:2]) != fmt.Sprint([]string{sums[0], sums[0]}) {
		t.Errorf("manifests' parts: %v", sums)
	}
}

// TestHostsAsNetworkNamespaces runs the four ranks of a job on four hosts
// (network namespaces on one switch, internal/netns), each started with
// only its rank and the rendezvous in its environment (and a PATH), the
// token on, and a run directory that is private to its host: the same path
// on every host, a different folder behind it, so nothing can lean on a
// shared disk. The run equals the reference. A second run has host 2's
// cable pulled after a checkpoint: every rank stops, naming the host that
// went silent; the restarted ranks resume from the last checkpoint they all
// committed and end bit-identical to the uninterrupted run. A third run
// guards the links with mutual TLS instead of the token.
func TestHostsAsNetworkNamespaces(t *testing.T) {
	needData(t)
	if why := netns.Available(); why != "" {
		testenv.RequireOrSkip(t, netns.Needs, why)
	}
	nw, err := netns.New(4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nw.Close() })
	hosts := nw.Hosts()

	tmp := t.TempDir()
	token := filepath.Join(tmp, "token")
	if err := os.WriteFile(token, []byte("multi-host-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// One BLAS thread everywhere: a rank alone on its host would otherwise
	// take every core, and sums over another thread count differ in the
	// last bits from the reference's.
	body := strings.Replace(privateMLP, "schedule: 1f1b\n",
		"schedule: 1f1b\ncompute: {blas_threads: 1}\ntransport: {token_file: "+token+", heartbeat: 500ms, peer_timeout: 2s, recv_timeout: 20s}\n", 1)
	cfg := filepath.Join(tmp, "hosts.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)
	runDir := filepath.Join(tmp, "run") // every host's, each with its own folder behind it
	startOnHosts := func(dirs []string) []rankProc {
		procs := make([]rankProc, len(hosts))
		for rank := len(hosts) - 1; rank >= 0; rank-- {
			h := hosts[rank]
			cmd := h.Command([]netns.Mount{{Source: dirs[rank], Target: runDir}}, binary,
				"stage", "--config", cfg, "--run-dir", runDir, "--resume")
			cmd.Env = append(hostBLASEnv(), "PATH=/usr/bin:/bin", fmt.Sprintf("RANK=%d", rank), "WORLD_SIZE=4", "MASTER_ADDR="+hosts[0].Addr, "MASTER_PORT=29400")
			out, done := startCmd(t, cmd)
			procs[rank] = rankProc{rank: rank, pid: cmd.Process.Pid, out: out, done: done}
		}
		return procs
	}
	folders := func() []string {
		dirs := make([]string, len(hosts))
		for i := range dirs {
			dirs[i] = t.TempDir()
		}
		return dirs
	}

	whole := folders()
	for i, err := range awaitRanks(t, startOnHosts(whole), 3*time.Minute) {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	sameRun(t, refDir, whole[0], 240)
	for rank, dir := range whole[1:] {
		if _, err := os.Stat(filepath.Join(dir, "metrics.jsonl")); (rank+1 == 3) != (err == nil) {
			t.Errorf("host %d's folder: metrics.jsonl present = %v; only the last stage's host writes it", rank+1, err == nil)
		}
	}

	cut := folders()
	procs := startOnHosts(cut)
	committed := awaitCommitted(t, stages.CheckpointDir(cut[2]), 60, 3*time.Minute, procs)
	if err := hosts[2].Cut(); err != nil {
		t.Fatal(err)
	}
	pulled := time.Now()
	errs := awaitRanks(t, procs, 2*time.Minute)
	t.Logf("host 2's cable pulled after step %d was committed; every rank stopped within %v", committed, time.Since(pulled).Round(100*time.Millisecond))
	named := false
	for i, err := range errs {
		if err == nil {
			t.Fatalf("rank %d finished although host 2 was cut off:\n%s", i, procs[i].out.String())
		}
		// "waiting for gradient ... from stage 2 (10.231.X.3:PORT): ...".
		named = named || strings.Contains(procs[i].out.String(), "from stage 2 ("+hosts[2].Addr+":")
	}
	if !named {
		t.Errorf("no rank named host 2 (%s):\n%s\n%s", hosts[2].Addr, procs[1].out.String(), procs[3].out.String())
	}
	if err := hosts[2].Restore(); err != nil {
		t.Fatal(err)
	}
	procs = startOnHosts(cut)
	for i, err := range awaitRanks(t, procs, 3*time.Minute) {
		if err != nil {
			t.Fatalf("rank %d after the restart: %v\n%s", i, err, procs[i].out.String())
		}
		if !strings.Contains(procs[i].out.String(), "which every process holds") {
			t.Fatalf("rank %d did not resume from a checkpoint:\n%s", i, procs[i].out.String())
		}
	}
	sameRun(t, whole[0], cut[0], 240)

	// Mutual TLS instead of the token: certificates made before the job
	// cannot name hosts it gets at run time, so they name the job, and
	// every dial (the rendezvous's too) checks that name.
	pki := filepath.Join(tmp, "pki")
	tlsBody := strings.Replace(body, "transport: {token_file: "+token+",",
		"transport: {tls: {ca: '"+pki+"/ca.pem', cert: '"+pki+"/stage-{stage}.pem', key: '"+pki+"/stage-{stage}-key.pem'},", 1)
	if err := os.WriteFile(cfg, []byte(tlsBody), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, time.Minute, nil, "certs", "--config", cfg, "--out", pki); r.err != nil {
		t.Fatalf("certs: %v\n%s", r.err, r.out)
	}
	procs = startOnHosts(folders())
	for i, err := range awaitRanks(t, procs, 3*time.Minute) {
		if err != nil {
			t.Fatalf("rank %d with mutual TLS: %v\n%s", i, err, procs[i].out.String())
		}
	}
}
