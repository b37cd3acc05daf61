package schedule

import "fmt"

// Check verifies that the schedule is one the trainer can run: one list per
// stage; indices in range; for every (stage, chunk, micro-batch) a forward and
// either a full backward (B) or both an input-gradient (I) and a weight (W)
// pass, each exactly once and on its own stage's list, never B together with
// I or W; a backward or input-gradient pass after the forward of the same
// micro-batch and chunk, a weight pass after its input-gradient pass; a
// recomputation (RF) for every micro-batch of a chunk or for none (a chunk
// either keeps its activations or recomputes them), each after its forward
// and before its B or I; and no deadlock, found by simulating with unit costs. The error names the first
// offending action, so a user can fix a hand-written schedule without reading
// the simulator.
//
// Per-action problems (wrong list, out of range, duplicates, B mixed with I
// or W) are reported before missing actions, scanning stages and positions in
// order, because a misplaced action otherwise shows up first as "missing" on
// its own stage, which hides the real mistake.
func (s *Schedule) Check() error {
	x, err := s.validate()
	if err != nil {
		return err
	}
	_, err = simulate(s, x, UniformCosts(s.Stages, 1, 1, 0), nil)
	return err
}

// index records where each possible action sits on its stage's list.
type index struct {
	p, m, v int
	t       Topology
	pos     []int // position on the stage's list, -1 if absent; see slot
}

func newIndex(t Topology, m int) *index {
	p, v := t.Stages, t.Chunks
	x := &index{p: p, m: m, v: v, t: t, pos: make([]int, int(numKinds)*p*v*m)}
	for i := range x.pos {
		x.pos[i] = -1
	}
	return x
}

// slot is a's offset in pos; a must be in range.
func (x *index) slot(a Action) int {
	return ((int(a.Kind)*x.p+a.Stage)*x.v+a.Chunk)*x.m + a.MicroBatch
}

func (x *index) at(a Action) int { return x.pos[x.slot(a)] }

// gradient returns the action at model stage ms that produces micro-batch a's
// input gradient there: the full backward or, where the backward is split,
// the input-gradient pass.
func (x *index) gradient(a Action, ms int) Action {
	g := x.t.on(a, Backward, ms)
	if x.at(g) < 0 {
		g.Kind = Input
	}
	return g
}

// validate is Check without the deadlock search; Simulate runs it first so
// that the simulator may assume a well-formed schedule.
func (s *Schedule) validate() (*index, error) {
	if err := checkSize(s.Stages, s.MicroBatches, s.Chunks); err != nil {
		return nil, err
	}
	p, m, v := s.Stages, s.MicroBatches, s.Chunks
	if len(s.Actions) != p {
		return nil, fmt.Errorf("schedule has %d stage lists, want %d", len(s.Actions), p)
	}
	if s.Placement >= numPlacements {
		return nil, fmt.Errorf("unknown placement %v", s.Placement)
	}
	x := newIndex(s.Topology(), m)
	for st, list := range s.Actions {
		for j, a := range list {
			bad := func(why string, args ...any) error {
				return fmt.Errorf("stage %d: action %v at position %d: %s", st, a, j, fmt.Sprintf(why, args...))
			}
			switch {
			case a.Kind >= numKinds:
				return nil, bad("unknown kind %d", uint8(a.Kind))
			case a.Stage < 0 || a.Stage >= p:
				return nil, bad("stage %d out of range [0, %d)", a.Stage, p)
			case a.Stage != st:
				return nil, bad("belongs on stage %d's list", a.Stage)
			case a.MicroBatch < 0 || a.MicroBatch >= m:
				return nil, bad("micro-batch %d out of range [0, %d)", a.MicroBatch, m)
			case a.Chunk < 0 || a.Chunk >= v:
				return nil, bad("chunk %d out of range [0, %d)", a.Chunk, v)
			}
			if first := x.at(a); first >= 0 {
				return nil, fmt.Errorf("stage %d: action %v appears twice (positions %d and %d)", st, a, first, j)
			}
			var excludes []Kind
			switch a.Kind {
			case Backward:
				excludes = []Kind{Input, Weight}
			case Input, Weight:
				excludes = []Kind{Backward}
			}
			for _, k := range excludes {
				o := a
				o.Kind = k
				if q := x.at(o); q >= 0 {
					return nil, bad("conflicts with %v at position %d (a backward is either B, or I and W)", o, q)
				}
			}
			x.pos[x.slot(a)] = j
		}
	}
	for st, list := range s.Actions {
		split := false // whether this stage splits any backward: decides what a missing one is called
		for _, a := range list {
			split = split || a.Kind == Input || a.Kind == Weight
		}
		missing := func(k Kind, c, i int) error {
			return fmt.Errorf("stage %d: missing action %v", st, Action{Stage: st, Kind: k, MicroBatch: i, Chunk: c})
		}
		for c := range v {
			for i := range m {
				if x.at(Action{Stage: st, Kind: Forward, MicroBatch: i, Chunk: c}) < 0 {
					return nil, missing(Forward, c, i)
				}
			}
		}
		for c := range v {
			recomputes := x.at(Action{Stage: st, Kind: Recompute, Chunk: c}) >= 0
			for i := range m {
				has := func(k Kind) bool { return x.at(Action{Stage: st, Kind: k, MicroBatch: i, Chunk: c}) >= 0 }
				if has(Recompute) != recomputes {
					a := Action{Stage: st, Kind: Recompute, MicroBatch: i, Chunk: c}
					if recomputes {
						return nil, fmt.Errorf("stage %d: missing action %v (chunk %d recomputes micro-batch 0, so it must recompute every one)", st, a, c)
					}
					return nil, fmt.Errorf("stage %d: action %v at position %d: chunk %d keeps micro-batch 0's activations, so it must keep every one's (recompute all or none)",
						st, a, x.at(a), c)
				}
				switch b, in, w := has(Backward), has(Input), has(Weight); {
				case b || in && w:
				case in:
					return nil, missing(Weight, c, i)
				case w || split:
					return nil, missing(Input, c, i)
				default:
					return nil, missing(Backward, c, i)
				}
			}
		}
	}
	for st, list := range s.Actions {
		for j, a := range list {
			need := a
			switch a.Kind {
			case Backward, Input:
				need.Kind = Forward
				if r := (Action{Stage: st, Kind: Recompute, MicroBatch: a.MicroBatch, Chunk: a.Chunk}); x.at(r) >= 0 {
					need = r
				}
			case Weight:
				need.Kind = Input
			case Recompute:
				need.Kind = Forward
			default:
				continue
			}
			if q := x.at(need); q > j {
				return nil, fmt.Errorf("stage %d: action %v at position %d comes before %v at position %d", st, a, j, need, q)
			}
		}
	}
	return x, nil
}

// PeakInFlight returns, per stage, the largest number of micro-batch chunks
// whose forward is done and whose activations are not yet released: the
// activations that stage must keep in memory at once. A full backward
// releases them; a split backward releases them only at the weight pass,
// since that still needs the stashed inputs. It depends only on each stage's
// order, not on timing. For a schedule that fails Check the numbers are not
// meaningful.
func (s *Schedule) PeakInFlight() []int {
	out := make([]int, len(s.Actions))
	for st, list := range s.Actions {
		n := 0
		for _, a := range list {
			switch a.Kind {
			case Forward:
				n++
			case Backward, Weight:
				n--
			}
			out[st] = max(out[st], n)
		}
	}
	return out
}
