package stages

import (
	"fmt"
	"testing"
)

// TestEnginePipelineReadsTheConfig: the plain values engine's cost and memory
// models take are the config's chunks (per stage, in chunk order), its
// micro-batch, seed and selectively recomputing stages.
func TestEnginePipelineReadsTheConfig(t *testing.T) {
	c := gptConfig("interleaved", [][]string{{"0", "2-3"}, {"1", "4"}}, false)
	c.Stages[1].Recompute = "selective"
	p := EnginePipeline(c)
	if got, want := fmt.Sprint(p.Chunks), "[[[0 1] [2 4]] [[1 2] [4 5]]]"; got != want {
		t.Errorf("chunks %s, want %s", got, want)
	}
	if p.Batch != c.MicroBatchSize() || p.Seed != c.Train.Seed {
		t.Errorf("micro-batch %d and seed %d, want %d and %d", p.Batch, p.Seed, c.MicroBatchSize(), c.Train.Seed)
	}
	if got, want := fmt.Sprint(p.Selective), "[false true]"; got != want {
		t.Errorf("selective stages %s, want %s", got, want)
	}
}
