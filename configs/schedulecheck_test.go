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
// that cannot split, with the message Validate gives for the same schedule in
// the config, and allowed for one whose layers all can; a fused schedule is
// allowed for both.
func TestCheckScheduleRuns(t *testing.T) {
	gpt, err := loadCheckConfig(t, checkGPT, "1f1b")
	if err != nil {
		t.Fatal(err)
	}
	gptModel, err := models.Build(gpt.Model)
	if err != nil {
		t.Fatal(err)
	}
	zb, err := schedule.Build("zb-h1", len(gpt.Stages), gpt.Data.MicroBatches, 1)
	if err != nil {
		t.Fatal(err)
	}
	refused := gpt.CheckScheduleRuns(zb, gptModel)
	if refused == nil || !strings.Contains(refused.Error(), "zb-h1 splits the backward") || !strings.Contains(refused.Error(), "of model gpt cannot") {
		t.Fatalf("zb-h1 on gpt: got %v, want a refusal naming zb-h1 and gpt", refused)
	}
	_, err = loadCheckConfig(t, checkGPT, "zb-h1")
	if err == nil || !strings.Contains(err.Error(), "schedule: "+refused.Error()) {
		t.Errorf("Validate with schedule: zb-h1 on gpt: got %v, want it to contain %q", err, "schedule: "+refused.Error())
	}
	oneF, err := schedule.Build("1f1b", len(gpt.Stages), gpt.Data.MicroBatches, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := gpt.CheckScheduleRuns(oneF, gptModel); err != nil {
		t.Errorf("1f1b on gpt: %v", err)
	}
	anon := *zb
	anon.Name = ""
	if err := gpt.CheckScheduleRuns(&anon, gptModel); err == nil || !strings.HasPrefix(err.Error(), "the schedule splits") {
		t.Errorf("unnamed split schedule on gpt: got %v", err)
	}

	mlp, err := loadCheckConfig(t, checkMLP, "zb-h1")
	if err != nil {
		t.Fatal(err)
	}
	mlpModel, err := models.Build(mlp.Model)
	if err != nil {
		t.Fatal(err)
	}
	mzb, err := mlp.BuildSchedule()
	if err != nil {
		t.Fatal(err)
	}
	if err := mlp.CheckScheduleRuns(mzb, mlpModel); err != nil {
		t.Errorf("zb-h1 on mlp: %v", err)
	}
}
