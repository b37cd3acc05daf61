package stages

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
)

// rampKind is a dataset kind registered from outside the data package: a
// table of examples made from its seed, sampled with data.Sampler, whose
// evaluation pass covers the table's first rows in micro-batches.
type rampKind struct {
	mu     sync.Mutex
	opened []data.OpenOptions // what each stage asked for
}

func (*rampKind) Name() string { return "ramp" }

// Keys gives the ramp a key of its own, data.rows: the examples its table
// holds.
func (*rampKind) Keys() []data.KeyDoc {
	return []data.KeyDoc{{Key: "rows", Type: "integer", Doc: "Examples in the ramp's table."}}
}

type rampKeys struct {
	Rows int `json:"rows"`
}

// keys decodes the ramp's own keys, rows 40 unless given.
func (*rampKind) keys(s *data.Section, problem func(key, format string, args ...any)) rampKeys {
	k := rampKeys{Rows: 40}
	s.DecodeOwn(&k, problem)
	return k
}

func (r *rampKind) Validate(s *data.Section, m *data.Model, problem func(key, format string, args ...any)) {
	if m != nil && m.Targets != 1 {
		problem("data.dataset", "ramp holds labelled examples; model %s predicts tokens", m.Name)
	}
	if k := r.keys(s, problem); k.Rows < s.BatchSize {
		problem("data.rows", "%d rows hold no batch of %d", k.Rows, s.BatchSize)
	}
}

func (*rampKind) Check(s *data.Section, m *data.Model) error { return nil }

func (k *rampKind) Open(s *data.Section, m *data.Model, o data.OpenOptions) (data.Source, error) {
	k.mu.Lock()
	k.opened = append(k.opened, data.OpenOptions{Inputs: o.Inputs, Targets: o.Targets})
	k.mu.Unlock()
	keys := k.keys(s, func(key, format string, args ...any) {})
	table := synthetic(keys.Rows, m.Features(), m.Classes, 5)
	sampler, err := data.NewSampler(s.Seed, table.N, s.BatchSize)
	if err != nil {
		return nil, err
	}
	return &rampSource{table: table, sampler: sampler, batch: s.MicroBatch}, nil
}

type rampSource struct {
	table   *data.Dataset
	sampler *data.Sampler
	batch   int
}

// fill copies rows of the table into x (when the stage reads inputs) and
// returns their labels (when it scores them).
func (r *rampSource) fill(rows []int, x data.Inputs, targets bool) []int {
	for i, k := range rows {
		src := r.table.Images[k*r.table.Dim : (k+1)*r.table.Dim]
		for j, v := range src {
			switch {
			case x.F32 != nil:
				x.F32[i*r.table.Dim+j] = v
			case x.F64 != nil:
				x.F64[i*r.table.Dim+j] = float64(v)
			}
		}
	}
	if !targets {
		return nil
	}
	y := make([]int, len(rows))
	data.GatherLabels(r.table, rows, y)
	return y
}

func (r *rampSource) Train(step, mb int, x data.Inputs, targets bool) []int {
	return r.fill(r.sampler.Indices(step)[mb*r.batch:(mb+1)*r.batch], x, targets)
}

func (r *rampSource) EvalBatches() int { return 3 }

func (r *rampSource) Eval(k int, x data.Inputs, targets bool) ([]int, int) {
	rows := make([]int, r.batch)
	for i := range rows {
		rows[i] = k*r.batch + i
	}
	return r.fill(rows, x, targets), r.batch
}

func (r *rampSource) EvalName() string { return "ramp" }

func (r *rampSource) NextToken() bool { return false }

var ramp = &rampKind{}

func init() { data.Register(ramp) }

// TestRegisteredKindTrainsLikeReference: a dataset kind registered from
// outside the data package is what the first and last stages draw their
// batches from, each opening only what it needs (stage 0 the inputs, the
// last stage the targets); the pipeline fed by it trains bit for bit as the
// reference fed by it, and evaluates on its evaluation micro-batches.
func TestRegisteredKindTrainsLikeReference(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float64", "adam")
	cfg.Data.Dataset = "ramp"
	cfg.Data.Own = map[string]any{"rows": 40}
	ramp.mu.Lock()
	ramp.opened = nil
	ramp.mu.Unlock()
	ref := runInProcess(t, cfg, true)
	pipe := runInProcess(t, cfg, false)
	sameMLPRun(t, cfg, ref, pipe)

	ramp.mu.Lock()
	opened := ramp.opened
	ramp.mu.Unlock()
	want := []data.OpenOptions{{Inputs: true, Targets: true}, {Inputs: true}, {Targets: true}}
	if len(opened) != 3 || opened[0] != want[0] || !(opened[1] == want[1] && opened[2] == want[2] || opened[1] == want[2] && opened[2] == want[1]) {
		t.Errorf("opened %+v, want the reference's %+v then the stages' %+v and %+v", opened, want[0], want[1], want[2])
	}
	b, err := os.ReadFile(filepath.Join(pipe, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res EvalResult
	if err := json.Unmarshal(b, &res); err != nil || res.Examples != 3*cfg.MicroBatchSize() {
		t.Errorf("eval.json %s (%v): want the ramp's 3 micro-batches of %d", b, err, cfg.MicroBatchSize())
	}
}

// TestRegisteredKindOwnsItsKeys: a config naming the ramp may give its own
// key data.rows, which the kind decodes and validates; a config naming
// another dataset refuses it as an unknown key, by name; the schema
// describes it.
func TestRegisteredKindOwnsItsKeys(t *testing.T) {
	config := filepath.Join(t.TempDir(), "ramp.yaml")
	load := func(data string) error {
		text := `
model: {name: mlp, input: 8, hidden: [6], classes: 3}
data: ` + data + `
train: {steps: 2, optimizer: {name: sgd, lr: 0.05}}
schedule: gpipe
stages:
  - {layers: "0", address: 127.0.0.1:7201}
  - {layers: "1", address: 127.0.0.1:7202}
`
		if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := configs.Load(config)
		return err
	}
	if err := load("{dataset: ramp, rows: 64, batch_size: 8, micro_batches: 2}"); err != nil {
		t.Errorf("ramp with rows: %v", err)
	}
	for data, want := range map[string]string{
		"{dataset: ramp, rows: 4, batch_size: 8, micro_batches: 2}":           "data.rows: 4 rows hold no batch of 8",
		"{dataset: ramp, rows: many, batch_size: 8, micro_batches: 2}":        "data.rows: is a string, want an integer",
		"{dataset: fashion-mnist, rows: 64, batch_size: 8, micro_batches: 2}": "data.rows: unknown key",
	} {
		if err := load(data); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("data %s: err = %v, want %q", data, err, want)
		}
	}
	b, err := configs.Schema()
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Data struct {
				Properties map[string]struct{ Type, Description string }
			}
		}
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if got := schema.Properties.Data.Properties["rows"]; got.Type != "integer" || got.Description != "Examples in the ramp's table." {
		t.Errorf("the schema's data.rows is %+v", got)
	}
}
