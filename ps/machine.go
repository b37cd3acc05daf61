package ps

import (
	"fmt"
	"slices"
)

// Rule is how a server combines the workers' pushes.
type Rule struct {
	// Workers is the number of workers (data_parallel).
	Workers int
	// Aggregate is how many workers' pushes of a step a sync update sums
	// (backup workers); 0 or Workers: every worker's.
	Aggregate int
	// Async applies pushes as they arrive, each worker's weights lagging
	// at most MaxStaleness updates (see Machine).
	Async        bool
	MaxStaleness int
}

func (r Rule) needed() int {
	if r.Aggregate > 0 && r.Aggregate < r.Workers {
		return r.Aggregate
	}
	return r.Workers
}

// Update is one optimizer step a Machine decided: the gradients Workers
// pushed, summed in worker order (worker 0's first), whatever order they
// arrived in, so the sum's bits depend on who, not on when. Step is the
// step they were pushed for (the newest, in async mode), which picks the
// learning rate; Staleness is, per worker, how many updates were made
// between the weights it computed with and this one.
type Update struct {
	Step      int64
	Workers   []int
	Staleness []int64
}

// Machine is a server's aggregation logic for one group of tensors (those
// of one pipeline stage): a state machine fed the workers' pushes and
// pulls, in the order they happen, that says which pushes make each
// update and which are dropped. It does no I/O and keeps no gradients;
// the Server does.
//
// Sync with every worker: update t sums every worker's push of step t.
// With Aggregate N < Workers (backup workers), update t sums the first N
// pushes of step t to arrive; a push of step t arriving after update t
// was made is dropped. Pushing step t needs the weights of update t-1,
// so a push of a step beyond the next update is the worker's error.
//
// Async with MaxStaleness k: a push is applied on arrival, as an update
// of its own, unless the update would leave a worker still computing
// (one that has not pushed since its last pull) more than k updates
// behind; then it waits, and every push that waits is applied with the
// next push that makes the update possible, summed in worker order, in
// one update. A worker pulls once its own push is applied. So with k = 0
// each update sums every worker's push of one step: sync, bit for bit;
// with k > 0 a fast worker runs up to k updates ahead of a slow one.
type Machine struct {
	rule    Rule
	version int64 // updates made so far
	arrived []int // sync: workers whose push of step version is in, in arrival order
	dropped []int64
	// Async: each worker's pending push (its step, -1: none), the
	// version it last pulled, and whether it has left.
	pending []int64
	pulled  []int64
	left    []bool
}

// NewMachine starts a group at version (the updates already applied: 0,
// or the step a run resumes from).
func NewMachine(r Rule, version int64) (*Machine, error) {
	if r.Workers < 1 || r.Aggregate < 0 || r.Aggregate > r.Workers || r.MaxStaleness < 0 || (r.Async && r.Aggregate != 0) {
		return nil, fmt.Errorf("ps: rule %+v", r)
	}
	m := &Machine{rule: r, version: version, dropped: make([]int64, r.Workers),
		pending: make([]int64, r.Workers), pulled: make([]int64, r.Workers), left: make([]bool, r.Workers)}
	for w := range m.pending {
		m.pending[w], m.pulled[w] = -1, version
	}
	return m, nil
}

// Version is the number of updates made: the weights a pull returns are
// those after update Version-1.
func (m *Machine) Version() int64 { return m.version }

// Dropped is how many of worker w's pushes were dropped.
func (m *Machine) Dropped(w int) int64 { return m.dropped[w] }

// Pullable reports whether worker w, about to compute step, may pull:
// in sync mode once the update of every earlier step is made, in async
// mode once its own push is applied.
func (m *Machine) Pullable(w int, step int64) bool {
	if m.rule.Async {
		return m.pending[w] < 0
	}
	return m.version >= step
}

// Done reports whether every worker has left with its pushes applied:
// the weights are final.
func (m *Machine) Done() bool {
	for w, left := range m.left {
		if !left || m.pending[w] >= 0 {
			return false
		}
	}
	return true
}

// Pulled records that worker w pulled the current weights.
func (m *Machine) Pulled(w int) { m.pulled[w] = m.version }

// Push feeds worker w's push of step's gradient. It returns the update the
// push completes (nil: none yet), or dropped when the push came after its
// step's update.
func (m *Machine) Push(w int, step int64) (up *Update, dropped bool, err error) {
	if w < 0 || w >= m.rule.Workers {
		return nil, false, fmt.Errorf("ps: push from worker %d; the workers are 0-%d", w, m.rule.Workers-1)
	}
	if m.rule.Async {
		up, err = m.pushAsync(w, step)
		return up, false, err
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
	up.Staleness = make([]int64, len(up.Workers))
	m.arrived = m.arrived[:0]
	m.version++
	return up, false, nil
}

func (m *Machine) pushAsync(w int, step int64) (*Update, error) {
	switch {
	case m.left[w]:
		return nil, fmt.Errorf("ps: worker %d pushed step %d after leaving", w, step+1)
	case m.pending[w] >= 0:
		return nil, fmt.Errorf("ps: worker %d pushed step %d while its push of step %d waits: it must pull in between", w, step+1, m.pending[w]+1)
	}
	m.pending[w] = step
	return m.tryUpdate(), nil
}

// Leave records that worker w is done (or gone): the others no longer
// wait for it. It returns the update its leaving makes possible, if any.
func (m *Machine) Leave(w int) *Update {
	if w < 0 || w >= m.rule.Workers || m.left[w] {
		return nil
	}
	m.left[w] = true
	if !m.rule.Async {
		return nil
	}
	return m.tryUpdate()
}

// tryUpdate makes the update of every waiting push, if it leaves no
// computing worker more than MaxStaleness updates behind.
func (m *Machine) tryUpdate() *Update {
	up := &Update{Step: -1}
	for w, step := range m.pending {
		switch {
		case step >= 0:
			up.Workers = append(up.Workers, w)
			up.Staleness = append(up.Staleness, m.version-m.pulled[w])
			up.Step = max(up.Step, step)
		case !m.left[w] && m.version+1-m.pulled[w] > int64(m.rule.MaxStaleness):
			return nil // w computes on weights the update would leave too stale
		}
	}
	if len(up.Workers) == 0 {
		return nil
	}
	for _, w := range up.Workers {
		m.pending[w] = -1
	}
	m.version++
	return up
}
