package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/predict"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// simMLP is a 2-stage MLP small enough to measure in a test; with m = 4 every
// built-in schedule applies (interleaved needs m a multiple of p).
const simMLP = `
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-2", address: 127.0.0.1:7002}
`

// simCNN's convolutions cannot split their backward: validate and launch
// refuse zb-h1.
const simCNN = `
model: {name: cnn, input: 64, channels: [2], classes: 3}
data: {batch_size: 8, micro_batches: 2}
train: {steps: 1, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1", address: 127.0.0.1:7002}
`

// simGPT's layers all split their backward, as the MLP's do.
const simGPT = `
model: {name: gpt, layers: 2, width: 16, heads: 2, context: 8, vocab: 256}
data: {dataset: text, corpus: "go:strings", tokenizer: byte, val_fraction: 0.1, batch_size: 4, micro_batches: 2}
train: {steps: 1, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`

func writeSimConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var gridComment = regexp.MustCompile(`^\s*# (\S+)(?: \(\d+ chunks per stage\))?: actions per stage`)

// isPlacementLine reports whether a printed line is a grid's placement line
// (zb-v's "placement: v"), part of the grid it heads.
func isPlacementLine(line string) bool {
	return strings.HasPrefix(strings.TrimSpace(line), "placement: ")
}

// printedGrids cuts each schedule's grid block (its comment line and the
// placement and "stage N:" lines after it) out of simulate's output, by
// schedule name.
func printedGrids(out string) map[string]string {
	grids := map[string]string{}
	lines := strings.Split(out, "\n")
	for i := 0; i < len(lines); i++ {
		m := gridComment.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		block := []string{lines[i]}
		for i+1 < len(lines) && (strings.HasPrefix(strings.TrimSpace(lines[i+1]), "stage ") && strings.Contains(lines[i+1], ":") || isPlacementLine(lines[i+1])) {
			i++
			block = append(block, lines[i])
		}
		grids[m[1]] = strings.Join(block, "\n") + "\n"
	}
	return grids
}

// TestSimulateGridRoundTrips: for every built-in schedule, the grid simulate
// prints, copied as it stands (comment and indentation included) into a file,
// reads back through schedule.ReadFile, and through Load as "grid", as the
// very schedule simulated.
func TestSimulateGridRoundTrips(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simMLP), "--costs", "f=1,b=2,w=1")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	grids := printedGrids(out)
	for _, name := range schedule.Names() {
		text, ok := grids[name]
		if !ok {
			t.Errorf("%s: no grid printed\n%s", name, out)
			continue
		}
		v := 1
		if name == "interleaved" || name == "interleaved-zb" || name == "zb-v" || name == "dualpipev" {
			v = 2
		}
		want, err := schedule.Build(name, 2, 4, v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), name+".txt")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		fromFile, err := schedule.ReadFile(path)
		if err != nil {
			t.Errorf("%s: ReadFile of the printed grid: %v\n%s", name, err, text)
			continue
		}
		loaded, err := schedule.Load(strings.NewReader(text), "grid")
		if err != nil {
			t.Fatalf("%s: Load: %v", name, err)
		}
		for _, got := range []*schedule.Schedule{fromFile, loaded} {
			got.Name = want.Name // a grid carries no name
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: printed grid reads back as\n%s\nwant\n%s", name, got.Grid(), want.Grid())
			}
		}
	}
}

