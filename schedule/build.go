package schedule

import (
	"fmt"
	"strings"
)

// Schedule is the work of one training step: Actions[s] is stage s's list of
// actions in execution order. It is plain data so that it can be printed
// (Grid), read back (ParseGrid), checked (Check) and simulated (Simulate) the
// same way whether it came from Build or from a user's file.
type Schedule struct {
	Name         string
	Stages       int
	MicroBatches int
	Actions      [][]Action
}

// builtin describes one named schedule: how to build a stage's list and its
// closed-form bubble, kept side by side so the two cannot drift apart silently
// (the tests compare them against the simulator).
type builtin struct {
	name   string
	stage  func(s, p, m int) []Action
	bubble func(p, m int) float64
}

// builtins is ordered; Names reports this order.
var builtins = []builtin{
	{"gpipe", gpipeStage, fillDrainBubble},
	{"1f1b", oneFOneBStage, fillDrainBubble},
}

func lookup(name string) (builtin, bool) {
	for _, b := range builtins {
		if b.name == name {
			return b, true
		}
	}
	return builtin{}, false
}

// Names lists the built-in schedule names, in a stable order.
func Names() []string {
	out := make([]string, len(builtins))
	for i, b := range builtins {
		out[i] = b.name
	}
	return out
}

// Build returns the named schedule for the given number of stages and
// micro-batches per step.
//
// gpipe: every stage runs all forwards then all backwards (F0..F(m-1),
// B0..B(m-1)); simple, but each stage stashes activations for all m
// micro-batches.
//
// 1f1b (PipeDream-Flush): stage s runs min(p-s-1, m) warm-up forwards, then
// alternates one forward and one backward while forwards remain, then drains
// the remaining backwards. Same bubble as gpipe, but stage s stashes at most
// min(p-s, m) activations.
func Build(name string, stages, microBatches int) (*Schedule, error) {
	b, ok := lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown schedule %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if err := checkSize(stages, microBatches); err != nil {
		return nil, err
	}
	s := &Schedule{Name: name, Stages: stages, MicroBatches: microBatches, Actions: make([][]Action, stages)}
	for st := range stages {
		s.Actions[st] = b.stage(st, stages, microBatches)
	}
	return s, nil
}

func checkSize(stages, microBatches int) error {
	if stages < 1 {
		return fmt.Errorf("stages must be >= 1, got %d", stages)
	}
	if microBatches < 1 {
		return fmt.Errorf("micro-batches must be >= 1, got %d", microBatches)
	}
	return nil
}

func gpipeStage(s, p, m int) []Action {
	out := make([]Action, 0, 2*m)
	for i := range m {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: i})
	}
	for i := range m {
		out = append(out, Action{Stage: s, Kind: Backward, MicroBatch: i})
	}
	return out
}

func oneFOneBStage(s, p, m int) []Action {
	out := make([]Action, 0, 2*m)
	f, b := 0, 0 // next forward / backward micro-batch
	for f < min(p-s-1, m) {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: f})
		f++
	}
	for f < m {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: f})
		out = append(out, Action{Stage: s, Kind: Backward, MicroBatch: b})
		f++
		b++
	}
	for b < m {
		out = append(out, Action{Stage: s, Kind: Backward, MicroBatch: b})
		b++
	}
	return out
}

// fillDrainBubble is the idle fraction of a schedule that fills and drains the
// pipeline once per step with equal per-stage costs: each stage is busy for
// m*(f+b) out of (m+p-1)*(f+b).
func fillDrainBubble(p, m int) float64 {
	return float64(p-1) / float64(m+p-1)
}

// TheoreticalBubble returns the closed-form idle fraction of each stage for the
// named schedule (equal per-stage costs, free transfers). ok is false for an
// unknown name or a non-positive size.
func TheoreticalBubble(name string, stages, microBatches int) (frac float64, ok bool) {
	b, ok := lookup(name)
	if !ok || checkSize(stages, microBatches) != nil {
		return 0, false
	}
	return b.bubble(stages, microBatches), true
}
