package main

import (
	"strings"
	"testing"
)

// sequentialConfig is a sequential model of 4 units: a convolution with its
// pool and flatten, a residual group twice, the head.
const sequentialConfig = `
model:
  name: sequential
  input: 784
  input_shape: [1, 28, 28]
  classes: 10
  stack:
    - {type: conv2d, out: 2, padding: 1}
    - {type: maxpool}
    - {type: flatten}
    - {type: residual, repeat: 2, stack: [{type: layernorm}, {type: linear, out: 392}]}
    - {type: linear, out: 10}
data: {batch_size: 8, micro_batches: 2}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-3", address: 127.0.0.1:7002}
`

// TestValidateListsSequentialUnits: validate lists each unit of a
// sequential model under its stage, with the stack entries it holds (an
// entry with parameters and those without after it; a repeated residual
// group twice) and its example shapes.
func TestValidateListsSequentialUnits(t *testing.T) {
	out, err := runValidate(t, sequentialConfig)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"    layer 0   stack[0] conv2d, stack[1] maxpool, stack[2] flatten: 1x28x28 -> 392",
		"  stage 1          127.0.0.1:7002        layers 1-3   in (4, 392) -> out (4, 10)",
		"    layer 1   stack[3] residual: 392 -> 392",
		"    layer 2   stack[3] residual: 392 -> 392",
		"    layer 3   stack[4] linear: 392 -> 10",
	}, "\n")
	if !strings.Contains(out, want) {
		t.Errorf("validate printed\n%s\nwant it to hold\n%s", out, want)
	}
}

// TestPlanPlacesSequentialUnits: plan measures every unit of a sequential
// model, fused and split (zb-h1 among its schedules), and writes a config
// that loads.
func TestPlanPlacesSequentialUnits(t *testing.T) {
	out, c, err := runPlanned(t, sequentialConfig, "--schedules", "1f1b,zb-h1")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, unit := range []string{"layer 0 stack0 ", "layer 1 stack3 ", "layer 2 stack4 ", "layer 3 stack5 "} {
		if !strings.Contains(out, unit) {
			t.Errorf("plan did not measure %q:\n%s", unit, out)
		}
	}
	if len(c.Stages) != 2 {
		t.Errorf("planned %+v", c.Stages)
	}
}
