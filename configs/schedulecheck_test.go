package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

const checkGPT = `
model: {name: gpt, layers: 2, width: 16, heads: 2, context: 8, vocab: 256}
data: {dataset: text, corpus: "go:strings", tokenizer: byte, val_fraction: 0.1, batch_size: 4, micro_batches: 2}
train: {steps: 1, optimizer: {name: sgd, lr: 0.1}}
schedule: SCHEDULE
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`

const checkCNN = `
model: {name: cnn, input: 64, channels: [2], classes: 3}
data: {batch_size: 8, micro_batches: 2}
train: {steps: 1, optimizer: {name: sgd, lr: 0.1}}
schedule: SCHEDULE
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1", address: 127.0.0.1:7002}
`

const checkMLP = `
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 12, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: SCHEDULE
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-2", address: 127.0.0.1:7002}
`

func loadCheckConfig(t *testing.T, text, sched string) (*Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(strings.Replace(text, "SCHEDULE", sched, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return Load(p)
}

// TestCheckScheduleRuns: a split schedule is refused for a model with a layer
// that cannot split (the CNN's convolutions), with the message Validate gives
// for the same schedule in the config, and allowed for models whose layers all
// can (the MLP, the GPT); a fused schedule is allowed for all.
func TestCheckScheduleRuns(t *testing.T) {
	cnn, err := loadCheckConfig(t, checkCNN, "1f1b")
	if err != nil {
		t.Fatal(err)
	}
	cnnModel, err := models.Build(cnn.Model)
	if err != nil {
		t.Fatal(err)
	}
	zb, err := schedule.Build("zb-h1", len(cnn.Stages), cnn.Data.MicroBatches, 1)
	if err != nil {
		t.Fatal(err)
	}
	refused := cnn.CheckScheduleRuns(zb, cnnModel)
	if refused == nil || !strings.Contains(refused.Error(), "zb-h1 splits the backward") || !strings.Contains(refused.Error(), "layer conv0 of model cnn cannot") {
		t.Fatalf("zb-h1 on cnn: got %v, want a refusal naming zb-h1, conv0 and cnn", refused)
	}
	_, err = loadCheckConfig(t, checkCNN, "zb-h1")
	if err == nil || !strings.Contains(err.Error(), "schedule: "+refused.Error()) {
		t.Errorf("Validate with schedule: zb-h1 on cnn: got %v, want it to contain %q", err, "schedule: "+refused.Error())
	}
	oneF, err := schedule.Build("1f1b", len(cnn.Stages), cnn.Data.MicroBatches, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := cnn.CheckScheduleRuns(oneF, cnnModel); err != nil {
		t.Errorf("1f1b on cnn: %v", err)
	}
	anon := *zb
	anon.Name = ""
	if err := cnn.CheckScheduleRuns(&anon, cnnModel); err == nil || !strings.HasPrefix(err.Error(), "the schedule splits") {
		t.Errorf("unnamed split schedule on cnn: got %v", err)
	}

	for _, c := range []struct{ name, text string }{{"mlp", checkMLP}, {"gpt", checkGPT}} {
		cfg, err := loadCheckConfig(t, c.text, "zb-h1")
		if err != nil {
			t.Fatalf("Validate with schedule: zb-h1 on %s: %v", c.name, err)
		}
		m, err := models.Build(cfg.Model)
		if err != nil {
			t.Fatal(err)
		}
		s, err := cfg.BuildSchedule()
		if err != nil {
			t.Fatal(err)
		}
		if !s.SplitsBackward() {
			t.Fatalf("%s: the configured zb-h1 splits no backward; the test checks nothing", c.name)
		}
		if err := cfg.CheckScheduleRuns(s, m); err != nil {
			t.Errorf("zb-h1 on %s: %v", c.name, err)
		}
	}
}