// TestSimulateScheduleFileFromPrintedGrid: a printed grid saved to a file is
// accepted by --schedule-file and simulated to the same makespan.
func TestSimulateScheduleFileFromPrintedGrid(t *testing.T) {
	cfg := writeSimConfig(t, simMLP)
	out, err := runCommand(t, simulateCmd(), "--config", cfg, "--costs", "f=1,b=2,w=1", "--transfer", "0", "--schedule", "zb-h1")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	path := filepath.Join(t.TempDir(), "zb.txt")
	if err := os.WriteFile(path, []byte(printedGrids(out)["zb-h1"]), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := runCommand(t, simulateCmd(), "--config", cfg, "--costs", "f=1,b=2,w=1", "--transfer", "0", "--schedule-file", path)
	if err != nil {
		t.Fatalf("simulate --schedule-file: %v\n%s", err, again)
	}
	// Uniform costs F = I = W = 1: ZB-H1's makespan is 3m+p-1 = 13.
	if !strings.Contains(out, "zb-h1: makespan 13.00 ms") || !strings.Contains(again, "schedule from file: makespan 13.00 ms") {
		t.Errorf("makespans differ or are not 13 ms:\n%s\n---\n%s", out, again)
	}
}

// writeRun writes a run directory whose events time F at 1 ms and, for a 1f1b
// run, B at 2 ms; for a zb-h1 run, I at 0.5 ms and W at 3 ms.
func writeRun(t *testing.T, sched string, stages, microBatches int) string {
	t.Helper()
	info := profile.RunInfo{Schedule: sched, Stages: stages, MicroBatches: microBatches, Steps: 2}
	kinds := map[string]float64{profile.Forward: 1, profile.Backward: 2}
	order := []string{profile.Forward, profile.Backward}
	if sched == "zb-h1" {
		kinds = map[string]float64{profile.Forward: 1, profile.Input: 0.5, profile.Weight: 3}
		order = []string{profile.Forward, profile.Input, profile.Weight}
	}
	return writeRunDir(t, info, order, func(s, chunk int, kind string) float64 { return kinds[kind] })
}

// writeRunDir writes a run directory of info with every stage's events back
// to back: for each step, micro-batch and chunk, one of each kind in order,
// taking cost(stage, chunk, kind) ms.
func writeRunDir(t *testing.T, info profile.RunInfo, kinds []string, cost func(s, chunk int, kind string) float64) string {
	t.Helper()
	dir := t.TempDir()
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	for s := range info.Stages {
		var buf bytes.Buffer
		now := int64(1e12)
		for step := range info.Steps {
			for mb := range info.MicroBatches {
				for chunk := range max(info.Chunks, 1) {
					for _, k := range kinds {
						e := profile.Event{Stage: s, Step: step, Kind: k, MB: mb, Chunk: chunk, StartNS: now, EndNS: now + int64(cost(s, chunk, k)*1e6)}
						now = e.EndNS
						line, err := json.Marshal(e)
						if err != nil {
							t.Fatal(err)
						}
						buf.Write(append(line, '\n'))
					}
				}
			}
		}
		if err := os.WriteFile(profile.EventsFile(dir, s), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSimulateMarksUnmeasuredCosts: every cost simulate did not measure (or
// was not given) carries a * on its stage line and a legend saying what was
// assumed; measured ones carry none.
func TestSimulateMarksUnmeasuredCosts(t *testing.T) {
	cfg := writeSimConfig(t, simMLP)
	oneF := writeRun(t, "1f1b", 2, 4)
	zb := writeRun(t, "zb-h1", 2, 4)
	cases := []struct {
		name      string
		args      []string
		stageLine string   // stage 0's cost line
		want      []string // legend lines, in full
		not       []string
	}{
		{
			name:      "1f1b run: I and W assumed",
			args:      []string{"--costs", oneF, "--transfer", "100us"},
			stageLine: "  stage 0  F 1.000 ms  B 2.000 ms  (I 1.000* + W 1.000* ms)",
			want:      []string{"  * I, W: not measured, assumed B/2 each: the 1f1b run split no backward, so it timed no I or W"},
			not:       []string{"* B:", "* transfer:"},
		},
		{
			name:      "zb-h1 run: B derived",
			args:      []string{"--costs", zb, "--transfer", "100us"},
			stageLine: "  stage 0  F 1.000 ms  B 3.500 ms*  (I 0.500 + W 3.000 ms)",
			want:      []string{"  * B: not measured, taken as I + W: the zb-h1 run split every backward, so it timed no whole one"},
			not:       []string{"* I, W:", "* transfer:"},
		},
		{
			name:      "uniform without w",
			args:      []string{"--costs", "f=1,b=2"},
			stageLine: "  stage 0  F 1.000 ms  B 2.000 ms  (I 1.000* + W 1.000* ms)",
			want: []string{"  * I, W: not measured, assumed B/2 each: --costs gave no w=W",
				"  * transfer: not measured, estimated from the largest activation's size at 2 GB/s plus 100 us (--transfer sets it)"},
		},
		{
			name:      "uniform with w",
			args:      []string{"--costs", "f=1,b=2,w=0.5", "--transfer", "0"},
			stageLine: "  stage 0  F 1.000 ms  B 2.000 ms  (I 1.500 + W 0.500 ms)",
			not:       []string{"*"},
		},
	}
	for _, tc := range cases {
		out, err := runCommand(t, simulateCmd(), append([]string{"--config", cfg, "--schedule", "1f1b,zb-h1"}, tc.args...)...)
		if err != nil {
			t.Errorf("%s: %v\n%s", tc.name, err, out)
			continue
		}
		head, _, _ := strings.Cut(out, "\n\n") // the cost lines, before the first schedule
		lines := strings.Split(head, "\n")
		if len(lines) < 2 || lines[1] != tc.stageLine {
			t.Errorf("%s: stage 0 line\n%q\nwant\n%q\n%s", tc.name, lines[min(1, len(lines)-1)], tc.stageLine, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(head+"\n", w+"\n") {
				t.Errorf("%s: missing legend %q in\n%s", tc.name, w, head)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(head, n) {
				t.Errorf("%s: unexpected %q in\n%s", tc.name, n, head)
			}
		}
	}

	// Measured here: F, B, I and W unmarked; the transfer estimated, and marked.
	out, err := runCommand(t, simulateCmd(), "--config", cfg, "--schedule", "1f1b", "--reps", "1")
	if err != nil {
		t.Fatalf("measure: %v\n%s", err, out)
	}
	head, _, _ := strings.Cut(out, "\n\n")
	stageLine := regexp.MustCompile(`^  stage \d  F \d+\.\d{3} ms  B \d+\.\d{3} ms  \(I \d+\.\d{3} \+ W \d+\.\d{3} ms\)$`)
	for _, l := range strings.Split(head, "\n")[1:3] {
		if !stageLine.MatchString(l) {
			t.Errorf("measured stage line %q has a mark or lacks I and W", l)
		}
	}
	if !strings.Contains(head, "; transfer ") || !strings.Contains(head, " ms*\n") || !strings.Contains(head, "  * transfer: not measured") {
		t.Errorf("estimated transfer not marked:\n%s", head)
	}
}

// TestSimulateRefusesWhatLaunchRefuses: zb-h1 on a model whose layers cannot
// split its backward is an error when named, and listed as not applicable
// under --schedule all; the other schedules are simulated. The GPT's layers
// split: zb-h1 is simulated for it.
func TestSimulateRefusesWhatLaunchRefuses(t *testing.T) {
	cfg := writeSimConfig(t, simCNN)
	out, err := runCommand(t, simulateCmd(), "--config", cfg, "--costs", "f=1,b=2", "--schedule", "1f1b,zb-h1")
	if err == nil || !strings.Contains(err.Error(), "--schedule zb-h1: not applicable") ||
		!strings.Contains(err.Error(), "zb-h1 splits the backward into input and weight gradients; layer conv0 of model cnn cannot") {
		t.Errorf("zb-h1 named for cnn: got %v\n%s", err, out)
	}
	if strings.Contains(out, "makespan") {
		t.Errorf("simulated before refusing:\n%s", out)
	}
	out, err = runCommand(t, simulateCmd(), "--config", cfg, "--costs", "f=1,b=2")
	if err != nil {
		t.Fatalf("--schedule all for cnn: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\nzb-h1: not applicable here: zb-h1 splits the backward") || strings.Contains(out, "zb-h1: makespan") || !strings.Contains(out, "1f1b: makespan") {
		t.Errorf("--schedule all for cnn:\n%s", out)
	}
	if strings.Contains(out, "(I ") || strings.Contains(out, "* I, W") {
		t.Errorf("I and W shown for a model that cannot split:\n%s", out)
	}

	// A hand-written split schedule is refused the same way.
	grid := filepath.Join(t.TempDir(), "zb.txt")
	zb, err := schedule.Build("zb-h1", 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(grid, []byte(zb.Grid()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCommand(t, simulateCmd(), "--config", cfg, "--costs", "f=1,b=2", "--schedule-file", grid); err == nil || !strings.Contains(err.Error(), "layer conv0 of model cnn cannot") {
		t.Errorf("split schedule file for cnn: got %v", err)
	}

	gpt := writeSimConfig(t, simGPT)
	out, err = runCommand(t, simulateCmd(), "--config", gpt, "--costs", "f=1,b=2", "--schedule", "1f1b,zb-h1")
	if err != nil || !strings.Contains(out, "zb-h1: makespan") {
		t.Errorf("zb-h1 named for gpt: got %v\n%s", err, out)
	}
	if _, err := runCommand(t, simulateCmd(), "--config", gpt, "--costs", "f=1,b=2", "--schedule-file", grid); err != nil {
		t.Errorf("split schedule file for gpt: %v", err)
	}
}

// TestSimulateBadRequests: a request simulate cannot honour is an error that
// says what was expected.
func TestSimulateBadRequests(t *testing.T) {
	cfg := writeSimConfig(t, simMLP)
	noRun := t.TempDir()
	file := filepath.Join(noRun, "notes.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := `want "measure", a run directory (pipetrain launch --run-dir) or f=F,b=B[,w=W] in ms`
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--schedule", "bogus"}, []string{`--schedule: unknown schedule "bogus" (known: gpipe, 1f1b, interleaved, zb-h1, zb-v, interleaved-zb, dualpipev; or all)`}},
		{[]string{"--schedule", "1f1b,"}, []string{`unknown schedule ""`}},
		{[]string{"--costs", "foo"}, []string{"--costs foo: no such file or directory", want}},
		{[]string{"--costs", noRun}, []string{"--costs " + noRun + ": not a run directory (it has no run.json)", want}},
		{[]string{"--costs", file}, []string{"--costs " + file + ": not a directory", want}},
		{[]string{"--costs", writeRun(t, "1f1b", 3, 4)}, []string{"the run had 3 stages"}},
		{[]string{"--costs", "f=1"}, []string{`--costs "f=1"`}},
		{[]string{"--schedule", "1f1b", "--schedule-file", file}, []string{"give --schedule or --schedule-file, not both"}},
		{[]string{"--transfer", "-1ms"}, []string{"--transfer -1ms: must be 0 or more"}},
	}
	for _, tc := range cases {
		out, err := runCommand(t, simulateCmd(), append([]string{"--config", cfg, "--transfer", "0"}, tc.args...)...)
		if err == nil {
			t.Errorf("%v: no error\n%s", tc.args, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", tc.args, err, w)
			}
		}
	}
}

// TestZBVerdict: when zb-h1 simulates slower than 1f1b, simulate says so and
// names the stages whose measured I + W exceeds B; when faster, it says by how
// much, and says when I and W were only assumed.
func TestZBVerdict(t *testing.T) {
	build := func(name string) *schedule.Schedule {
		s, err := schedule.Build(name, 4, 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	costs := func(i0, w0 float64) predict.Costs {
		c := predict.Costs{Costs: schedule.Costs{
			F: []float64{0.9, 0.35, 0.22, 0.09}, B: []float64{1, 0.46, 0.3, 0.11},
			I: []float64{i0, 0.25, 0.15, 0.06}, W: []float64{w0, 0.21, 0.15, 0.05},
			Transfer: 0.13,
		}, IWStages: make([]bool, 4), BStages: make([]bool, 4)}
		return c
	}
	verdict := func(c predict.Costs) string {
		zb, err := schedule.Simulate(build("zb-h1"), c.Costs)
		if err != nil {
			t.Fatal(err)
		}
		oneF, err := schedule.Simulate(build("1f1b"), c.Costs)
		if err != nil {
			t.Fatal(err)
		}
		return zbVerdict(zb, oneF, c)
	}
	// Stage 0 as measured on the README's demo: I + W = 1.9x B.
	if v := verdict(costs(0.2, 1.7)); !strings.HasPrefix(v, "zb-h1 does not help here: ") || !strings.Contains(v, "I + W is 1.90x B on stage 0)") {
		t.Errorf("I + W = 1.9 B: %s", v)
	}
	if v := verdict(costs(0.2, 0.7)); !strings.HasPrefix(v, "zb-h1 shortens the step here: ") || strings.Contains(v, "assumed") {
		t.Errorf("I + W = 0.9 B: %s", v)
	}
	assumed := costs(0.5, 0.5)
	assumed.IWStages = []bool{true, true, true, true}
	if v := verdict(assumed); !strings.HasPrefix(v, "zb-h1 would shorten the step here") || !strings.Contains(v, "assumed, not measured") {
		t.Errorf("I and W assumed: %s", v)
	}
}

// TestSimulateTransferFlag: --help states the one default --transfer has, and
// a --transfer given, 0 included, is used as given.
func TestSimulateTransferFlag(t *testing.T) {
	text, err := runCommand(t, simulateCmd(), "--help")
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "--transfer ") {
			line = l
		}
	}
	if strings.Count(line, "default") != 1 || !strings.Contains(line, "(default: a run's measured mean link delay") {
		t.Errorf("--transfer help line %q, want one default", line)
	}
	out, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simMLP), "--costs", "f=1,b=2,w=1", "--schedule", "1f1b", "--transfer", "0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "; transfer 0.000 ms (given by --transfer)\n") || strings.Contains(out, "*") {
		t.Errorf("--transfer 0 not used as given:\n%s", out)
	}
}

// TestSimulateLowered: --lowered prints, for every schedule, the lowered ops
// after its grid; they parse back, pass the lowered Check, and hold the
// printed compute grid.
func TestSimulateLowered(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simMLP), "--costs", "f=1,b=2", "--lowered")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	grids := printedGrids(out)
	lines := strings.Split(out, "\n")
	found := 0
	for i, line := range lines {
		name, ok := strings.CutSuffix(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "# ")), " lowered: each action with its receive (<from) and send (>to), each chunk's gradient reduction (R), each tied weight's exchange (T)")
		if !ok || !strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		name, _, _ = strings.Cut(name, " (")
		var block []string
		for _, l := range lines[i+1:] {
			if !strings.HasPrefix(strings.TrimSpace(l), "stage ") && !isPlacementLine(l) {
				break
			}
			block = append(block, l)
		}
		l, err := schedule.ParseLoweredGrid(strings.Join(block, "\n"))
		if err == nil {
			err = l.Check()
		}
		if err != nil {
			t.Fatalf("%s: the lowered grid does not check: %v\n%s", name, err, strings.Join(block, "\n"))
		}
		compute, err := schedule.ParseGrid(grids[name])
		if err != nil || !reflect.DeepEqual(compute.Actions, l.Compute().Actions) {
			t.Errorf("%s: the lowered ops do not hold the printed grid (%v)", name, err)
		}
		found++
	}
	if found != len(schedule.Names()) {
		t.Errorf("%d lowered grids printed, want one per schedule (%d):\n%s", found, len(schedule.Names()), out)
	}
}

// mlp2x2 is the shipped two-stage config with two replicas per stage.
const mlp2x2 = "../../configs/fmnist-mlp-2x2.yaml"

// ringTime is the ring all-reduce's cost, restated: 2(R-1)/R of the bytes
// at bw bytes per second, and 2(R-1) messages per bucket, in ms.
func ringTime(bytes int64, r int, bw, latencyMS float64, bucket int64) float64 {
	buckets := (bytes + bucket - 1) / bucket
	return 2*float64(r-1)/float64(r)*float64(bytes)/bw*1000 + 2*float64(r-1)*float64(buckets)*latencyMS
}

// TestSimulateReplicas: on the 2×2 config with uniform costs (F = 1, B = 2,
// no transfer) 1F1B's compute ends at (m+p-1)·3 = 15 ms on stage 0 and 13 ms
// on stage 1. Stage 0 holds fc0 and fc1 (533,248 float32 parameters), stage
// 1 fc2 and fc3 (34,186): stage 0's all-reduce starts at 15 and is exposed
// whole, stage 1's hides in the 2 ms before the step ends.
func TestSimulateReplicas(t *testing.T) {
	g0, g1 := int64(533248*4), int64(34186*4)
	for _, tc := range []struct {
		name  string
		args  []string
		bw    float64 // bytes per second
		lat   float64 // ms
		r     int
		marks bool
	}{
		{"defaults, marked", nil, 2e9, 0.1, 2, true},
		{"given", []string{"--allreduce-bandwidth", "1GB/s", "--allreduce-latency", "20us"}, 1e9, 0.02, 2, false},
		{"four replicas", []string{"--replicas", "4", "--allreduce-bandwidth", "500MB/s", "--allreduce-latency", "0"}, 5e8, 0, 4, false},
	} {
		args := append([]string{"--config", mlp2x2, "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b"}, tc.args...)
		out, err := runCommand(t, simulateCmd(), args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tc.name, err, out)
		}
		ar0, ar1 := ringTime(g0, tc.r, tc.bw, tc.lat, 1<<20), ringTime(g1, tc.r, tc.bw, tc.lat, 1<<20)
		mark := ""
		if tc.marks {
			mark = "*"
		}
		step := 15 + ar0
		want := []string{
			fmt.Sprintf("  stage 0  gradients 2.03 MiB  all-reduce %.3f ms%s\n", ar0, mark),
			fmt.Sprintf("  stage 1  gradients 133.5 KiB  all-reduce %.3f ms%s\n", ar1, mark),
			fmt.Sprintf("\n1f1b: makespan %.2f ms,", step),
			fmt.Sprintf("\n  2 stages × %d replicas: step %.2f ms, %.0f samples/s (batch 256), all-reduce exposed %.2f ms\n", tc.r, step, 256000/step, ar0),
			"\n  all-reduce    ",
		}
		if tc.r == 2 {
			want = append(want, "  2 replicas of each stage (data_parallel 2): 4 processes, 128 samples per replica a step; ring all-reduce at ")
		} else {
			want = append(want, "  4 replicas of each stage (--replicas 4; the config has 2): 8 processes, 64 samples per replica a step; ring all-reduce at 500 MB/s plus 0.000 ms a message, buckets of 1.00 MiB\n")
		}
		if tc.marks {
			want = append(want, "  * all-reduce: not measured, the ring taken at 2 GB/s and 100 us a message, as the transfer estimate takes gRPC on loopback (--allreduce-bandwidth and --allreduce-latency set them)\n")
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: missing %q in\n%s", tc.name, w, out)
			}
		}
		for st, w := range []string{fmt.Sprintf(" MiB  all-reduce %.2f ms, %.2f exposed", ar0, ar0), fmt.Sprintf(" MiB  all-reduce %.2f ms, 0.00 exposed", ar1)} {
			line := regexp.MustCompile(fmt.Sprintf(`(?m)^  stage %d  busy .*$`, st)).FindString(out)
			if !strings.HasSuffix(line, w) {
				t.Errorf("%s: stage %d line %q, want it to end %q", tc.name, st, line, w)
			}
		}
		if !tc.marks && strings.Contains(out, "* all-reduce") {
			t.Errorf("%s: all-reduce marked though given:\n%s", tc.name, out)
		}
	}
}

// TestSimulateMeasuresTheRing: --allreduce-bandwidth measure times a real
// ring of the config's replicas here and charges each stage's all-reduce
// from the fitted figures, unmarked; a given --allreduce-latency is kept.
func TestSimulateMeasuresTheRing(t *testing.T) {
	g0 := int64(533248 * 4)
	for _, lat := range []string{"", "40us"} {
		args := []string{"--config", mlp2x2, "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b", "--allreduce-bandwidth", "measure"}
		if lat != "" {
			args = append(args, "--allreduce-latency", lat)
		}
		out, err := runCommand(t, simulateCmd(), args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		m := regexp.MustCompile(`ring all-reduce at ([0-9.]+) (MB|GB)/s plus ([0-9.]+) ms a message`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no ring figures in\n%s", out)
		}
		bw, _ := strconv.ParseFloat(m[1], 64)
		bw *= map[string]float64{"MB": 1e6, "GB": 1e9}[m[2]]
		latMS, _ := strconv.ParseFloat(m[3], 64)
		if bw < 1e7 || bw > 1e12 || latMS < 0 || latMS > 100 {
			t.Fatalf("implausible measured ring: %g B/s, %g ms a message\n%s", bw, latMS, out)
		}
		if lat != "" && latMS != 0.04 {
			t.Errorf("--allreduce-latency 40us was replaced by the measured %g ms", latMS)
		}
		ar0 := regexp.MustCompile(`stage 0  gradients 2.03 MiB  all-reduce ([0-9.]+) ms\n`).FindStringSubmatch(out)
		if ar0 == nil {
			t.Fatalf("stage 0's all-reduce is missing or marked as assumed:\n%s", out)
		}
		// The printed figures are rounded; the charge must agree with them to that.
		got, _ := strconv.ParseFloat(ar0[1], 64)
		if want := ringTime(g0, 2, bw, latMS, 1<<20); math.Abs(got-want) > 0.01*want+0.01 {
			t.Errorf("stage 0 charged %.3f ms, the measured figures give %.3f", got, want)
		}
		for _, w := range []string{"  all-reduce figures measured here: 2 ranks in one process over ring streams on loopback"} {
			if !strings.Contains(out, w) {
				t.Errorf("missing %q in\n%s", w, out)
			}
		}
		if strings.Contains(out, "* all-reduce") {
			t.Errorf("measured figures marked as assumed:\n%s", out)
		}
	}
}

// TestSimulateOneReplica: --replicas 1 runs the whole batch through one
// pipeline, charging no all-reduce; a config without replicas prints none
// of it, as before.
func TestSimulateOneReplica(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", mlp2x2, "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b", "--replicas", "1")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{
		"  1 replica of each stage (--replicas 1; the config has 2): 2 processes, 256 samples per replica a step, nothing to all-reduce\n",
		"\n1f1b: makespan 15.00 ms,",
		"\n  2 stages × 1 replica: step 15.00 ms, 17067 samples/s (batch 256)\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	if strings.Contains(out, "all-reduce ") || strings.Contains(out, "exposed") {
		t.Errorf("an all-reduce with one replica:\n%s", out)
	}
	out, err = runCommand(t, simulateCmd(), "--config", writeSimConfig(t, simMLP), "--costs", "f=1,b=2")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, "replica") || strings.Contains(out, "all-reduce") || strings.Contains(out, "samples/s") {
		t.Errorf("replicas mentioned for a config without any:\n%s", out)
	}
}

// TestSimulateReplicasEverySchedule: every schedule is charged its
// all-reduces, interleaved's what-if chunks included, and zb-h1's verdict
// compares steps that both pay them.
func TestSimulateReplicasEverySchedule(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", mlp2x2, "--costs", "f=1,b=2", "--lowered")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, name := range schedule.Names() {
		if !regexp.MustCompile(`\n` + name + `( \(2 chunks per stage\))?: makespan [\d.]+ ms.*\n  2 stages × 2 replicas: step [\d.]+ ms, \d+ samples/s \(batch 256\), all-reduce exposed [\d.]+ ms\n`).MatchString(out) {
			t.Errorf("%s: no step of the 2 × 2 grid in\n%s", name, out)
		}
	}
	if !strings.Contains(out, "zb-h1 ") || !strings.Contains(out, " 0Rc1 ") {
		t.Errorf("no verdict or interleaved reduction:\n%s", out)
	}
}

func TestSimulateReplicasErrors(t *testing.T) {
	run := writeRun(t, "1f1b", 2, 4)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "3"}, "--replicas 3: data.batch_size 256 is not a multiple of 3 replicas × 4 micro-batches"},
		{[]string{"--replicas", "0"}, "--replicas 0: need at least 1"},
		{[]string{"--allreduce-bandwidth", "fast"}, `--allreduce-bandwidth: "fast" is not a rate like 1.2GB/s or 500MiB/s`},
		{[]string{"--allreduce-latency", "-1ms"}, "--allreduce-latency -1ms: must be 0 or more"},
		{[]string{"--replicas", "4", "--costs", run}, "--replicas 4: the run in " + run + " timed micro-batches of 32 samples, 4 replicas run micro-batches of 16"},
	} {
		args := append([]string{"--config", mlp2x2, "--costs", "f=1,b=2"}, tc.args...)
		out, err := runCommand(t, simulateCmd(), args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q\n%s", tc.args, err, tc.want, out)
		}
	}
}

