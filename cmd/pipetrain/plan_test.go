package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/predict"
)

// planMLP is a three-layer MLP small enough to measure in a test, whose
// layers take microseconds: every step is dominated by the planner's fixed
// costs per action, transfer and all-reduce message.
const planMLP = `
name: tiny
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 16, micro_batches: 2}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001, cpus: "0"}
  - {layers: "1-2", address: 127.0.0.1:7002}
`

// runPlanned runs plan on the config text and loads what it wrote.
func runPlanned(t *testing.T, text string, args ...string) (string, *configs.Config, error) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	planned := filepath.Join(dir, "planned.yaml")
	out, err := runCommand(t, planCmd(), append([]string{"--config", cfg, "--out", planned, "--reps", "1"}, args...)...)
	if err != nil {
		return out, nil, err
	}
	c, err := configs.Load(planned)
	if err != nil {
		t.Fatalf("the planned config does not load: %v", err)
	}
	return out, c, nil
}

// TestPlanProcessesChoosesReplicas: two processes, one stage or two. With
// an all-reduce that costs nothing, one stage of two replicas has no
// pipeline to fill and no transfer; with one whose every message takes a
// second, two stages win. The written config holds the grid chosen.
func TestPlanProcessesChoosesReplicas(t *testing.T) {
	out, c, err := runPlanned(t, planMLP, "--processes", "2", "--allreduce-bandwidth", "1000GB/s", "--allreduce-latency", "0")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	row := regexp.MustCompile(`(?m)^ +(\d) +(\d)  (\S+) +(\d+) +[\d.]+ +\d+ +(\S+ ms|-) +.*?(<- chosen)?$`)
	rows := row.FindAllStringSubmatch(out, -1)
	if len(rows) != 2 || rows[0][1] != "2" || rows[1][1] != "1" || rows[0][6] != "" || rows[1][6] == "" {
		t.Fatalf("want rows 2×1 and 1×2, 1×2 chosen:\n%s", out)
	}
	if c.Replicas() != 2 || len(c.Stages) != 1 || !reflect.DeepEqual(c.Stages[0].Layers, []string{"0-2"}) ||
		!reflect.DeepEqual(c.Stages[0].Addresses, []string{"127.0.0.1:7001", "127.0.0.1:7101"}) || c.Stages[0].CPUs != "" {
		t.Errorf("planned config: data_parallel %d, stages %+v", c.DataParallel, c.Stages)
	}
	if c.Data.BatchSize%(c.Replicas()*c.Data.MicroBatches) != 0 {
		t.Errorf("micro_batches %d does not divide the replicas' batch", c.Data.MicroBatches)
	}
	for _, w := range []string{
		"grids of 2 processes (stages × replicas), each planned on its replicas' share of the batch:",
		"; 2 replicas: ",
		"left out cpus: each is one process's, and 2 replicas cannot share it",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	if !strings.Contains(out, "\nnow:  layers 0 | 1-2, 1f1b, 2 micro-batches: ") {
		t.Errorf("no comparison with the config's own grid, 2 × 1:\n%s", out)
	}

	out, c, err = runPlanned(t, planMLP, "--processes", "2", "--allreduce-latency", "1s")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rows = row.FindAllStringSubmatch(out, -1)
	if len(rows) != 2 || rows[0][6] == "" || rows[1][6] != "" {
		t.Fatalf("want 2×1 chosen:\n%s", out)
	}
	if c.Replicas() != 1 || len(c.Stages) != 2 || c.Stages[1].Address != "127.0.0.1:7002" || len(c.Stages[0].Addresses) != 0 || c.Stages[0].CPUs != "0" {
		t.Errorf("planned config: data_parallel %d, stages %+v", c.DataParallel, c.Stages)
	}
	if !strings.Contains(out, "; not measured, the ring taken at 2 GB/s, as the transfer estimate takes gRPC on loopback (--allreduce-bandwidth sets it)") {
		t.Errorf("the default bandwidth not marked:\n%s", out)
	}
}

// TestPlanMeasuresTheRing: with --allreduce-bandwidth measure the grids
// are charged figures timed here, and the output says so, unmarked.
func TestPlanMeasuresTheRing(t *testing.T) {
	out, _, err := runPlanned(t, planMLP, "--processes", "2", "--allreduce-bandwidth", "measure")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !regexp.MustCompile(`  all-reduce: a ring at [0-9.]+ [MG]B/s plus [0-9.]+ ms a message, buckets of 1.00 MiB; measured here: 2 ranks in one process over ring streams on loopback`).MatchString(out) {
		t.Errorf("no measured ring figures in\n%s", out)
	}
	if strings.Contains(out, "not measured") {
		t.Errorf("measured figures called assumed:\n%s", out)
	}
}

// TestPlanProcessesGridsWithoutPlans: with four processes, four stages
// cannot share three layers; the table says so and plans the others.
func TestPlanProcessesGridsWithoutPlans(t *testing.T) {
	out, c, err := runPlanned(t, planMLP, "--processes", "4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^ +4 +1  none: 4 stages for 3 layers$`).MatchString(out) {
		t.Errorf("no reason for the 4×1 grid:\n%s", out)
	}
	if c.Processes() != 4 {
		t.Errorf("planned %d stages × %d replicas", len(c.Stages), c.Replicas())
	}
	seen := map[string]bool{}
	for s := range c.Stages {
		for r := range c.Replicas() {
			a := c.Address(s, r)
			if a == "" || seen[a] {
				t.Errorf("stage %d replica %d: address %q missing or taken", s, r, a)
			}
			seen[a] = true
		}
	}
}

// TestPlanWithoutProcesses: a config without replicas is planned as it
// always was (no grid, no all-reduce, address: per stage); one with
// replicas keeps them and is charged their all-reduce.
func TestPlanWithoutProcesses(t *testing.T) {
	out, c, err := runPlanned(t, planMLP)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "grids") || strings.Contains(out, "all-reduce") || strings.Contains(out, "replica") {
		t.Errorf("replicas in the plan of a config without any:\n%s", out)
	}
	if c.Replicas() != 1 || len(c.Stages) != 2 || c.Stages[0].Address != "127.0.0.1:7001" || c.Stages[0].CPUs != "0" {
		t.Errorf("planned %+v", c.Stages)
	}
	replicated := strings.Replace(planMLP, "schedule: 1f1b", "schedule: 1f1b\ndata_parallel: 2", 1)
	replicated = strings.Replace(replicated, `address: 127.0.0.1:7001, cpus: "0"`, "addresses: [127.0.0.1:7001, 127.0.0.1:7011]", 1)
	replicated = strings.Replace(replicated, "address: 127.0.0.1:7002", "addresses: [127.0.0.1:7002, 127.0.0.1:7012]", 1)
	out, c, err = runPlanned(t, replicated)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Replicas() != 2 || !reflect.DeepEqual(c.Stages[1].Addresses, []string{"127.0.0.1:7002", "127.0.0.1:7012"}) {
		t.Errorf("planned data_parallel %d, %+v", c.DataParallel, c.Stages)
	}
	if !regexp.MustCompile(`\nplan: .*; 2 replicas: \d+ samples/s, all-reduce exposed [\d.]+ ms\nnow:  .*; 2 replicas: `).MatchString(out) {
		t.Errorf("no replicas in the plan:\n%s", out)
	}
}

func TestPlanProcessesErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--processes", "2", "--stages", "2"}, "give --stages or --processes, not both"},
		{[]string{"--processes", "-1"}, "--processes -1: need at least 1"},
		{[]string{"--reps", "0"}, "--reps 0: need at least 1"},
		{[]string{"--processes", "2", "--allreduce-bandwidth", "x"}, `--allreduce-bandwidth: "x" is not a rate`},
		{[]string{"--processes", "4", "--micro-batches", "16"}, "no grid of 4 processes has a plan (stages × replicas): 4×1: 4 stages for 3 layers; 2×2: 16 micro-batches do not divide the replicas' batch of 8; 1×4: "},
	} {
		out, _, err := runPlanned(t, planMLP, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q\n%s", tc.args, err, tc.want, out)
		}
	}
}

// TestPlanRecomputesToFit: below the memory the leanest plan that keeps its
// activations needs, plan has every stage recompute its forwards, says so,
// and writes recompute: full into each stage; without a limit it keeps them.
// Three stages of one layer each under 1F1B keep 3, 2 and 1 micro-batches:
// recomputing, stage 0 keeps one micro-batch's activations and two inputs.
func TestPlanRecomputesToFit(t *testing.T) {
	wide := strings.Replace(planMLP, "hidden: [6, 5]", "hidden: [64, 64]", 1)
	wide = strings.Replace(wide, "batch_size: 16", "batch_size: 1024", 1)
	out, _, err := runPlanned(t, wide, "--memory-limit", "1", "--stages", "3", "--micro-batches", "4", "--schedules", "1f1b")
	if err == nil {
		t.Fatalf("a 1-byte limit was met:\n%s", out)
	}
	m := regexp.MustCompile(`smallest limit that fits is (\d+) bytes \((1f1b[^,]*), 4 micro-batches\)`).FindStringSubmatch(err.Error())
	if m == nil || m[2] != "1f1b recomputing" {
		t.Fatalf("want the smallest limit, recomputing: %v", err)
	}
	out, c, err := runPlanned(t, wide, "--memory-limit", m[1], "--stages", "3", "--micro-batches", "4", "--schedules", "1f1b")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "plan: ") || !strings.Contains(out, "1f1b recomputing every forward") {
		t.Errorf("the plan does not say it recomputes:\n%s", out)
	}
	for i := range c.Stages {
		if !c.RecomputesFull(i) {
			t.Errorf("planned stage %d has recompute %q, want full", i, c.Stages[i].Recompute)
		}
	}
	out, c, err = runPlanned(t, wide, "--stages", "3", "--micro-batches", "4", "--schedules", "1f1b")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "recomputing") || c.RecomputesFull(0) {
		t.Errorf("without a limit the plan recomputes:\n%s", out)
	}
}

