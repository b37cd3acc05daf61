package stats

import (
	"slices"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	xs := []time.Duration{5, 1, 4, 2}
	if got := Median(xs); got != 3 {
		t.Errorf("even count: %v, want the mean of 2 and 4", got)
	}
	if !slices.Equal(xs, []time.Duration{5, 1, 4, 2}) {
		t.Errorf("Median sorted its argument: %v", xs)
	}
	if got := Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("odd count: %v", got)
	}
	if got := Median([]int(nil)); got != 0 {
		t.Errorf("none: %v", got)
	}
}
