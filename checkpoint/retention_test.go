package checkpoint

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestPruneKeepsTheBest: with Best, pruning keeps the newest Keep committed
// checkpoints and, besides them, the Best whose parts record the lowest
// metric; a checkpoint that records none is never among the best.
func TestPruneKeepsTheBest(t *testing.T) {
	root := t.TempDir()
	metrics := map[int]string{10: "0.9", 20: "0.5", 30: "", 40: "0.7", 50: "0.6", 60: "0.8"}
	for _, step := range []int{10, 20, 30, 40, 50, 60} {
		meta := map[string]string{"step": strconv.Itoa(step)}
		if m := metrics[step]; m != "" {
			meta[MetricKey] = m
		}
		if _, err := WritePart(root, step, 0, []Tensor{{Name: "w", Shape: []int{1}, F32: []float32{float32(step)}}}, meta); err != nil {
			t.Fatal(err)
		}
		if _, err := Commit(context.Background(), root, step, 1, 0, "d", Retention{Keep: 1, Best: 2}, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	got, err := steps(root)
	if err != nil {
		t.Fatal(err)
	}
	// The newest (60), and the two lowest: 20 (0.5) and 50 (0.6).
	if want := []int{60, 50, 20}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	if err := Prune(root, Keep(1)); err != nil {
		t.Fatal(err)
	}
	if got, _ := steps(root); !slices.Equal(got, []int{60}) {
		t.Errorf("Keep(1) kept %v, want [60]", got)
	}
	if _, err := os.Stat(StepDir(root, 60)); err != nil {
		t.Error(err)
	}
}
