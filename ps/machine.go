package ps

import (
	"fmt"
	"slices"
)

// Rule is how a server combines the workers' pushes.
type Rule struct {
	// Workers is the number of workers (data_parallel).
	Workers int
	// Aggregate is how many workers' pushes of a step the step's update
	// sums (backup workers); 0 or Workers: every worker's.
	Aggregate int
}

func (r Rule) needed() int {
	if r.Aggregate > 0 && r.Aggregate < r.Workers {
		return r.Aggregate
	}
	return r.Workers
}

// Update is one optimizer step a Machine decided: the gradients of step
// Step from Workers, summed in worker order (worker 0's first), whatever
// order they arrived in, so the sum's bits depend on who, not on when.
type Update struct {
	Step    int64
	Workers []int
}

// Machine is a server's aggregation logic for one group of tensors (those
// of one pipeline stage): a state machine fed the workers' pushes, in the
// order they arrive, that says which pushes make each update and which
// are dropped. It does no I/O and keeps no gradients; the Server does.
//
// Sync with every worker: update t sums every worker's push of step t.
// With Aggregate N < Workers (backup workers), update t sums the first N
// pushes of step t to arrive; a push of step t arriving after update t
// was made is dropped. Pushing step t needs the weights of update t-1,
// so a push of a step beyond the next update is the worker's error.
type Machine struct {
	rule    Rule
	version int64 // updates made so far: the step the next update is for
	arrived []int // workers whose push of step version is in, in arrival order
	dropped []int64
}

// NewMachine starts a group at version (the updates already applied: 0,
// or the step a run resumes from).
func NewMachine(r Rule, version int64) (*Machine, error) {
	if r.Workers < 1 || r.Aggregate < 0 || r.Aggregate > r.Workers {
		return nil, fmt.Errorf("ps: %d of %d workers per update", r.Aggregate, r.Workers)
	}
	return &Machine{rule: r, version: version, dropped: make([]int64, r.Workers)}, nil
}

// Version is the number of updates made: the weights a pull returns are
// those after update Version-1.
func (m *Machine) Version() int64 { return m.version }

// Dropped is how many of worker w's pushes were dropped.
func (m *Machine) Dropped(w int) int64 { return m.dropped[w] }

// Pullable reports whether a worker about to compute step may pull: the
// update of every earlier step is made.
func (m *Machine) Pullable(step int64) bool { return m.version >= step }

// Push feeds worker w's push of step's gradient. It returns the update the
// push completes (nil: none yet), or dropped when the push came after its
// step's update.
func (m *Machine) Push(w int, step int64) (up *Update, dropped bool, err error) {
	if w < 0 || w >= m.rule.Workers {
		return nil, false, fmt.Errorf("ps: push from worker %d; the workers are 0-%d", w, m.rule.Workers-1)
	}
	switch {
	case step < m.version:
		m.dropped[w]++
		return nil, true, nil
	case step > m.version:
		return nil, false, fmt.Errorf("ps: worker %d pushed step %d before update %d was made, whose weights that step needs", w, step+1, m.version+1)
	case slices.Contains(m.arrived, w):
		return nil, false, fmt.Errorf("ps: worker %d pushed step %d twice", w, step+1)
	}
	m.arrived = append(m.arrived, w)
	if len(m.arrived) < m.rule.needed() {
		return nil, false, nil
	}
	up = &Update{Step: step, Workers: slices.Sorted(slices.Values(m.arrived))}
	m.arrived = m.arrived[:0]
	m.version++
	return up, false, nil
}
