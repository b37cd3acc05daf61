package profile

import "time"

// ActionCosts are a stage's mean action durations: what the schedule simulator
// needs to replay a run. Kinds the run did not execute are zero.
type ActionCosts struct {
	F, B, I, W time.Duration
}

// MeanCosts averages each stage's action durations by kind over the steps after
// the first skip (when there are more).
func MeanCosts(events [][]Event, skip int) []ActionCosts {
	out := make([]ActionCosts, len(events))
	for s, evs := range events {
		maxStep := -1
		for _, e := range evs {
			maxStep = max(maxStep, e.Step)
		}
		if maxStep < skip {
			skip = 0
		}
		sums := map[string]time.Duration{}
		counts := map[string]int{}
		for _, e := range evs {
			if e.Step < skip {
				continue
			}
			sums[e.Kind] += time.Duration(e.EndNS - e.StartNS)
			counts[e.Kind]++
		}
		mean := func(k string) time.Duration {
			if counts[k] == 0 {
				return 0
			}
			return sums[k] / time.Duration(counts[k])
		}
		out[s] = ActionCosts{F: mean(Forward), B: mean(Backward), I: mean(Input), W: mean(Weight)}
		if out[s].B == 0 && out[s].I > 0 {
			out[s].B = out[s].I + out[s].W
		}
	}
	return out
}
