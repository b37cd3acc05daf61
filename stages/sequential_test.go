package stages

import (
	"fmt"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
)

// sequentialConfig is testConfig's run (4 micro-batches) with a sequential
// model on its 8 features read as 2x2 images of 2 channels: conv2d, relu,
// maxpool, flatten (unit 0, the conv2d's), linear (1), a residual group
// repeated twice (2 and 3) and the linear head (4).
func sequentialConfig(sched string, layers [][]string) *configs.Config {
	c := testConfig(sched, layers, 4, "float64", "adam")
	type entry = map[string]any
	c.Model = models.Spec{Name: "sequential", DType: "float64", Input: 8, Classes: 3, Own: map[string]any{
		"input_shape": []any{2, 2, 2},
		"stack": []any{
			entry{"type": "conv2d", "out": 2, "kernel": 3, "padding": 1},
			entry{"type": "relu"},
			entry{"type": "maxpool"},
			entry{"type": "flatten"},
			entry{"type": "linear", "out": 6},
			entry{"type": "residual", "repeat": 2, "stack": []any{
				entry{"type": "layernorm"}, entry{"type": "linear", "out": 6}, entry{"type": "gelu"},
			}},
			entry{"type": "linear", "out": 3},
		},
	}}
	return c
}

// TestSequentialPipelineEqualsReference trains the sequential model split
// over 2 stages (and 4 under gpipe, and the V of zb-v) against the
// one-process reference, bit for bit; the zero-bubble schedules rebuild
// each unit's parameterised entries to compute its weight gradients.
func TestSequentialPipelineEqualsReference(t *testing.T) {
	for _, tc := range []struct {
		sched  string
		layers [][]string
	}{
		{"1f1b", plain("0-1", "2-4")},
		{"zb-h1", plain("0", "1-4")},
		{"gpipe", plain("0", "1", "2", "3-4")},
		{"zb-v", [][]string{{"0", "4"}, {"1-2", "3"}}},
	} {
		t.Run(fmt.Sprintf("%s/p%d", tc.sched, len(tc.layers)), func(t *testing.T) {
			cfg := sequentialConfig(tc.sched, tc.layers)
			sameRun(t, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
		})
	}
}

// TestSequentialTrains: the loss falls, so the test above compares runs
// that learn.
func TestSequentialTrains(t *testing.T) {
	cfg := sequentialConfig("1f1b", plain("0-1", "2-4"))
	cfg.Train.Steps = 12
	losses := readLosses(t, runInProcess(t, cfg, true))
	if len(losses) < 2 || !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("losses %v do not fall", losses)
	}
}

// TestSequentialUnitsMeasure: every unit of the sequential model, measured
// alone as pipetrain plan measures it, fused and split, holds memory the
// engine can count: no unit is without parameters (an engine cannot split
// such a chunk) or needs fresh tensors every run (whose registers the
// engine cannot count), the convolution's included.
func TestSequentialUnitsMeasure(t *testing.T) {
	cfg := sequentialConfig("zb-h1", plain("0", "1-4"))
	m, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Layers {
		if _, fresh := l.(models.FreshValues); fresh {
			t.Errorf("unit %d needs fresh values", i)
		}
		for _, split := range []bool{false, true} {
			mem, err := engine.MeasureMemory(m, i, i+1, 4, 1, engine.Options{Split: split})
			if err != nil || mem.Machine <= 0 {
				t.Errorf("unit %d, split %v: %+v, %v", i, split, mem, err)
			}
		}
	}
}
