package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
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
	if !regexp.MustCompile(`  all-reduce: a ring at [0-9.]+ [MG]B/s plus [0-9.]+ ms a message, buckets of 1.00 MiB; measured here: 2 ranks in one process over gRPC links on loopback`).MatchString(out) {
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

// TestPlannedAddresses: the config's addresses are kept; a new stage takes
// the port after the last stage's, a new replica its stage's port plus 100
// per replica, and a port already taken moves on.
func TestPlannedAddresses(t *testing.T) {
	cfg := &configs.Config{Stages: []configs.Stage{{Address: "127.0.0.1:7001"}, {Address: "127.0.0.1:7101"}}}
	// Stage 0's replica 1 would have stage 1's port, and takes the next;
	// stage 2's (the port after the last stage's) is then taken too.
	want := [][]string{{"127.0.0.1:7001", "127.0.0.1:7102"}, {"127.0.0.1:7101", "127.0.0.1:7201"}, {"127.0.0.1:7103", "127.0.0.1:7203"}}
	if got := plannedAddresses(cfg, 3, 2); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	grid := &configs.Config{DataParallel: 2, Stages: []configs.Stage{
		{Address: "127.0.0.1:7501", Addresses: []string{"127.0.0.1:7501", "127.0.0.1:7511"}},
		{Address: "127.0.0.1:7502", Addresses: []string{"127.0.0.1:7502", "127.0.0.1:7512"}},
	}}
	want = [][]string{{"127.0.0.1:7501", "127.0.0.1:7511", "127.0.0.1:7701"}, {"127.0.0.1:7502", "127.0.0.1:7512", "127.0.0.1:7702"}}
	if got := plannedAddresses(grid, 2, 3); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	want = [][]string{{"127.0.0.1:7501"}}
	if got := plannedAddresses(grid, 1, 1); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestPlannedConfigKeepsTheSchemaLine: a planned config names the schema the
// source named, as its first line, with a relative path that still points at
// the schema from where the planned file is written.
func TestPlannedConfigKeepsTheSchemaLine(t *testing.T) {
	for _, tc := range []struct{ src, out, want string }{
		{"configs/a.yaml", "configs/a-planned.yaml", "# yaml-language-server: $schema=./pipetrain.schema.json\n"},
		{"configs/a.yaml", "runs/x/planned.yaml", "# yaml-language-server: $schema=../../configs/pipetrain.schema.json\n"},
		{"configs/a.yaml", "planned.yaml", "# yaml-language-server: $schema=./configs/pipetrain.schema.json\n"},
		{"/srv/run/configs/a.yaml", "/srv/out/b.yaml", "# yaml-language-server: $schema=../run/configs/pipetrain.schema.json\n"},
		{"configs/a.yaml", "/srv/out/b.yaml", "# yaml-language-server: $schema=" + relFromSrvOut(t) + "\n"},
	} {
		raw := []byte("# yaml-language-server: $schema=./pipetrain.schema.json\nname: a\n")
		if got := schemaModeline(tc.src, raw, tc.out); got != tc.want {
			t.Errorf("%s -> %s: %q, want %q", tc.src, tc.out, got, tc.want)
		}
	}
	if got := schemaModeline("a.yaml", []byte("name: a\n# yaml-language-server: $schema=x.json\n"), "b.yaml"); got != "" {
		t.Errorf("a modeline not on the first line was kept: %q", got)
	}
	if got := schemaModeline("configs/a.yaml", []byte("# yaml-language-server: $schema=https://example.org/s.json\n"), "x/b.yaml"); got != "# yaml-language-server: $schema=https://example.org/s.json\n" {
		t.Errorf("a URL was rewritten: %q", got)
	}
}

// relFromSrvOut is the path from /srv/out to configs/pipetrain.schema.json
// under the test's working directory.
func relFromSrvOut(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel("/srv/out", filepath.Join(wd, "configs", "pipetrain.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	return rel
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
