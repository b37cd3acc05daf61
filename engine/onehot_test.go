package engine

import (
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// TestForwardRefusesTargetsOutsideTheClasses: a target at or beyond the
// model's classes once wrote its one into the next row's classes (or
// panicked past the last row); the last stage now refuses it, naming it, as
// it refuses a target count unlike the batch's.
func TestForwardRefusesTargetsOutsideTheClasses(t *testing.T) {
	m := smallMLP(t, "float32") // 3 classes
	e, err := NewEngine(m, 1, 3, 2, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	in := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(2, 5))
	for _, c := range []struct {
		targets []int
		want    string
	}{
		{[]int{0, 3}, "micro-batch 0 targets: target 3 of row 1 is not in [0, 3), the model's classes"},
		{[]int{-1, 0}, "target -1 of row 0 is not in [0, 3)"},
		{[]int{0}, "1 targets for 2 rows"},
	} {
		_, err := e.Forward(0, in, c.targets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("targets %v: err = %v, want one containing %q", c.targets, err, c.want)
		}
	}
	if _, err := e.Forward(0, in, []int{2, 0}); err != nil {
		t.Fatalf("refused targets in range after refusing others: %v", err)
	}
}
