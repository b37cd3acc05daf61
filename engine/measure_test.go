package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRoundsTakeTurns: every item runs once per round, a warm-up round first
// whose times are not kept, so that a burst of load on the machine slows one
// run of many items instead of every run of one.
func TestRoundsTakeTurns(t *testing.T) {
	var got []string
	if _, err := rounds(3, 2, func(i int, keep bool) error {
		got = append(got, fmt.Sprintf("%d/%v", i, keep))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{"0/false", "1/false", "2/false", "0/true", "1/true", "2/true", "0/true", "1/true", "2/true"}
	if !slices.Equal(got, want) {
		t.Errorf("runs %v, want %v", got, want)
	}

	calls := 0
	boom := errors.New("boom")
	i, err := rounds(3, 2, func(i int, keep bool) error {
		calls++
		if keep && i == 1 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || i != 1 || calls != 5 {
		t.Errorf("failing item: got item %d, error %v after %d calls; want item 1, boom, 5 calls", i, err, calls)
	}
}

// TestMeasureAllPicksAmongEveryRun: each action's figure is the pick of one
// time per kept run (reps of them), for every range, and too few runs are
// refused.
func TestMeasureAllPicksAmongEveryRun(t *testing.T) {
	model := smallMLP(t, "float32")
	ranges := make([][2]int, len(model.Layers))
	for l := range ranges {
		ranges[l] = [2]int{l, l + 1}
	}
	const reps = 3
	var seen [][]time.Duration
	costs, err := measureAll(model, ranges, 4, 1, reps, func(ds []time.Duration) time.Duration {
		seen = append(seen, slices.Clone(ds))
		return slices.Min(ds)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != len(ranges) {
		t.Fatalf("%d costs for %d ranges", len(costs), len(ranges))
	}
	// Per range: F and B, then I and W (the MLP's layers split).
	if len(seen) != 4*len(ranges) {
		t.Fatalf("pick called %d times, want 4 per range (%d)", len(seen), 4*len(ranges))
	}
	for i, c := range costs {
		got := []time.Duration{c.F, c.B, c.I, c.W}
		for k, ds := range seen[4*i : 4*i+4] {
			if len(ds) != reps {
				t.Errorf("range %d action %d: picked among %d times, want %d", i, k, len(ds), reps)
			}
			if got[k] != slices.Min(ds) || got[k] <= 0 {
				t.Errorf("range %d action %d: figure %v, the fastest of %v", i, k, got[k], ds)
			}
		}
	}

	if _, err := measureAll(model, ranges, 4, 1, 0, slices.Min[[]time.Duration]); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("0 runs: got %v, want an error asking for at least 1", err)
	}
}