// TestSimulatePredictsActivationMemory: every schedule's stage lines carry
// the activation memory engine.PredictMemory gives for it, which the
// runtime's measurement is held to (stages.TestMeasuredMemoryIsPredicted).
func TestSimulatePredictsActivationMemory(t *testing.T) {
	// Large enough that the figures differ in the digits printed.
	path := writeSimConfig(t, strings.Replace(strings.Replace(simMLP, "input: 8, hidden: [6, 5]", "input: 784, hidden: [512, 256]", 1), "batch_size: 8", "batch_size: 1024", 1))
	out, err := runCommand(t, simulateCmd(), "--config", path, "--costs", "f=1,b=2,w=1", "--schedule", "1f1b,zb-h1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	model, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"1f1b", "zb-h1"} {
		s, err := schedule.Build(name, len(cfg.Stages), cfg.Data.MicroBatches, 1)
		if err != nil {
			t.Fatal(err)
		}
		peak, _, err := engine.PredictMemory(stages.EnginePipeline(cfg), model, s)
		if err != nil {
			t.Fatal(err)
		}
		section := out[strings.Index(out, "\n"+name+": makespan"):]
		for st, b := range peak {
			if b < 1<<20 {
				t.Fatalf("%s stage %d: %d bytes predicted, too few to tell apart in MiB", name, st, b)
			}
			want := fmt.Sprintf("  stage %d  busy", st)
			line := section[strings.Index(section, want):]
			line = line[:strings.Index(line, "\n")]
			if !strings.Contains(line, fmt.Sprintf("activations %.2f MiB", float64(b)/(1<<20))) {
				t.Errorf("%s stage %d: %q lacks the predicted %d bytes", name, st, line, b)
			}
		}
	}
}

