package predict

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// mlp2 is a 2-stage MLP small enough to measure in a test.
const mlp2 = `
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-2", address: 127.0.0.1:7002}
`

// load writes a config's text to a file and loads it, with its model.
func load(t *testing.T, text string) (*configs.Config, *models.Model) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	model, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, model
}
