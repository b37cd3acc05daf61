package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
)

// TestSimulateZBV: simulate predicts zb-v on the shipped V config at its
// closed form (3 idle half-units of 51 with F = I = W), prints its grid with
// the placement line that --schedule-file needs to read it back as the same
// schedule, and on a plain config counts each chunk half a stage's
// activations, so that zb-v's peak is 1f1b's first stage's.
func TestSimulateZBV(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-zbv.yaml", "--schedule", "zb-v", "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\nzb-v (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%, equal-stage theory 5.9%\n") {
		t.Fatalf("no zb-v summary at its closed form:\n%s", out)
	}
	grid := printedGrids(out)["zb-v"]
	if !strings.Contains(grid, "\n  placement: v\n  stage 0: 0F0 ") {
		t.Fatalf("the printed grid lacks its placement:\n%s", grid)
	}
	path := filepath.Join(t.TempDir(), "zbv.txt")
	if err := os.WriteFile(path, []byte(grid), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-zbv.yaml", "--schedule-file", path, "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate --schedule-file: %v\n%s", err, again)
	}
	if !strings.Contains(again, "\nschedule from file (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%\n") {
		t.Errorf("the printed grid does not simulate as zb-v:\n%s", again)
	}

	// On its own config the V's activation memory is predicted per stage; as
	// a what-if on a config of one chunk per stage, where the layers would
	// be placed otherwise, it is not.
	own, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-zbv.yaml", "--schedule", "zb-v", "--costs", "f=1,b=2,w=1")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, own)
	}
	if n := len(regexp.MustCompile(`\n  stage \d [^\n]*peak stash \d+ micro-batch(?:es)?, activations [1-9][\d.]* MiB`).FindAllString(own, -1)); n != 4 {
		t.Errorf("%d of 4 stages with a predicted activation memory:\n%s", n, own)
	}
	whatIf, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-4stage.yaml", "--schedule", "zb-v,1f1b", "--costs", "f=1,b=2,w=1")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, whatIf)
	}
	zbv := whatIf[strings.Index(whatIf, "\nzb-v"):strings.Index(whatIf, "\n1f1b")]
	if strings.Contains(zbv, "activations") || !strings.Contains(whatIf[strings.Index(whatIf, "\n1f1b"):], "activations") {
		t.Errorf("zb-v as a what-if predicted memory for layers placed otherwise, or 1f1b did not:\n%s", whatIf)
	}
}

// planZBV is a six-layer MLP under zb-v on two stages: stage 0 holds layer
// 0 and layer 5, stage 1 layers 1-2 and 3-4.
const planZBV = `
name: tinyv
model: {name: mlp, input: 8, hidden: [6, 5, 4, 6, 5], classes: 3}
data: {batch_size: 16, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: zb-v
virtual_stages: 2
stages:
  - {layers: ["0", "5"], address: 127.0.0.1:7001}
  - {layers: ["1-2", "3-4"], address: 127.0.0.1:7002}
`

// TestPlanZBV: plan takes a zb-v config, evaluates its V split, and when
// asked for zb-v alone writes a V: each stage's two ranges in V order and
// virtual_stages 2, a config that loads; asked for a one-chunk schedule it
// writes one range per stage and drops virtual_stages.
func TestPlanZBV(t *testing.T) {
	out, c, err := runPlanned(t, planZBV, "--schedules", "zb-v", "--micro-batches", "4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "\nnow:  layers [0, 5] | [1-2, 3-4], zb-v, 4 micro-batches: ") {
		t.Errorf("no evaluation of the config's V:\n%s", out)
	}
	if !regexp.MustCompile(`\nplan: layers \[\d+(-\d+)?, \d+(-\d+)?\] \| \[\d+(-\d+)?, \d+(-\d+)?\], zb-v, 4 micro-batches: `).MatchString(out) {
		t.Errorf("the plan is not a V:\n%s", out)
	}
	if c.Schedule != "zb-v" || c.VirtualStages != 2 || len(c.Stages) != 2 || len(c.Stages[0].Layers) != 2 || c.LossStage() != 0 {
		t.Fatalf("planned config: schedule %s, virtual_stages %d, stages %+v", c.Schedule, c.VirtualStages, c.Stages)
	}
	out, c, err = runPlanned(t, planZBV, "--schedules", "1f1b", "--micro-batches", "4")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Schedule != "1f1b" || c.VirtualStages != 1 || len(c.Stages[0].Layers) != 1 {
		t.Errorf("planned config: schedule %s, virtual_stages %d, stages %+v", c.Schedule, c.VirtualStages, c.Stages)
	}
	interleaved := strings.NewReplacer("schedule: zb-v", "schedule: interleaved", `["0", "5"]`, `["0", "3"]`, `["1-2", "3-4"]`, `["1-2", "4-5"]`).Replace(planZBV)
	if out, _, err := runPlanned(t, interleaved); err == nil || !strings.Contains(err.Error(), "this config interleaves virtual stages") {
		t.Errorf("an interleaved config: %v\n%s", err, out)
	}
}

// simV is a 4-layer MLP under zb-v on two stages, stage 0 holding the
// model's first and last layers.
const simV = `
model: {name: mlp, input: 8, hidden: [6, 6, 5], classes: 3}
data: {batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: zb-v
virtual_stages: 2
stages:
  - {layers: ["0", "3"], address: 127.0.0.1:7001}
  - {layers: ["1", "2"], address: 127.0.0.1:7002}
`