// TestSimulateInterleavedZB: simulate predicts interleaved-zb on its shipped
// config at its closed form (3 idle half-units of 51 with F = I = W), against
// interleaved's 9 idle half-units of 57 on the same config and costs, each stage
// holding interleaved's first stage's peak of micro-batch chunks.
func TestSimulateInterleavedZB(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-interleaved-zb.yaml", "--schedule", "interleaved-zb,interleaved", "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	for _, want := range []string{
		"\ninterleaved-zb (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%, equal-stage theory 5.9%\n",
		"\ninterleaved (2 chunks per stage): makespan 28.50 ms, mean bubble 15.8%, equal-stage theory 15.8%\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q:\n%s", strings.TrimSpace(want), out)
		}
	}
	zb := out[strings.Index(out, "\ninterleaved-zb"):strings.Index(out, "\ninterleaved (")]
	if n := strings.Count(zb, "peak stash 11 micro-batches"); n != 4 {
		t.Errorf("%d of 4 stages at a peak of 11 micro-batch chunks:\n%s", n, zb)
	}
}

// TestSimulateSharesCores: stages pinned to overlapping CPUs share them,
// the unpinned ones the machine's other cores; measured costs are simulated
// with the stages sharing those cores while they compute at once (with no
// transfer the one core never idles, so three stages on it take exactly
// their total work), given costs and a run's costs (which ran shared) are
// not shared again.
func TestSimulateSharesCores(t *testing.T) {
	three := strings.Replace(simMLP, `address: 127.0.0.1:7002}`, `address: 127.0.0.1:7002, cpus: "0"}
  - {layers: "2", address: 127.0.0.1:7003, cpus: "0"}`, 1)
	three = strings.Replace(three, `layers: "1-2", address`, `layers: "1", address`, 1)
	three = strings.Replace(three, `address: 127.0.0.1:7001}`, `address: 127.0.0.1:7001, cpus: "0"}`, 1)
	cfg, err := configs.Load(writeSimConfig(t, three))
	if err != nil {
		t.Fatal(err)
	}
	shared := predict.StageCores(cfg) // its groups are tested in predict
	c := predict.Costs{Costs: schedule.Costs{F: []float64{1, 2, 3}, B: []float64{2, 4, 6}, I: []float64{1, 2, 3}, W: []float64{1, 2, 3}, Cores: shared.Groups}}
	s, err := schedule.Build("1f1b", 3, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := simulateOne(io.Discard, s, c.ForSchedule(s), func(*schedule.Schedule) []int64 { return nil }, "", false, nil, &replication{})
	if err != nil {
		t.Fatal(err)
	}
	if work := 4 * (1 + 2 + 3 + 2 + 4 + 6.0); tl.Makespan != work {
		t.Errorf("3 stages on one core: step %v, want their work, %v", tl.Makespan, work)
	}

	out, err := runCommand(t, simulateCmd(), "--config", writeSimConfig(t, three), "--schedule", "1f1b", "--reps", "1")
	if err != nil || !strings.Contains(out, "\n  cores: "+shared.Note+"; the costs above are timed alone") {
		t.Errorf("measured costs: %v\n%s", err, out)
	}
	out, err = runCommand(t, simulateCmd(), "--config", writeSimConfig(t, three), "--schedule", "1f1b", "--costs", "f=1,b=2", "--transfer", "0")
	if err != nil || strings.Contains(out, "cores:") || !strings.Contains(out, "1f1b: makespan 18.00 ms") {
		t.Errorf("given costs were shared: %v\n%s", err, out)
	}
}

// TestSimulateReduceToOne: with all_reduce.algorithm reduce-to-one the
// simulator names the algorithm and charges its model: on 4 replicas,
// stage 0's 2,132,992 gradient bytes in 3 buckets (1 MiB, 1 MiB, the rest)
// take 3+6-1 steps of a message's latency, and the busiest rank sends
// every byte twice plus 5 more whole buckets while the last one drains.
func TestSimulateReduceToOne(t *testing.T) {
	t.Setenv("PIPETRAIN_ALL_REDUCE_ALGORITHM", "reduce-to-one")
	out, err := runCommand(t, simulateCmd(), "--config", mlp2x2, "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b",
		"--replicas", "4", "--allreduce-bandwidth", "500MB/s", "--allreduce-latency", "20us")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	g0 := 533248.0 * 4
	want := 8*0.02 + (2*g0+5*(1<<20))/5e8*1000
	for _, w := range []string{
		"64 samples per replica a step; reduce-to-one all-reduce at 500 MB/s plus 0.020 ms a message, buckets of 1.00 MiB\n",
		fmt.Sprintf("  stage 0  gradients 2.03 MiB  all-reduce %.3f ms\n", want),
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	if ring := ringTime(int64(g0), 4, 5e8, 0.02, 1<<20); ring >= want {
		t.Errorf("reduce-to-one charged %.3f ms, no more than the ring's %.3f ms", want, ring)
	}
}

// TestSimulateHierarchical: with all_reduce.algorithm hierarchical the
// simulator charges the hosts' layout (--replicas-per-host, or the hosts
// of the addresses) at the links within and across hosts, and says when it
// knows only one link figure and uses it for both.
func TestSimulateHierarchical(t *testing.T) {
	t.Setenv("PIPETRAIN_ALL_REDUCE_ALGORITHM", "hierarchical")
	args := []string{"--config", mlp2x2, "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b",
		"--replicas", "4", "--replicas-per-host", "2", "--allreduce-bandwidth", "500MB/s", "--allreduce-latency", "20us"}
	out, err := runCommand(t, simulateCmd(), append(args, "--within-host-bandwidth", "5GB/s", "--within-host-latency", "5us")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	hier := schedule.RingAllReduce{Replicas: 4, Bandwidth: 5e5, Latency: 0.02, BucketBytes: 1 << 20, Hosts: []int{2, 2},
		Within: schedule.LinkFigures{Bandwidth: 5e6, Latency: 0.005}}
	g0 := int64(533248 * 4)
	for _, w := range []string{
		"64 samples per replica a step; hierarchical all-reduce, hosts of 2, 2 replicas (--replicas-per-host 2): across hosts at 500 MB/s plus 0.020 ms a message, within hosts at 5 GB/s plus 0.005 ms a message; buckets of 1.00 MiB\n",
		fmt.Sprintf("  stage 0  gradients 2.03 MiB  all-reduce %.3f ms\n", hier.Time(g0)),
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	// Its host links carry the ring's bytes, and the hops within hosts come
	// on top: it wins only where a message across hosts costs more.
	if ring := ringTime(g0, 4, 5e8, 0.02, 1<<20); hier.Time(g0) <= ring {
		t.Errorf("hierarchical at 20 us a message across hosts %.3f ms, below the ring's %.3f ms", hier.Time(g0), ring)
	}
	slow := hier
	slow.Latency = 2
	if ring := ringTime(g0, 4, 5e8, 2, 1<<20); slow.Time(g0) >= ring {
		t.Errorf("hierarchical at 2 ms a message across hosts %.3f ms, not below the ring's %.3f ms", slow.Time(g0), ring)
	}
	out, err = runCommand(t, simulateCmd(), args...)
	hier.Within = schedule.LinkFigures{Bandwidth: 5e5, Latency: 0.02}
	for _, w := range []string{
		"across hosts at 500 MB/s plus 0.020 ms a message, within hosts the same: only one link figure is known (--within-host-bandwidth and --within-host-latency set them)",
		fmt.Sprintf("  stage 0  gradients 2.03 MiB  all-reduce %.3f ms\n", hier.Time(g0)),
	} {
		if err != nil || !strings.Contains(out, w) {
			t.Errorf("one link figure: missing %q in\n%s (%v)", w, out, err)
		}
	}
	// The config's two addresses lay out two replicas, not four.
	_, err = runCommand(t, simulateCmd(), args[:len(args)-6]...)
	if want := "stages[0].addresses: 2 addresses lay out 2 replicas on hosts, not 4: give the replicas per host (--replicas-per-host)"; err == nil || err.Error() != want {
		t.Errorf("4 replicas on 2 addresses: %v, want %q", err, want)
	}
}

// TestSimulateParameterServers: with parameter servers each stage is
// charged its push and pull when its step ends, each server's link
// carrying every worker's share of the bytes it holds.
func TestSimulateParameterServers(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-ps.yaml", "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b",
		"--allreduce-bandwidth", "500MB/s", "--allreduce-latency", "20us")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Server 0 holds fc0's weight (784x512 floats), the largest tensor;
	// server 1 the rest, fc0's bias and fc1 (512x256 + 256) of stage 0.
	// 3 workers push and pull each.
	fc0, fc1 := int64(784*512)*4, int64(512+512*256+256)*4
	ps := schedule.ParameterServers{Workers: 3, Link: schedule.LinkFigures{Bandwidth: 5e5, Latency: 0.02}}
	for _, w := range []string{
		"2 parameter servers (sync): each worker stage pushes its gradients to the servers holding them and pulls its weights back when its step ends, at 500 MB/s plus 0.020 ms a message",
		fmt.Sprintf("  stage 0  gradients %s  push and pull %.3f ms  (servers hold 0: %s, 1: %s)\n", human(fc0+fc1), ps.Time([]int64{fc0, fc1}), human(fc0), human(fc1)),
		// 1F1B's compute ends at (m+p-1)·3 = 9 on stage 0; its exchange after.
		fmt.Sprintf("1f1b: makespan %.2f ms", 9+ps.Time([]int64{fc0, fc1})),
		fmt.Sprintf("push and pull exposed %.2f ms\n", ps.Time([]int64{fc0, fc1})),
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
	// Async is charged as sync, and says so.
	t.Setenv("PIPETRAIN_PARAMETER_SERVERS_MODE", "async")
	async, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-ps.yaml", "--costs", "f=1,b=2", "--transfer", "0", "--schedule", "1f1b",
		"--allreduce-bandwidth", "500MB/s", "--allreduce-latency", "20us")
	for _, w := range []string{
		"2 parameter servers (async): ",
		"; async is charged as sync: identical workers push as much each step, and none is slower to wait for\n",
		fmt.Sprintf("1f1b: makespan %.2f ms", 9+ps.Time([]int64{fc0, fc1})),
	} {
		if err != nil || !strings.Contains(async, w) {
			t.Errorf("async: missing %q in\n%s (%v)", w, async, err)
		}
	}
}

// TestSimulateLayerOverlap: under all_reduce.overlap layer and zb-h1 stage
// 0's last bucket of 1 MiB buckets, bytes [2 MiB, 2,132,992), lies in fc1,
// which the last weight pass finishes a quarter of the way through (fc1's
// 525,312 bytes of the stage's 2,132,992): its ring runs while the pass
// computes fc0's, so stage 0, which ends the step, exposes that bucket's
// time less than per chunk.
func TestSimulateLayerOverlap(t *testing.T) {
	args := []string{"--config", mlp2x2, "--costs", "f=1,b=2,w=1", "--transfer", "0", "--schedule", "zb-h1",
		"--allreduce-bandwidth", "1GB/s", "--allreduce-latency", "50us"}
	g0 := int64(533248 * 4)
	whole := ringTime(g0, 2, 1e9, 0.05, 1<<20)
	last := ringTime(g0-2<<20, 2, 1e9, 0.05, 1<<20)
	for _, tt := range []struct {
		overlap, note string
		exposed       float64
	}{
		{"chunk", "buckets of 1.00 MiB\n", whole},
		{"layer", "buckets of 1.00 MiB; all_reduce.overlap layer: under a schedule that splits the backward, each bucket starts once the chunk's last weight pass has finished its layers\n", whole - last},
	} {
		t.Setenv("PIPETRAIN_ALL_REDUCE_OVERLAP", tt.overlap)
		out, err := runCommand(t, simulateCmd(), args...)
		for _, w := range []string{tt.note, fmt.Sprintf("all-reduce %.2f ms, %.2f exposed\n", whole, tt.exposed)} {
			if err != nil || !strings.Contains(out, w) {
				t.Errorf("overlap %s: missing %q in\n%s (%v)", tt.overlap, w, out, err)
			}
		}
	}
}
