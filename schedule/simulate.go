package schedule

import (
	"fmt"
	"math"
	"strings"
)

// Costs gives the simulator the duration of each action, per stage (F[s] and
// B[s], any unit), and the transfer cost added between the end of a sending
// action and the message becoming available on the neighbouring stage.
type Costs struct {
	F, B     []float64 // len == Stages
	Transfer float64
}

// UniformCosts returns Costs with the same forward and backward duration on
// every stage.
func UniformCosts(stages int, f, b, transfer float64) Costs {
	c := Costs{F: make([]float64, stages), B: make([]float64, stages), Transfer: transfer}
	for s := range stages {
		c.F[s], c.B[s] = f, b
	}
	return c
}

// Span is one action's execution interval in a Timeline.
type Span struct {
	Action     Action
	Start, End float64
}

// Timeline is the result of simulating one training step.
type Timeline struct {
	Makespan     float64
	Spans        [][]Span  // per stage, in execution order
	Busy         []float64 // per stage, sum of span durations
	Bubble       []float64 // per stage, 1 - Busy/Makespan (0 when Makespan is 0)
	PeakInFlight []int     // per stage, as Schedule.PeakInFlight
}

// Simulate plays the schedule: each stage runs its list in order, and an
// action starts when its stage is free and its input is available (the
// sender's end plus Costs.Transfer for a remote input; the stage's own forward
// for a backward). It first checks the schedule's structure and returns the
// same errors as Check, including on deadlock.
func Simulate(s *Schedule, c Costs) (*Timeline, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if len(c.F) != s.Stages || len(c.B) != s.Stages {
		return nil, fmt.Errorf("costs have %d forward and %d backward entries, want %d each", len(c.F), len(c.B), s.Stages)
	}
	for st := range s.Stages {
		if !nonNegative(c.F[st]) || !nonNegative(c.B[st]) {
			return nil, fmt.Errorf("stage %d: costs must be finite and >= 0, got F=%v B=%v", st, c.F[st], c.B[st])
		}
	}
	if !nonNegative(c.Transfer) {
		return nil, fmt.Errorf("transfer cost must be finite and >= 0, got %v", c.Transfer)
	}
	return simulate(s, c)
}

func nonNegative(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }

// simulate assumes a validated schedule and valid costs.
//
// Stages share nothing and sends never block, so an action's start time is
// determined solely by its stage's previous action and the actions it depends
// on. Rather than keep an event queue, we therefore sweep the stages
// repeatedly, running every action whose dependencies have finished, until
// nothing moves; this yields exactly the times of a discrete-event simulation
// and is trivially deterministic. If actions remain when nothing moves, every
// remaining stage is blocked on a dependency that will never finish: a
// deadlock.
func simulate(s *Schedule, c Costs) (*Timeline, error) {
	p, m := s.Stages, s.MicroBatches
	// end[kind][stage][mb] is the finishing time, or -1 while not yet run.
	var end [2][][]float64
	for k := range end {
		end[k] = make([][]float64, p)
		for st := range p {
			end[k][st] = make([]float64, m)
			for i := range m {
				end[k][st][i] = -1
			}
		}
	}
	done := func(a Action) (float64, bool) {
		e := end[a.Kind][a.Stage][a.MicroBatch]
		return e, e >= 0
	}
	// ready returns when a's inputs are available, or the first dependency
	// that has not run yet.
	ready := func(a Action) (float64, Action, bool) {
		t := 0.0
		if a.Kind == Backward {
			f := Action{Stage: a.Stage, Kind: Forward, MicroBatch: a.MicroBatch}
			e, ok := done(f)
			if !ok {
				return 0, f, false
			}
			t = e
		}
		if src := a.RecvFrom(p); src >= 0 {
			dep := Action{Stage: src, Kind: a.Kind, MicroBatch: a.MicroBatch}
			e, ok := done(dep)
			if !ok {
				return 0, dep, false
			}
			t = max(t, e+c.Transfer)
		}
		return t, Action{}, true
	}

	tl := &Timeline{
		Spans:        make([][]Span, p),
		Busy:         make([]float64, p),
		Bubble:       make([]float64, p),
		PeakInFlight: s.PeakInFlight(),
	}
	free := make([]float64, p) // when each stage finishes its last action
	for moved := true; moved; {
		moved = false
		for st := range p {
			for n := len(tl.Spans[st]); n < len(s.Actions[st]); n++ {
				a := s.Actions[st][n]
				t, _, ok := ready(a)
				if !ok {
					break
				}
				d := c.F[st]
				if a.Kind == Backward {
					d = c.B[st]
				}
				start := max(free[st], t)
				free[st] = start + d
				end[a.Kind][st][a.MicroBatch] = free[st]
				tl.Spans[st] = append(tl.Spans[st], Span{Action: a, Start: start, End: free[st]})
				tl.Busy[st] += d
				moved = true
			}
		}
	}

	var waits []string
	for st := range p {
		if n := len(tl.Spans[st]); n < len(s.Actions[st]) {
			a := s.Actions[st][n]
			_, dep, _ := ready(a)
			waits = append(waits, fmt.Sprintf("stage %d waits at %v for %v", st, a, dep))
		}
	}
	if len(waits) > 0 {
		return nil, fmt.Errorf("deadlock: %s", strings.Join(waits, "; "))
	}

	for st := range p {
		tl.Makespan = max(tl.Makespan, free[st])
	}
	for st := range p {
		if tl.Makespan > 0 {
			tl.Bubble[st] = 1 - tl.Busy[st]/tl.Makespan
		}
	}
	return tl, nil
}
