package parallel

import (
	"sync"
	"testing"
)

// TestRangesCoverEachIndexOnce: every index of [0, n) is visited exactly
// once, for worker counts that do and do not divide n, and small n stays on
// one call.
func TestRangesCoverEachIndexOnce(t *testing.T) {
	for _, c := range []struct{ n, workers, min, calls int }{{10, 3, 1, 3}, {7, 1, 1, 1}, {100, 4, 1000, 1}, {5, 8, 1, 8}, {0, 2, 0, 2}} {
		seen := make([]int, c.n)
		var mu sync.Mutex
		calls := 0
		Ranges(c.n, c.workers, c.min, func(lo, hi int) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			for i := lo; i < hi; i++ {
				seen[i]++
			}
		})
		for i, s := range seen {
			if s != 1 {
				t.Errorf("n=%d workers=%d: index %d visited %d times", c.n, c.workers, i, s)
			}
		}
		if calls != c.calls {
			t.Errorf("n=%d workers=%d min=%d: %d calls, want %d", c.n, c.workers, c.min, calls, c.calls)
		}
	}
}
