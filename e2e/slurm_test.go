package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/internal/netns"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// needSlurm skips a test unless it can bring up a one-node Slurm cluster:
// root, and Debian's slurmctld, slurmd, munge and slurm-client.
func needSlurm(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.RequireOrSkip(t, "root", "the Slurm test cluster's daemons run as root")
	}
	for _, b := range []string{"slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "scontrol"} {
		if _, err := exec.LookPath(b); err != nil {
			testenv.RequireOrSkip(t, b+" (Debian packages slurmctld slurmd munge slurm-client, which .ci/run installs)", err.Error())
		}
	}
}

// slurmCluster brings up deploy/slurm/testcluster.sh's one-node cluster in a
// temporary directory, torn down when the test ends however it ends, and
// returns the environment its commands need.
func slurmCluster(t *testing.T) []string {
	t.Helper()
	env, _ := slurmNodes(t, 1)
	return env
}

// slurmNodes brings up testcluster.sh's cluster of n nodes (n > 1: each a
// network namespace on a private bridge) in a temporary directory, torn down
// when the test ends however it ends, and returns the environment its
// commands need and that directory. upEnv goes to testcluster.sh up.
func slurmNodes(t *testing.T, n int, upEnv ...string) (env []string, dir string) {
	t.Helper()
	script, err := filepath.Abs("../deploy/slurm/testcluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	// Registered before up: up that fails halfway stops what it started too,
	// and down on what never ran does nothing.
	t.Cleanup(func() {
		if out, err := exec.Command(script, "down", dir).CombinedOutput(); err != nil {
			t.Errorf("testcluster.sh down: %v\n%s", err, out)
		}
	})
	ports := freePorts(t, 2)
	args := []string{"up", dir}
	if n > 1 {
		args = append(args, strconv.Itoa(n))
	}
	up := exec.Command(script, args...)
	up.Env = append(append(os.Environ(),
		"SLURMCTLD_PORT="+strings.TrimPrefix(ports[0], "127.0.0.1:"),
		"SLURMD_PORT="+strings.TrimPrefix(ports[1], "127.0.0.1:")), upEnv...)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("testcluster.sh up: %v\n%s", err, out)
	}
	return []string{"SLURM_CONF=" + filepath.Join(dir, "slurm.conf")}, dir
}