// TestPlanMeasuresAtTheKeptMicroBatch: with --micro-batches the layers are
// timed at the micro-batch size the plan will run (the replicas' share of
// the batch over the count), not the config's, whose costs would be scaled.
func TestPlanMeasuresAtTheKeptMicroBatch(t *testing.T) {
	for _, tc := range []struct {
		text string
		args []string
		want string
	}{
		{planMLP, nil, "at micro-batch 8 "}, // the config's: 16 / 2
		{planMLP, []string{"--micro-batches", "4"}, "at micro-batch 4 "},
		{strings.Replace(planMLP, "micro_batches: 2", "micro_batches: 8", 1), []string{"--micro-batches", "1"}, "at micro-batch 16 "},
	} {
		out, c, err := runPlanned(t, tc.text, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		if first, _, _ := strings.Cut(out, "\n"); !strings.Contains(first, tc.want) {
			t.Errorf("%v: %q, want it measured %s", tc.args, first, tc.want)
		}
		if len(tc.args) > 0 && strconv.Itoa(c.Data.MicroBatches) != tc.args[1] {
			t.Errorf("%v: planned %d micro-batches", tc.args, c.Data.MicroBatches)
		}
	}
}

// TestPlanKeepsMicroBatchesUnlessAsked: the micro-batch count changes the
// training, so plan keeps the config's unless --micro-batches or
// --allow-micro-batches asks, and says when it changes it. The tiny model's
// steps are all fixed costs per action, so one micro-batch is clearly
// fastest: the count the plan would choose if let.
func TestPlanKeepsMicroBatchesUnlessAsked(t *testing.T) {
	unchanged := "the training stays bit-identical to the given config's"
	for _, tc := range []struct {
		args    []string
		want    int
		changed string // the notice's "asked for with" flag, "" for none
	}{
		{nil, 2, ""},
		{[]string{"--micro-batches", "2"}, 2, ""},
		{[]string{"--micro-batches", "4"}, 4, "--micro-batches"},
	} {
		out, c, err := runPlanned(t, planMLP, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		if c.Data.MicroBatches != tc.want {
			t.Errorf("%v: planned %d micro-batches, want %d\n%s", tc.args, c.Data.MicroBatches, tc.want, out)
		}
		notice := fmt.Sprintf("changes the training: data.micro_batches 2 -> %d (asked for with %s)", tc.want, tc.changed)
		switch {
		case tc.changed == "" && (!strings.Contains(out, unchanged) || strings.Contains(out, "changes the training")):
			t.Errorf("%v: want only %q:\n%s", tc.args, unchanged, out)
		case tc.changed != "" && (!strings.Contains(out, notice) || strings.Contains(out, unchanged)):
			t.Errorf("%v: want %q:\n%s", tc.args, notice, out)
		}
	}
	// Micro-batches of one sample: 16 micro-batches of actions whose fixed
	// costs outweigh their work, which fewer would save.
	many := strings.Replace(planMLP, "micro_batches: 2", "micro_batches: 16", 1)
	out, c, err := runPlanned(t, many)
	if err != nil || c.Data.MicroBatches != 16 {
		t.Fatalf("without --allow-micro-batches: %v, planned %v\n%s", err, c, out)
	}
	out, c, err = runPlanned(t, many, "--allow-micro-batches")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	notice := fmt.Sprintf("changes the training: data.micro_batches 16 -> %d (asked for with --allow-micro-batches)", c.Data.MicroBatches)
	if c.Data.MicroBatches == 16 || !strings.Contains(out, notice) || strings.Contains(out, unchanged) {
		t.Errorf("--allow-micro-batches: planned %d micro-batches; want fewer and %q:\n%s", c.Data.MicroBatches, notice, out)
	}
	_, _, err = runPlanned(t, planMLP, "--micro-batches", "4", "--allow-micro-batches")
	if err == nil || !strings.Contains(err.Error(), "give --micro-batches 4 or --allow-micro-batches, not both") {
		t.Errorf("--micro-batches with --allow-micro-batches: %v", err)
	}
}

// TestPlanKeepsTheGivenConfigWithinTheMargin: a margin larger than any gain
// keeps the given config and says by how much the fastest plan beat it; the
// replicas --processes changes are noticed as changing the training.
func TestPlanKeepsTheGivenConfigWithinTheMargin(t *testing.T) {
	out, c, err := runPlanned(t, planMLP, "--allow-micro-batches", "--margin", "1000")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Data.MicroBatches != 2 || !reflect.DeepEqual(c.Stages[0].Layers, []string{"0"}) || c.Schedule != "1f1b" ||
		!regexp.MustCompile(`keeping the given config: the fastest plan found \(layers .*, step [\d.]+ ms\) is [\d.]+x of it, within --margin 1000%`).MatchString(out) {
		t.Errorf("the given config was not kept:\n%s", out)
	}
	if _, _, err := runPlanned(t, planMLP, "--margin", "-1"); err == nil {
		t.Error("--margin -1 accepted")
	}
	out, c, err = runPlanned(t, planMLP, "--processes", "2", "--allreduce-bandwidth", "1000GB/s", "--allreduce-latency", "0")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Replicas() != 2 || !strings.Contains(out, "changes the training: data_parallel 1 -> 2 (asked for with --processes)") {
		t.Errorf("planned %d replicas without saying it changes the training:\n%s", c.Replicas(), out)
	}
}

// TestPlanCoresFromTheConfig: the cores the plan's processes share are the
// CPUs the config pins its stages to (or the machine's), and none are
// charged when a stage runs on another machine; each stage's threads are its
// share, or compute.blas_threads.
func TestPlanCoresFromTheConfig(t *testing.T) {
	pinned := strings.Replace(planMLP, "address: 127.0.0.1:7002}", `address: 127.0.0.1:7002, cpus: "0"}`, 1)
	half := planMLP // stage 0 pinned, stage 1 free to run on any CPU
	remote := strings.Replace(planMLP, "127.0.0.1:7002", "192.0.2.1:7002", 1) + "transport: {token: secret}\n"
	threads := strings.Replace(pinned, "schedule: 1f1b", "schedule: 1f1b\ncompute: {blas_threads: 3}", 1)
	for _, tc := range []struct {
		name, text string
		processes  int
		want       predict.PlanCores
		line       string
	}{
		{"pinned to one CPU", pinned, 2, predict.PlanCores{Cores: 1, Threads: 1, Processes: 2}, "1 BLAS thread a stage; 2 processes share 1 cores: those computing at once each run at cores/threads of their speed here (0.50 while all 2 do)"},
		{"three on it", pinned, 3, predict.PlanCores{Cores: 1, Threads: 1, Processes: 3}, "(0.33 while all 3 do)"},
		{"one stage pinned", half, 2, predict.PlanCores{Cores: float64(runtime.NumCPU()), Threads: max(1, runtime.NumCPU()/2), Processes: 2}, "BLAS thread"},
		{"blas_threads", threads, 2, predict.PlanCores{Cores: 1, Threads: 3, Processes: 2}, "3 BLAS threads a stage; 2 processes share 1 cores: those computing at once each run at cores/threads of their speed here (0.17 while all 2 do)"},
		{"one stage elsewhere", remote, 2, predict.PlanCores{Threads: max(1, runtime.NumCPU()/2), Processes: 2, Why: "stage 1 (192.0.2.1:7002) runs on another machine"}, "cores shared not charged: stage 1 (192.0.2.1:7002) runs on another machine"},
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := configs.Load(path)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := predict.SharePlanCores(cfg, tc.processes)
		if got != tc.want || !strings.Contains(describeCores(got), tc.line) {
			t.Errorf("%s: %+v, %q; want %+v, %q", tc.name, got, describeCores(got), tc.want, tc.line)
		}
	}
	out, _, err := runPlanned(t, pinned)
	if err != nil || !strings.Contains(out, "2 processes share 1 cores: those computing at once") {
		t.Errorf("plan on a pinned config does not share the cores: %v\n%s", err, out)
	}
}

// TestPlanWeighsReductions: for each grid with replicas plan simulates its
// plan under every reduction and names the fastest. With one replica a
// host, hierarchical is the ring; the fastest is the smallest step.
func TestPlanWeighsReductions(t *testing.T) {
	out, _, err := runPlanned(t, planMLP, "--processes", "2", "--allreduce-bandwidth", "1GB/s", "--allreduce-latency", "1ms",
		"--replicas-per-host", "1", "--servers", "2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{
		"\nreductions weighed on each plan (step ms; the same split, schedule and micro-batches): hierarchical with 1 consecutive replica a host (--replicas-per-host), within hosts the same: only one link figure is known (--within-host-bandwidth and --within-host-latency set them); ps sync with 2 parameter servers, which are processes of their own\n",
		"\n  stages  replicas           ring  reduce-to-one   hierarchical        ps sync  fastest\n",
		"\n  the plan keeps the config's reduction (ring); all_reduce.algorithm or parameter_servers choose another\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	row := regexp.MustCompile(`(?m)^ +1 +2 +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)  (ring|reduce-to-one|hierarchical|ps sync)`).FindStringSubmatch(out)
	if row == nil {
		t.Fatalf("no row for the 1 × 2 grid:\n%s", out)
	}
	names := []string{"ring", "reduce-to-one", "hierarchical", "ps sync"}
	steps := make([]float64, 4)
	for k := range steps {
		steps[k], _ = strconv.ParseFloat(row[k+1], 64)
	}
	if steps[2] != steps[0] {
		t.Errorf("hierarchical on hosts of one replica %v ms, the ring %v ms", steps[2], steps[0])
	}
	fastest := 0
	for k, x := range steps {
		if x < steps[fastest] {
			fastest = k
		}
	}
	if row[5] != names[fastest] {
		t.Errorf("fastest named %s, the steps %v", row[5], steps)
	}
}
