package stages

import (
	"fmt"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// sequentialConfig is testConfig's run (4 micro-batches) with a sequential
// model on its 8 features read as 2x2 images of 2 channels: conv2d, relu,
// maxpool, flatten, linear, a residual group repeated twice (two units) and
// the linear head: units 0-7.
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
		{"1f1b", plain("0-3", "4-7")},
		{"zb-h1", plain("0-4", "5-7")},
		{"gpipe", plain("0-2", "3-4", "5", "6-7")},
		{"zb-v", [][]string{{"0-2", "6-7"}, {"3-4", "5"}}},
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
	cfg := sequentialConfig("1f1b", plain("0-3", "4-7"))
	cfg.Train.Steps = 12
	losses := readLosses(t, runInProcess(t, cfg, true))
	if len(losses) < 2 || !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("losses %v do not fall", losses)
	}
}
