package schedule

import "fmt"

// Check verifies that the schedule is one the trainer can run: one list per
// stage; every (stage, kind, micro-batch) exactly once and on its own stage's
// list; indices in range; a backward after the forward of the same
// micro-batch on that stage; and no deadlock, found by simulating with unit
// costs. The error names the first offending action, so a user can fix a
// hand-written schedule without reading the simulator.
//
// Per-action problems (wrong list, out of range, duplicates) are reported
// before missing actions, scanning stages and positions in order, because a
// misplaced action otherwise shows up first as "missing" on its own stage,
// which hides the real mistake.
func (s *Schedule) Check() error {
	if err := s.validate(); err != nil {
		return err
	}
	_, err := simulate(s, UniformCosts(s.Stages, 1, 1, 0))
	return err
}

// validate is Check without the deadlock search; Simulate runs it first so
// that the simulator may assume a well-formed schedule.
func (s *Schedule) validate() error {
	if err := checkSize(s.Stages, s.MicroBatches); err != nil {
		return err
	}
	p, m := s.Stages, s.MicroBatches
	if len(s.Actions) != p {
		return fmt.Errorf("schedule has %d stage lists, want %d", len(s.Actions), p)
	}
	// pos[s][kind][i] is the position of that action on stage s's list, -1 if absent.
	pos := make([][2][]int, p)
	for st := range pos {
		for k := range pos[st] {
			pos[st][k] = make([]int, m)
			for i := range pos[st][k] {
				pos[st][k][i] = -1
			}
		}
	}
	for st, list := range s.Actions {
		for j, a := range list {
			bad := func(why string, args ...any) error {
				return fmt.Errorf("stage %d: action %v at position %d: %s", st, a, j, fmt.Sprintf(why, args...))
			}
			switch {
			case a.Kind != Forward && a.Kind != Backward:
				return bad("unknown kind %d", uint8(a.Kind))
			case a.Stage < 0 || a.Stage >= p:
				return bad("stage %d out of range [0, %d)", a.Stage, p)
			case a.Stage != st:
				return bad("belongs on stage %d's list", a.Stage)
			case a.MicroBatch < 0 || a.MicroBatch >= m:
				return bad("micro-batch %d out of range [0, %d)", a.MicroBatch, m)
			case a.Chunk != 0:
				return bad("chunk %d not supported (must be 0)", a.Chunk)
			}
			if first := pos[st][a.Kind][a.MicroBatch]; first >= 0 {
				return fmt.Errorf("stage %d: action %v appears twice (positions %d and %d)", st, a, first, j)
			}
			pos[st][a.Kind][a.MicroBatch] = j
		}
	}
	for st := range p {
		for k := range pos[st] {
			for i, j := range pos[st][k] {
				if j < 0 {
					return fmt.Errorf("stage %d: missing action %v", st, Action{Stage: st, Kind: Kind(k), MicroBatch: i})
				}
			}
		}
	}
	for st, list := range s.Actions {
		for j, a := range list {
			if f := pos[st][Forward][a.MicroBatch]; a.Kind == Backward && f > j {
				fa := Action{Stage: st, Kind: Forward, MicroBatch: a.MicroBatch}
				return fmt.Errorf("stage %d: action %v at position %d comes before %v at position %d", st, a, j, fa, f)
			}
		}
	}
	return nil
}

// PeakInFlight returns, per stage, the largest number of micro-batches whose
// forward is done and backward is not: the activations that stage must keep
// in memory at once. It depends only on each stage's order, not on timing.
// For a schedule that fails Check the numbers are not meaningful.
func (s *Schedule) PeakInFlight() []int {
	out := make([]int, len(s.Actions))
	for st, list := range s.Actions {
		n := 0
		for _, a := range list {
			if a.Kind == Forward {
				n++
			} else {
				n--
			}
			out[st] = max(out[st], n)
		}
	}
	return out
}
