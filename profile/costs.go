package profile

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

// ActionCosts are a stage's mean action durations: what the schedule simulator
// needs to replay a run. Kinds the run did not execute are zero. Chunks, for
// a stage of several chunks, are each chunk's own means: chunks need not
// hold equal shares of a stage's work (under a V, stage 0's two chunks are
// the model's first and last). F is the forwards' whole spans, the time
// they waited for their data included (Event.DataWaitNS): the simulator
// charges a stage's exposed reads as part of its forwards.
//
// Gap is the stage's mean hand-off: from the end of one of its actions to
// the start of its next in the same step, less the time that next one
// waited for its input. It is what the stage spends between actions
// (logging one, starting the next) on top of what the schedule makes it
// wait; the simulator charges it as idle time (schedule.Costs.Gap).
type ActionCosts struct {
	F, B, I, W time.Duration
	Chunks     []ActionCosts
	Gap        time.Duration
}

// MeanCosts averages each stage's action durations by kind over the steps after
// the first skip (when there are more), and each chunk's when a stage ran
// several.
func MeanCosts(events [][]Event, skip int) []ActionCosts {
	out := make([]ActionCosts, len(events))
	for s, evs := range events {
		maxStep := -1
		chunks := 1
		for _, e := range evs {
			maxStep = max(maxStep, e.Step)
			chunks = max(chunks, e.Chunk+1)
		}
		if maxStep < skip {
			skip = 0
		}
		out[s] = meanCosts(evs, skip, -1)
		out[s].Gap = meanGap(evs, skip)
		if chunks > 1 {
			for c := range chunks {
				out[s].Chunks = append(out[s].Chunks, meanCosts(evs, skip, c))
			}
		}
	}
	return out
}

// meanGap is the mean hand-off between consecutive actions of one step in
// evs, from step skip on (see ActionCosts.Gap); 0 without two in a step.
func meanGap(evs []Event, skip int) time.Duration {
	bySteps := map[int][]Event{}
	for _, e := range evs {
		if e.Step >= skip && compute(e.Kind) {
			bySteps[e.Step] = append(bySteps[e.Step], e)
		}
	}
	var sum time.Duration
	n := 0
	for _, step := range bySteps {
		slices.SortFunc(step, func(a, b Event) int { return cmp.Compare(a.StartNS, b.StartNS) })
		for i := 1; i < len(step); i++ {
			sum += max(0, time.Duration(step[i].StartNS-step[i].WaitNS-step[i-1].EndNS))
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

// meanCosts averages evs' durations by kind from step skip on, those of
// chunk only (every chunk's with chunk < 0).
func meanCosts(evs []Event, skip, chunk int) ActionCosts {
	sums := map[string]time.Duration{}
	counts := map[string]int{}
	for _, e := range evs {
		if e.Step < skip || chunk >= 0 && e.Chunk != chunk {
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
	out := ActionCosts{F: mean(Forward), B: mean(Backward), I: mean(Input), W: mean(Weight)}
	if out.B == 0 && out.I > 0 {
		out.B = out.I + out.W
	}
	return out
}

// Variation is how a run's actions varied about their means, step by step,
// for every step from skip on that each stage logged (schedule.StepVariation):
// per stage, its actions of the schedule in the order they ran, each one's
// duration over the mean of its kind and chunk over the same steps. Stages
// whose actions all took the same time give only ones.
func Variation(events [][]Event, skip int) []schedule.StepVariation {
	type key struct {
		kind  string
		chunk int
	}
	byStage := make([]map[int][]float64, len(events)) // step -> factors
	for s, evs := range events {
		sums, counts := map[key]time.Duration{}, map[key]int{}
		bySteps := map[int][]Event{}
		for _, e := range evs {
			if e.Step >= skip && compute(e.Kind) {
				k := key{e.Kind, e.Chunk}
				sums[k] += time.Duration(e.EndNS - e.StartNS)
				counts[k]++
				bySteps[e.Step] = append(bySteps[e.Step], e)
			}
		}
		byStage[s] = map[int][]float64{}
		for step, evs := range bySteps {
			slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.StartNS, b.StartNS) })
			factors := make([]float64, len(evs))
			for i, e := range evs {
				factors[i] = 1
				if k := (key{e.Kind, e.Chunk}); sums[k] > 0 {
					factors[i] = float64(e.EndNS-e.StartNS) * float64(counts[k]) / float64(sums[k])
				}
			}
			byStage[s][step] = factors
		}
	}
	var out []schedule.StepVariation
	if len(byStage) == 0 {
		return nil
	}
	for _, step := range slices.Sorted(maps.Keys(byStage[0])) {
		v := make(schedule.StepVariation, len(events))
		every := true
		for s := range byStage {
			v[s], every = byStage[s][step], every && byStage[s][step] != nil
		}
		if every {
			out = append(out, v)
		}
	}
	return out
}

// ScheduleCosts turns a run's mean action costs into the simulator's per-stage
// costs in ms. An action of an interleaved run is one chunk's, and the simulator
// charges a chunk 1/chunks of its stage's cost, so durations scale by chunks;
// where every stage has its chunks' own means, they are the simulator's
// per-chunk costs (Costs.Chunks) instead. A run
// without split backwards leaves I and W to the simulator's default (half of B each).
func ScheduleCosts(means []ActionCosts, chunks int, transferMS float64) schedule.Costs {
	v := float64(max(chunks, 1))
	p := len(means)
	c := schedule.Costs{F: make([]float64, p), B: make([]float64, p), Transfer: transferMS}
	split := true
	for _, m := range means {
		split = split && m.I > 0 && m.W > 0
	}
	if split {
		c.I, c.W = make([]float64, p), make([]float64, p)
	}
	ms := func(d time.Duration) float64 { return v * float64(d) / 1e6 }
	for s, m := range means {
		c.F[s], c.B[s] = ms(m.F), ms(m.B)
		if split {
			c.I[s], c.W[s] = ms(m.I), ms(m.W)
			c.B[s] = c.I[s] + c.W[s]
		}
	}
	if slices.ContainsFunc(means, func(m ActionCosts) bool { return m.Gap > 0 }) {
		c.Gap = make([]float64, p)
		for s, m := range means {
			c.Gap[s] = float64(m.Gap) / 1e6
		}
	}
	if chunks > 1 && !slices.ContainsFunc(means, func(m ActionCosts) bool { return len(m.Chunks) != chunks }) {
		c.Chunks = make([][]schedule.ChunkCost, p)
		own := func(d time.Duration) float64 { return float64(d) / 1e6 }
		for s, m := range means {
			for _, x := range m.Chunks {
				cc := schedule.ChunkCost{F: own(x.F), B: own(x.B), I: own(x.I), W: own(x.W)}
				if cc.I == 0 && cc.W == 0 {
					cc.I, cc.W = cc.B/2, cc.B/2
				}
				c.Chunks[s] = append(c.Chunks[s], cc)
			}
		}
	}
	return c
}

// MeanTransfer is the mean delay of the timed messages over all links and both
// directions: the transfer cost to simulate this run with. ok is false when no
// message was timed.
func (r *Report) MeanTransfer() (d time.Duration, ok bool) {
	var sum time.Duration
	n := 0
	for _, l := range r.Links {
		for _, t := range []LinkTraffic{l.Down, l.Up} {
			sum += t.MeanDelay * time.Duration(t.Timed)
			n += t.Timed
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / time.Duration(n), true
}