// slurm runs a Slurm command and returns its output, failing the test if it fails.
func slurm(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

var jobState = regexp.MustCompile(`\bJobState=(\S+)`)

// awaitJob polls the job until it is in one of the states want, and returns
// that state; a job that ends in another state, or does not get there within
// timeout, fails the test with its output.
func awaitJob(t *testing.T, env []string, id, output string, timeout time.Duration, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	state := ""
	for time.Now().Before(deadline) {
		m := jobState.FindStringSubmatch(slurm(t, env, "scontrol", "-o", "show", "job", id))
		if m == nil {
			t.Fatalf("scontrol shows no state for job %s", id)
		}
		state = m[1]
		for _, w := range want {
			if state == w {
				return state
			}
		}
		switch state {
		case "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED":
		default:
			t.Fatalf("job %s ended %s, want %v:\n%s", id, state, want, readFile(output))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("job %s still %s after %v, want %v:\n%s", id, state, timeout, want, readFile(output))
	return ""
}

// taskPID is the process of the job's first step that runs rank, as
// scontrol listpids shows it on this node; 0 if there is none.
func taskPID(t *testing.T, env []string, id string, rank int) int {
	t.Helper()
	for _, line := range strings.Split(slurm(t, env, "scontrol", "listpids", id), "\n") {
		var pid, job, step, local, global int
		if n, _ := fmt.Sscan(line, &pid, &job, &step, &local, &global); n == 5 && step == 0 && global == rank {
			return pid
		}
	}
	return 0
}

// slurmConfig writes a copy of the default config for a batch job: every
// stage's address auto (the rendezvous gives them), a token file (a rank
// may listen beyond loopback), steps steps and a checkpoint every 10.
func slurmConfig(t *testing.T, steps int) string {
	t.Helper()
	text, err := os.ReadFile(defaultConfig)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := yaml.Unmarshal(text, &c); err != nil {
		t.Fatal(err)
	}
	section := func(name string) map[string]any {
		s, ok := c[name].(map[string]any)
		if !ok {
			t.Fatalf("%s has no %s section", defaultConfig, name)
		}
		return s
	}
	section("train")["steps"] = steps
	section("train")["evaluate"] = false
	section("checkpoint")["every"] = 10
	section("transport")["token_file"] = "token.txt"
	stages, _ := c["stages"].([]any)
	for _, s := range stages {
		s.(map[string]any)["address"] = "auto"
	}
	if len(stages) != 4 {
		t.Fatalf("%s has %d stages, want 4", defaultConfig, len(stages))
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token.txt"), []byte("slurm-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "slurm.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSlurmBatchTrainsAndRequeueResumes submits deploy/slurm/pipetrain.sbatch
// to a one-node Slurm cluster brought up for the test. A job trains a config
// of auto addresses to the end, its four tasks placed by SLURM_PROCID and
// connected by the rendezvous, equal to the reference bit for bit. A second
// job has one task SIGKILLed once a checkpoint is committed: srun must stop
// the others and the job end FAILED with no stage left; `scontrol requeue`
// must start it again, resume from the checkpoint, and end with the first
// job's losses and weights, bit for bit.
func TestSlurmBatchTrainsAndRequeueResumes(t *testing.T) {
	needData(t)
	needSlurm(t)
	const steps = 80
	env := slurmCluster(t)
	cfg := slurmConfig(t, steps)
	batch, err := filepath.Abs("../deploy/slurm/pipetrain.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)

	work := t.TempDir()
	submit := func(runDir string) (id, output, port string) {
		port = strings.TrimPrefix(freePorts(t, 1)[0], "127.0.0.1:")
		jobEnv := append([]string{"PIPETRAIN=" + binary, "MASTER_PORT=" + port}, env...)
		id = slurm(t, jobEnv, "sbatch", "--parsable", "--chdir", work, "--output", filepath.Join(work, "slurm-%j.out"), batch, cfg, runDir)
		return id, filepath.Join(work, "slurm-"+id+".out"), port
	}

	// (a) A job trains to the end.
	clean := filepath.Join(work, "clean")
	id, output, port := submit(clean)
	awaitJob(t, env, id, output, 3*time.Minute, "COMPLETED")
	text := readFile(output)
	for rank := range 4 {
		for _, want := range []string{
			fmt.Sprintf("%d: pipetrain: rank %d of 4 from SLURM_PROCID/SLURM_NTASKS (Slurm): stage %d", rank, rank, rank),
			fmt.Sprintf("%d: pipetrain: stage %d listens on 127.0.0.1:", rank, rank),
			fmt.Sprintf("%d: stage %d: done", rank, rank),
		} {
			if !strings.Contains(text, want) {
				t.Errorf("job %s's output lacks %q:\n%s", id, want, text)
			}
		}
	}
	if want := "the rendezvous at 127.0.0.1:" + port + " gave every process's address"; strings.Count(text, want) != 4 {
		t.Errorf("not every rank used the rendezvous %s:\n%s", port, text)
	}
	sameRun(t, refDir, clean, steps)

	// (b) A job loses a task after a checkpoint, fails, and is requeued.
	dir := filepath.Join(work, "requeued")
	id, output, _ = submit(dir)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if m, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*", "manifest.json")); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s committed no checkpoint within 2 minutes:\n%s", id, readFile(output))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The srun in the batch script has the stages' arguments too: Slurm
	// names the task's own process.
	victim := rand.IntN(4)
	pid := taskPID(t, env, id, victim)
	if pid == 0 {
		t.Fatalf("job %s's task %d not found after its first checkpoint:\n%s", id, victim, readFile(output))
	}
	t.Logf("killing job %s's task %d (pid %d)", id, victim, pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitJob(t, env, id, output, time.Minute, "FAILED")
	if left := processPID(dir); left != 0 {
		t.Errorf("job %s FAILED but its stage process %d still runs", id, left)
	}
	if ms := readMetrics(t, dir); ms[len(ms)-1].Step >= steps {
		t.Fatalf("job %s finished all %d steps before its task was killed:\n%s", id, steps, readFile(output))
	}
	failed := readFile(output)
	if !strings.Contains(failed, "Killed") {
		t.Errorf("srun did not report the killed task:\n%s", failed)
	}
	slurm(t, env, "scontrol", "requeue", id)
	awaitJob(t, env, id, output, 3*time.Minute, "COMPLETED")
	text = strings.TrimPrefix(readFile(output), failed)
	requeued := regexp.MustCompile(`pipetrain\.sbatch: job ` + id + ` requeued \(restart 1\): resuming from the last committed checkpoint: ` +
		regexp.QuoteMeta(filepath.Join(dir, "checkpoints")) + `/step-0*([1-9][0-9]*)\n`).FindStringSubmatch(text)
	if requeued == nil {
		t.Fatalf("the requeued job did not say which checkpoint it resumes from:\n%s", text)
	}
	if n := len(regexp.MustCompile(`stage [0-3]: resumed from the checkpoint of step `+requeued[1]+`\b`).FindAllString(text, -1)); n != 4 {
		t.Errorf("%d of 4 ranks resumed from the checkpoint of step %s:\n%s", n, requeued[1], text)
	}
	if strings.Contains(text, "starting from step 0") {
		t.Errorf("the requeued job started over:\n%s", text)
	}
	sameRun(t, clean, dir, steps)
}

// TestSlurmAcrossNodes submits deploy/slurm/pipetrain.sbatch to a two-node
// Slurm cluster whose slurmds run on hosts of their own (testcluster.sh up
// DIR 2: network namespaces on a private bridge), two tasks per node, with
// a run directory that is node-local: the same path on both nodes, a
// different folder bound over it in each slurmd's mount namespace. The job
// completes; the rendezvous is at the first node's address, the ranks listen
// on both nodes' addresses, and rank 0's folder, to which the other ranks'
// files come home at the end, equals the reference bit for bit.
func TestSlurmAcrossNodes(t *testing.T) {
	needData(t)
	needSlurm(t)
	if why := netns.Available(); why != "" {
		testenv.RequireOrSkip(t, netns.Needs, why)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		testenv.RequireOrSkip(t, "nsenter (util-linux)", err.Error())
	}
	const steps = 80
	local := t.TempDir() // node-local on each node; empty here
	env, dir := slurmNodes(t, 2, "NODE_LOCAL="+local)
	var nodes, x int
	if text, err := os.ReadFile(filepath.Join(dir, "nodes")); err != nil {
		t.Fatal(err)
	} else if _, err := fmt.Sscan(string(text), &nodes, &x); err != nil || nodes != 2 {
		t.Fatalf("testcluster.sh's %s/nodes: %q", dir, text)
	}
	addrs := []string{fmt.Sprintf("10.232.%d.1", x), fmt.Sprintf("10.232.%d.2", x)}
	cfg := slurmConfig(t, steps)
	batch, err := filepath.Abs("../deploy/slurm/pipetrain.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)

	work := t.TempDir()
	runDir := filepath.Join(local, "run")
	jobEnv := append([]string{"PIPETRAIN=" + binary, "MASTER_PORT=29400"}, env...)
	id := slurm(t, jobEnv, "sbatch", "--parsable", "--chdir", work, "--output", filepath.Join(work, "slurm-%j.out"),
		"--nodes=2", "--ntasks-per-node=2", "--ntasks=4", batch, cfg, runDir)
	output := filepath.Join(work, "slurm-"+id+".out")
	awaitJob(t, env, id, output, 3*time.Minute, "COMPLETED")
	text := readFile(output)
	if want := "pipetrain.sbatch: 4 tasks on node[1-2], rendezvous " + addrs[0] + ":29400"; !strings.Contains(text, want) {
		t.Errorf("job %s's output lacks %q:\n%s", id, want, text)
	}
	for rank := range 4 {
		for _, want := range []string{
			fmt.Sprintf("%d: pipetrain: rank %d of 4 from SLURM_PROCID/SLURM_NTASKS (Slurm): stage %d", rank, rank, rank),
			// Block distribution: ranks 0 and 1 on node1, 2 and 3 on node2.
			fmt.Sprintf("%d: pipetrain: stage %d listens on %s:", rank, rank, addrs[rank/2]),
			fmt.Sprintf("%d: stage %d: done", rank, rank),
		} {
			if !strings.Contains(text, want) {
				t.Errorf("job %s's output lacks %q:\n%s", id, want, text)
			}
		}
	}
	if want := "the rendezvous at " + addrs[0] + ":29400 gave every process's address"; strings.Count(text, want) != 4 {
		t.Errorf("not every rank used the rendezvous at %s:29400:\n%s", addrs[0], text)
	}
	if left, _ := os.ReadDir(local); len(left) > 0 {
		t.Errorf("the job wrote into %s outside the nodes: %v", local, left)
	}
	node := func(k int) string { return filepath.Join(dir, fmt.Sprintf("node%d", k), "local", "run") }
	for k := 1; k <= 2; k++ {
		if m, _ := filepath.Glob(filepath.Join(node(k), "checkpoints", "*", "manifest.json")); len(m) == 0 {
			t.Errorf("node%d's run directory holds no committed checkpoint", k)
		}
	}
	sameRun(t, refDir, node(1), steps)
}
