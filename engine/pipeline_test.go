package engine

import (
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestEstimateTransferTakesTheLargestChunkInput: the estimate is the loopback
// link's time for the largest micro-batch that enters a chunk from another
// chunk, whatever stage holds it; the model's own input crosses no link.
func TestEstimateTransferTakesTheLargestChunkInput(t *testing.T) {
	m := smallMLP(t, "float32") // 6 -> 5 -> 4 -> 3
	p := Pipeline{Chunks: [][][2]int{{{0, 1}, {2, 3}}, {{1, 2}}}, Batch: 8}
	largest := int64(m.ShapeAt(1, p.Batch).TotalSize() * int(m.DType.Size())) // layer 1's input, 8x5
	if got, want := EstimateTransfer(p, m), schedule.Loopback.Time(largest); got != want {
		t.Errorf("EstimateTransfer = %v, want %v (%d bytes)", got, want, largest)
	}
	one := Pipeline{Chunks: [][][2]int{{{0, 3}}}, Batch: 8}
	if got, want := EstimateTransfer(one, m), schedule.Loopback.Latency; got != want {
		t.Errorf("one chunk: EstimateTransfer = %v, want the latency alone, %v", got, want)
	}
}

// TestPredictMemoryNamesAChunkThePipelineLacks: a schedule with more stages
// than the pipeline describes is refused, naming the stage and chunk.
func TestPredictMemoryNamesAChunkThePipelineLacks(t *testing.T) {
	m := smallMLP(t, "float32")
	s, err := schedule.Build("1f1b", 2, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	p := Pipeline{Chunks: [][][2]int{{{0, 3}}}, Batch: 4}
	if _, _, err := PredictMemory(p, m, s); err == nil || !strings.Contains(err.Error(), "stage 1 chunk 0") {
		t.Errorf("PredictMemory of a 2-stage schedule over 1 stage: %v, want an error naming stage 1 chunk 0", err)
	}
}
