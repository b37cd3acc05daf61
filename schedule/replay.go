package schedule

import (
	"fmt"
	"math"
)

// StepVariation is how one step's actions varied about their costs, as a run
// measured them: for each stage, one factor per action of the stage's list,
// in order (the action's duration over the mean of its kind and chunk). A
// nil list means the stage's actions took exactly their costs.
type StepVariation [][]float64

// Replayed is what Replay found over its steps.
type Replayed struct {
	Steps    int
	Makespan float64   // mean over the steps
	Busy     []float64 // per stage, mean over the steps
	// Bubble is per stage 1 - total busy / total makespan over the steps:
	// a stage's idle share of the steps' summed windows, as a profile
	// measures a run's.
	Bubble []float64
}

// Replay plays the schedule under c once for each of steps, every action's
// cost scaled by its factor in that step. Simulate's timeline assumes each
// action takes exactly its mean cost; but a stage waiting on a neighbour
// waits for the slower of two varying actions, not the mean of either, so a
// run's bubble exceeds that timeline's, the more so the more hand-offs
// between stages a schedule has. Played with a run's own steps, the
// schedule shows the bubble those action times give, and what the run
// measured beyond it is the runtime's own. Steps keep their stages
// together: a slowdown that struck every stage at once in the run (the
// machine busy with something else) strikes them at once here.
func Replay(s *Schedule, c Costs, steps []StepVariation) (*Replayed, error) {
	x, err := s.validate()
	if err != nil {
		return nil, err
	}
	if err := c.check(s.Stages, s.Chunks); err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("replay: no steps")
	}
	for k, v := range steps {
		if err := v.check(s); err != nil {
			return nil, fmt.Errorf("replay step %d: %w", k, err)
		}
	}
	p := s.Stages
	out := &Replayed{Steps: len(steps), Busy: make([]float64, p), Bubble: make([]float64, p)}
	var span float64
	for _, v := range steps {
		scale := func(a Action) float64 {
			if a.Stage >= len(v) || v[a.Stage] == nil {
				return 1
			}
			return v[a.Stage][x.at(a)]
		}
		tl, err := simulate(s, x, c, scale)
		if err != nil {
			return nil, err
		}
		span += tl.Makespan
		for st, b := range tl.Busy {
			out.Busy[st] += b
		}
	}
	n := float64(len(steps))
	out.Makespan = span / n
	for st := range out.Busy {
		if span > 0 {
			out.Bubble[st] = 1 - out.Busy[st]/span
		}
		out.Busy[st] /= n
	}
	return out, nil
}

// check verifies v for s: at most one list per stage, each one factor per
// action of its stage, every factor finite and >= 0.
func (v StepVariation) check(s *Schedule) error {
	if len(v) > s.Stages {
		return fmt.Errorf("variation for %d stages, the schedule has %d", len(v), s.Stages)
	}
	for st, f := range v {
		if f == nil {
			continue
		}
		if len(f) != len(s.Actions[st]) {
			return fmt.Errorf("stage %d: %d factors, want one per action, %d", st, len(f), len(s.Actions[st]))
		}
		for j, x := range f {
			if !(x >= 0) || math.IsInf(x, 1) {
				return fmt.Errorf("stage %d, action %d (%v): factor must be finite and >= 0, got %v", st, j, s.Actions[st][j], x)
			}
		}
	}
	return nil
}
