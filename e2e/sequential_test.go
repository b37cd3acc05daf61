package e2e

import (
	"testing"
	"time"
)

const tinySequential = `
model:
  name: sequential
  input: 784
  input_shape: [1, 28, 28]
  classes: 10
  stack:
    - {type: conv2d, out: 4, kernel: 3, padding: 1}
    - {type: relu}
    - {type: maxpool}
    - {type: flatten}
    - {type: linear, out: 32}
    - {type: residual, repeat: 2, stack: [{type: layernorm}, {type: linear, out: 32}, {type: gelu}]}
    - {type: linear, out: 10}
data: {batch_size: 32, micro_batches: 4}
train: {steps: 6, log_every: 3, evaluate: false, optimizer: {name: adam, lr: 0.003}}
schedule: zb-h1
stages:
  - {layers: "0-1", address: ADDR0}
  - {layers: "2-4", address: ADDR1}
`

// TestSequentialLaunchEqualsReference runs a sequential model (a
// convolution, a Dense layer, a residual group twice and the head: 5
// units) as 2 processes over gRPC under zb-h1 against the one-process
// reference: losses and weights bit-identical.
func TestSequentialLaunchEqualsReference(t *testing.T) {
	needData(t)
	cfg := writeConfig(t, tinySequential, 2)
	refDir, pipeDir := t.TempDir(), t.TempDir()
	if res := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); res.err != nil {
		t.Fatalf("reference: %v\n%s", res.err, res.out)
	}
	if res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", pipeDir); res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	sameRun(t, refDir, pipeDir, 0)
}
