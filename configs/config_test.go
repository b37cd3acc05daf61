package configs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

const good = `
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 12, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: gpipe
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-2", address: 127.0.0.1:7002}
`

// edit is one change to a base config and what Load must say of it.
type edit struct{ from, to, want string }

// refusesEdits loads base with each edit made (the first match replaced)
// and requires an error containing the edit's want.
func refusesEdits(t *testing.T, base string, edits []edit) {
	t.Helper()
	for _, tc := range edits {
		text := strings.Replace(base, tc.from, tc.to, 1)
		if text == base {
			t.Fatalf("%q not in the base config", tc.from)
		}
		_, err := Load(writeConfig(t, text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: error %v\nwant %q", tc.from, tc.to, err, tc.want)
		}
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadGood(t *testing.T) {
	c, err := Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if c.Train.Steps != 5 || c.Data.MicroBatches != 4 || c.MicroBatchSize() != 3 {
		t.Errorf("parsed %+v", c)
	}
	if c.Train.Optimizer.LR != 0.1 || c.Model.DType != "float32" || c.Transport.QueueDepth != 4 {
		t.Errorf("defaults or values wrong: %+v", c)
	}
	if f, l := c.ChunkLayers(1, 0); f != 1 || l != 3 {
		t.Errorf("stage 1 layers [%d, %d), want [1, 3)", f, l)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	p := writeConfig(t, good)
	t.Setenv("PIPETRAIN_TRAIN_STEPS", "42")
	t.Setenv("PIPETRAIN_SCHEDULE", "1f1b")
	t.Setenv("PIPETRAIN_TRAIN_OPTIMIZER_LR", "0.5")
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Train.Steps != 42 || c.Schedule != "1f1b" || c.Train.Optimizer.LR != 0.5 {
		t.Errorf("overrides not applied: steps %d schedule %s lr %v", c.Train.Steps, c.Schedule, c.Train.Optimizer.LR)
	}
}

// TestValidationRules has one broken config per rule; each must be refused with the
// offending field named.
func TestValidationRules(t *testing.T) {
	cases := []struct {
		name, from, to string
		want           []string
	}{
		{"overlapping layers", `"1-2"`, `"0-2"`, []string{"stages[1].layers", "layer 0 is already placed on stages[0]"}},
		{"missing middle layer", `"1-2"`, `"2"`, []string{"stages[1].layers", "layer 1 on no stage"}},
		{"missing last layer", `"1-2"`, `"1"`, []string{"stages:", "layer 2 of model mlp on no stage"}},
		{"layer beyond model", `"1-2"`, `"1-3"`, []string{"stages[1].layers", "reaches layer 3", "layers 0-2"}},
		{"bad layer syntax", `"1-2"`, `"one"`, []string{"stages[1].layers", `"one" is not a layer range`}},
		{"batch not divisible", "micro_batches: 4", "micro_batches: 5", []string{"data.batch_size", "12 is not divisible by data.micro_batches 5"}},
		{"zero micro-batches", "micro_batches: 4", "micro_batches: 0", []string{"data.micro_batches", "at least 1"}},
		{"unknown schedule", "schedule: gpipe", "schedule: pipedream", []string{"schedule:", `unknown schedule "pipedream" (known: gpipe, 1f1b, interleaved, zb-h1, zb-v, interleaved-zb, dualpipev, custom)`}},
		{"unknown model", "name: mlp", "name: resnet", []string{"model.name:", `unknown model "resnet" (known: cnn, gpt, llama, mlp, sequential)`}},
		{"duplicate address", "127.0.0.1:7002", "127.0.0.1:7001", []string{"stages[1].address: 127.0.0.1:7001 is also used by stages[0].address"}},
		{"address without port", "127.0.0.1:7002", "localhost", []string{"stages[1].address", "not host:port"}},
		{"unknown optimizer", "name: sgd", "name: lion", []string{"train.optimizer.name", `"lion"`}},
		{"non-positive lr", "lr: 0.1", "lr: 0", []string{"train.optimizer.lr", "positive"}},
		{"zero steps", "steps: 5", "steps: 0", []string{"train.steps", "at least 1"}},
		{"cuda device", "address: 127.0.0.1:7002}", "address: 127.0.0.1:7002, device: \"cuda:0\"}", []string{"stages[1].device", "built without CUDA"}},
		{"unknown device", "address: 127.0.0.1:7002}", "address: 127.0.0.1:7002, device: tpu}", []string{"stages[1].device", "unknown device"}},
		{"zero receive timeout", "schedule: gpipe", "schedule: gpipe\ntransport: {recv_timeout: 0s}", []string{"transport.recv_timeout", "positive"}},
		{"unknown all-reduce transport", "schedule: gpipe", "schedule: gpipe\nall_reduce: {transport: tcp}", []string{`all_reduce.transport: unknown transport "tcp" (known: stream, grpc)`}},
		{"unknown all-reduce overlap", "schedule: gpipe", "schedule: gpipe\nall_reduce: {overlap: tensor}", []string{`all_reduce.overlap: unknown overlap "tensor" (known: chunk, layer)`}},
		{"layer overlap off the ring", "schedule: gpipe", "schedule: gpipe\nall_reduce: {overlap: layer, algorithm: reduce-to-one}", []string{"all_reduce.overlap: layer needs all_reduce.algorithm ring, not reduce-to-one"}},
		{"interleaved without chunks", "schedule: gpipe", "schedule: interleaved", []string{"virtual_stages", "at least 2 chunks per stage"}},
		{"chunks without interleaving", "schedule: gpipe", "schedule: gpipe\nvirtual_stages: 2", []string{"virtual_stages", "need schedule: interleaved"}},
		{"metrics address clash", "address: 127.0.0.1:7002}", "address: 127.0.0.1:7002, metrics_address: \"127.0.0.1:7001\"}", []string{"stages[1].metrics_address: 127.0.0.1:7001 is also used by stages[0].address"}},
		{"metrics address clashing with a later stage", "address: 127.0.0.1:7001}", "address: 127.0.0.1:7001, metrics_address: \"127.0.0.1:7002\"}", []string{"stages[0].metrics_address: 127.0.0.1:7002 is also used by stages[1].address"}},
		{"bad cpu list", "address: 127.0.0.1:7002}", "address: 127.0.0.1:7002, cpus: \"3-1\"}", []string{"stages[1].cpus", "not a CPU list"}},
		{"unknown recomputation", "address: 127.0.0.1:7002}", "address: 127.0.0.1:7002, recompute: all}", []string{`stages[1].recompute: unknown mode "all" (known: none, full, selective)`}},
		{"full recomputation in a custom schedule", "schedule: gpipe\nstages:\n  - {layers: \"0\", address: 127.0.0.1:7001}", "schedule: custom\nschedule_file: s.csv\nstages:\n  - {layers: \"0\", address: 127.0.0.1:7001, recompute: full}",
			[]string{"stages[0].recompute: full recomputation is added to a named schedule; a custom schedule recomputes where its own RF actions say"}},
		{"selective without attention", "address: 127.0.0.1:7001}", "address: 127.0.0.1:7001, recompute: selective}", []string{"stages[0].recompute: selective recomputes attention's probabilities, and none of this stage's layers has attention"}},
		{"unknown dtype", "name: mlp,", "name: mlp, dtype: float16,", []string{"model.dtype:", `unknown dtype "float16" (known: float32, float64)`}},
		{"sharded optimizer under compression", "schedule: gpipe", "schedule: gpipe\ntransport: {compression: bf16}\nall_reduce: {shard_optimizer: true}",
			[]string{"all_reduce.shard_optimizer: shares the updated weights over the replicas' ring, which transport.compression bf16 would round"}},
		{"unknown all-reduce algorithm", "schedule: gpipe", "schedule: gpipe\nall_reduce: {algorithm: tree}", []string{`all_reduce.algorithm: unknown algorithm "tree" (known: ring, reduce-to-one, hierarchical)`}},
		{"sharded optimizer without the ring", "schedule: gpipe", "schedule: gpipe\nall_reduce: {shard_optimizer: true, algorithm: reduce-to-one}",
			[]string{"all_reduce.shard_optimizer: needs all_reduce.algorithm ring (its reduce-scatter makes the shards), not reduce-to-one"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Replace(good, tc.from, tc.to, 1)
			if text == good {
				t.Fatalf("replacement %q not found in the base config", tc.from)
			}
			p := writeConfig(t, text)
			_, err := Load(p)
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, p+":") {
				t.Errorf("error does not start with the file name: %s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestAllProblemsReportedAtOnce(t *testing.T) {
	text := strings.NewReplacer("micro_batches: 4", "micro_batches: 5", "schedule: gpipe", "schedule: nope", "127.0.0.1:7002", "127.0.0.1:7001").Replace(good)
	_, err := Load(writeConfig(t, text))
	var p *Problems
	if err == nil || !asProblems(err, &p) || len(p.Items) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
}

func asProblems(err error, p **Problems) bool {
	q, ok := err.(*Problems)
	*p = q
	return ok
}

func TestMissingAndMalformedFiles(t *testing.T) {
	if _, err := Load("/nonexistent/run.yaml"); err == nil || !strings.Contains(err.Error(), "/nonexistent/run.yaml") {
		t.Errorf("missing file: %v", err)
	}
	p := writeConfig(t, "model: [unclosed")
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("malformed YAML: %v", err)
	}
}

func TestDigestChangesWithTrainingSettings(t *testing.T) {
	a, err := Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest() != b.Digest() {
		t.Error("same config, different digests")
	}
	b.Train.Steps++
	if a.Digest() == b.Digest() {
		t.Error("different steps, same digest")
	}
}

// TestShippedExamplesAreValid keeps every YAML in this folder runnable.
func TestShippedExamplesAreValid(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	if len(files) == 0 {
		t.Fatal("no example configs found")
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

const interleavedBase = `
model: {name: mlp, input: 8, hidden: [6, 5, 4, 6, 5, 4, 3], classes: 3}
data: {batch_size: 16, micro_batches: 4}
schedule: interleaved
virtual_stages: 2
stages:
  - {layers: ["0", "4"], address: 127.0.0.1:7001}
  - {layers: ["1", "5"], address: 127.0.0.1:7002}
  - {layers: ["2", "6"], address: 127.0.0.1:7003}
  - {layers: ["3", "7"], address: 127.0.0.1:7004}
`

func TestInterleavedConfig(t *testing.T) {
	base := interleavedBase
	c, err := Load(writeConfig(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if c.ModelStages() != 8 {
		t.Errorf("%d model stages", c.ModelStages())
	}
	if s, ch := c.Place(5); s != 1 || ch != 1 {
		t.Errorf("model stage 5 on stage %d chunk %d, want 1, 1", s, ch)
	}
	if f, l := c.ChunkLayers(2, 1); f != 6 || l != 7 {
		t.Errorf("stage 2 chunk 1 = [%d, %d)", f, l)
	}
	cases := []edit{
		{`["1", "5"]`, `["1"]`, "stages[1].layers: lists 1 layer ranges; virtual_stages is 2"},
		{`["1", "5"]`, `["5", "1"]`, "stages[1].layers[0]"},
		{`["2", "6"]`, `["2", "5"]`, "stages[2].layers[1]: layer 5 is already placed on stages[1] chunk 1"},
		{"micro_batches: 4", "micro_batches: 6", "multiple"},
	}
	refusesEdits(t, base, cases)
}

// TestInterleavedZBConfig: interleaved-zb places chunks as interleaved does,
// takes the same sizes, and splits the backward, so a model whose layers
// cannot split it is refused.
func TestInterleavedZBConfig(t *testing.T) {
	base := strings.Replace(interleavedBase, "schedule: interleaved", "schedule: interleaved-zb", 1)
	c, err := Load(writeConfig(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if s, ch := c.Place(5); s != 1 || ch != 1 || c.Placement() != schedule.Loop || c.LossStage() != 3 {
		t.Errorf("model stage 5 on stage %d chunk %d, placement %v, loss on stage %d", s, ch, c.Placement(), c.LossStage())
	}
	s, err := c.BuildSchedule()
	if err != nil || s.Name != "interleaved-zb" || s.Chunks != 2 || !s.SplitsBackward() {
		t.Fatalf("BuildSchedule: %v %+v", err, s)
	}
	cases := []edit{
		{"virtual_stages: 2", "virtual_stages: 1", "virtual_stages: the interleaved-zb schedule needs at least 2 chunks per stage, got 1"},
		{"micro_batches: 4", "micro_batches: 6", "schedule: interleaved-zb needs micro_batches to be a multiple of stages (6 micro-batches, 4 stages)"},
	}
	refusesEdits(t, base, cases)
	cnn := `
model: {name: cnn, input: 64, channels: [2, 2, 2], classes: 3}
data: {batch_size: 8, micro_batches: 2}
schedule: interleaved-zb
virtual_stages: 2
stages:
  - {layers: ["0", "2"], address: 127.0.0.1:7001}
  - {layers: ["1", "3"], address: 127.0.0.1:7002}
`
	want := "schedule: interleaved-zb splits the backward into input and weight gradients; layer conv0 of model cnn cannot"
	if _, err := Load(writeConfig(t, cnn)); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a CNN under interleaved-zb: error %v, want %q", err, want)
	}
	if _, err := Load(writeConfig(t, strings.Replace(cnn, "interleaved-zb", "interleaved", 1))); err != nil {
		t.Errorf("the same CNN under interleaved: %v", err)
	}
}

func TestCustomScheduleFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := func(file string) string {
		p := filepath.Join(dir, "run.yaml")
		text := strings.Replace(good, "schedule: gpipe", "schedule: custom\nschedule_file: "+file, 1)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Recomputation is the file's to say, with RF actions.
	write("rf.csv", "0F0,0F1,0F2,0B0,0B1,0F3,0B2,0B3\n1F0,1RF0,1B0,1F1,1F2,1RF1,1B1,1RF2,1B2,1F3,1RF3,1B3\n")
	if c, err := Load(cfg("rf.csv")); err != nil {
		t.Fatal(err)
	} else if s, err := c.BuildSchedule(); err != nil || schedule.RecomputesChunk(s.Actions[0], 0) || !schedule.RecomputesChunk(s.Actions[1], 0) {
		t.Fatalf("custom schedule with RF actions: %v\n%v", err, s.Grid())
	}
	// 2 stages, 4 micro-batches: a valid order that is neither gpipe nor 1f1b.
	write("ok.csv", "0F0,0F1,0F2,0B0,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1F2,1B1,1B2,1F3,1B3\n")
	c, err := Load(cfg("ok.csv"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.BuildSchedule()
	if err != nil || s.Name != "custom" || len(s.Actions[1]) != 8 {
		t.Fatalf("custom schedule: %v %+v", err, s)
	}
	// A config made in code, never loaded, reads the file; building from it
	// leaves it as it was.
	inCode := *c
	inCode.ScheduleText = ""
	before := inCode
	if fromFile, err := inCode.BuildSchedule(); err != nil || fromFile.Grid() != s.Grid() {
		t.Errorf("building from the file: %v", err)
	}
	if !reflect.DeepEqual(before, inCode) {
		t.Error("BuildSchedule changed the config it was given")
	}
	digest := c.Digest()
	// The loaded schedule is kept: later builds do not read the file again.
	if err := os.Remove(filepath.Join(dir, "ok.csv")); err != nil {
		t.Fatal(err)
	}
	if again, err := c.BuildSchedule(); err != nil || again.Grid() != s.Grid() {
		t.Errorf("second build after the file was removed: %v", err)
	}
	write("ok.csv", "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1F2,1B1,1B2,1F3,1B3\n")
	if c2, err := Load(cfg("ok.csv")); err != nil || c2.Digest() == digest {
		t.Errorf("changing the file's contents must change the digest (%v)", err)
	}
	cases := map[string]struct{ text, want string }{
		"dup.csv":      {"0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n", "0B3 appears twice"},
		"missing.csv":  {"0F0,0F1,0F2,0F3,0B0,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n", "missing action 0B3"},
		"deadlock.csv": {"0F0,0B0,0F1,0F2,0F3,0B1,0B2,0B3\n1F1,1F0,1B0,1B1,1F2,1B2,1F3,1B3\n", "deadlock"},
		"small.csv":    {"0F0,0B0\n1F0,1B0\n", "1 micro-batches"},
	}
	for name, tc := range cases {
		write(name, tc.text)
		_, err := Load(cfg(name))
		if err == nil || !strings.Contains(err.Error(), "schedule_file") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want schedule_file and %q", name, err, tc.want)
		}
	}
	if _, err := Load(cfg("absent.csv")); err == nil || !strings.Contains(err.Error(), "absent.csv") {
		t.Errorf("missing file: %v", err)
	}

	// A lowered file is checked as written: sound compute, but stage 1 waits
	// for micro-batch 2's activation before sending micro-batch 0's gradient,
	// which stage 0 needs before it sends that activation.
	s1, err := schedule.Build("1f1b", 2, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	lowered, err := schedule.Lower(s1)
	if err != nil {
		t.Fatal(err)
	}
	write("good.txt", lowered.Grid())
	if c, err := Load(cfg("good.txt")); err != nil || c.ScheduleText != lowered.Grid() {
		t.Errorf("a lowered file as Lower prints it: %v", err)
	}
	dead := strings.Replace(strings.Replace(lowered.Grid(), " 1F2<0 ", " ", 1), "1F0 1B0 ", "1F0 1F2<0 1B0 ", 1)
	write("dead.txt", dead)
	if _, err := Load(cfg("dead.txt")); err == nil || !strings.Contains(err.Error(), "schedule_file") || !strings.Contains(err.Error(), "deadlock") {
		t.Errorf("a lowered file that deadlocks: %v\n%s", err, dead)
	}

	// Stage 1 takes micro-batch 3's activation first: four messages must fit
	// on the link, which two queues of depth 1 do not hold.
	g, err := schedule.Build("gpipe", 2, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	gl, err := schedule.Lower(g)
	if err != nil {
		t.Fatal(err)
	}
	early := strings.Replace(strings.Replace(gl.Grid(), "stage 1: 1F0<0", "stage 1: 1F3<0 1F0<0", 1), "1F2 1F3<0 1F3", "1F2 1F3", 1)
	write("early.txt", early)
	if _, err := Load(cfg("early.txt")); err != nil {
		t.Errorf("early receive with the default queue depth: %v", err)
	}
	t.Setenv("PIPETRAIN_TRANSPORT_QUEUE_DEPTH", "1")
	if _, err := Load(cfg("early.txt")); err == nil || !strings.Contains(err.Error(), "with transport.queue_depth 1: deadlock") {
		t.Errorf("early receive with queue depth 1: %v", err)
	}
}

// TestModelProblemsNamedAtOnce: every problem of the model section is
// reported in one run, each under its own field.
func TestModelProblemsNamedAtOnce(t *testing.T) {
	text := strings.Replace(good, "model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}",
		"model: {name: mlp, dtype: float16, input: 8, hidden: [512, 0, 128], classes: 0, activation: gelu}", 1)
	wantProblems(t, writeConfig(t, text),
		`model.dtype: unknown dtype "float16" (known: float32, float64)`,
		`model.activation: unknown activation "gelu" (known: relu, tanh, sigmoid)`,
		"model.hidden[1]: must be at least 1, got 0",
		"model.classes: must be at least 2, got 0")
	wantProblems(t, writeConfig(t, strings.Replace(good, "name: mlp", "name: mlpx", 1)),
		`model.name: unknown model "mlpx" (known: cnn, gpt, llama, mlp, sequential)`)
}