// writeVRun writes a zb-v run's event logs on 2 stages of 2 chunks where
// each (stage, chunk) has its own F, I and W in ms.
func writeVRun(t *testing.T, micro int, costs [2][2][3]float64) string {
	t.Helper()
	info := profile.RunInfo{Schedule: "zb-v", Stages: 2, MicroBatches: micro, Steps: 2, Chunks: 2, Placement: "v"}
	kinds := []string{profile.Forward, profile.Input, profile.Weight}
	return writeRunDir(t, info, kinds, func(s, chunk int, kind string) float64 {
		return costs[s][chunk][slices.Index(kinds, kind)]
	})
}

// TestSimulateTakesChunkCosts: with costs from a V run, simulate gives each
// chunk its own F, I and W, as profile's prediction does (a V's chunks on one
// stage are the model's first and last layers, not halves of one range),
// and prints them; a what-if with one chunk per stage takes the stages'.
func TestSimulateTakesChunkCosts(t *testing.T) {
	// Stage 0's first chunk is heavy on F and light on I, its second the
	// other way round: an even split of the stage's costs hides that.
	costs := [2][2][3]float64{{{3, 0.5, 1}, {1, 2.5, 1}}, {{2, 1.5, 1}, {2, 1.5, 1}}}
	run := writeVRun(t, 4, costs)
	out, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simV), "--costs", run, "--transfer", "0", "--schedule", "zb-v,1f1b,interleaved")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	for _, line := range []string{
		"  stage 0  F 4.000 ms  B 5.000 ms*  (I 3.000 + W 2.000 ms)",
		"    chunk 0  F 3.000 ms  B 1.500 ms*  (I 0.500 + W 1.000 ms)",
		"    chunk 1  F 1.000 ms  B 3.500 ms*  (I 2.500 + W 1.000 ms)",
		"    chunk 1  F 2.000 ms  B 2.500 ms*  (I 1.500 + W 1.000 ms)",
	} {
		if !strings.Contains(out, "\n"+line+"\n") {
			t.Errorf("no line %q:\n%s", line, out)
		}
	}

	perStage := schedule.Costs{F: []float64{4, 4}, B: []float64{5, 5}, I: []float64{3, 3}, W: []float64{2, 2}}
	chunked := perStage
	chunked.Chunks = make([][]schedule.ChunkCost, 2)
	for s := range costs {
		for _, c := range costs[s] {
			chunked.Chunks[s] = append(chunked.Chunks[s], schedule.ChunkCost{F: c[0], B: c[1] + c[2], I: c[1], W: c[2]})
		}
	}
	makespan := func(name string, v int, c schedule.Costs) float64 {
		s, err := schedule.Build(name, 2, 4, v)
		if err != nil {
			t.Fatal(err)
		}
		tl, err := schedule.Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		return tl.Makespan
	}
	own, even := makespan("zb-v", 2, chunked), makespan("zb-v", 2, perStage)
	if math.Abs(own-even) < 0.01 {
		t.Fatalf("the chunks' own costs give zb-v the makespan an even split gives (%.2f ms): the test cannot tell them apart", own)
	}
	if want := fmt.Sprintf("\nzb-v (2 chunks per stage): makespan %.2f ms,", own); !strings.Contains(out, want) {
		t.Errorf("zb-v not simulated on its chunks' own costs: want %q (an even split gives %.2f ms):\n%s", want, even, out)
	}
	if want := fmt.Sprintf("\n1f1b: makespan %.2f ms,", makespan("1f1b", 1, perStage)); !strings.Contains(out, want) {
		t.Errorf("1f1b as a what-if not simulated on the stages' costs: want %q:\n%s", want, out)
	}
	// Interleaved runs two chunks a stage too, but in a loop: the V's chunk
	// costs (and activations) belong to layers it would place otherwise.
	if want := fmt.Sprintf("\ninterleaved (2 chunks per stage): makespan %.2f ms,", makespan("interleaved", 2, perStage)); !strings.Contains(out, want) {
		t.Errorf("interleaved as a what-if on a V's config not simulated on the stages' costs: want %q:\n%s", want, out)
	}
	interleaved := out[strings.Index(out, "\ninterleaved (2 chunks"):]
	if i := strings.Index(interleaved, "simulated, makespan"); i < 0 || strings.Contains(interleaved[:i], "activations") {
		t.Errorf("interleaved as a what-if on a V's config predicted the V's activations:\n%s", interleaved)
	}
	// Measured here, each chunk is timed on its own too.
	measured, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simV), "--costs", "measure", "--reps", "1", "--schedule", "zb-v")
	if err != nil {
		t.Fatalf("simulate --costs measure: %v\n%s", err, measured)
	}
	if n := len(regexp.MustCompile(`(?m)^    chunk [01]  F \d+\.\d{3} ms  B \d+\.\d{3} ms  \(I \d+\.\d{3} \+ W \d+\.\d{3} ms\)$`).FindAllString(measured, -1)); n != 4 {
		t.Errorf("%d of 4 chunks printed with their measured costs:\n%s", n, measured)
	}
}
