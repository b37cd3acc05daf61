package ps

import (
	"errors"
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
// update and which are dropped, and when a pull may be answered. It does
// no I/O and keeps no gradients; the Server does.
//
// Sync with every worker: update t sums every worker's push of step t.
// With Aggregate N < Workers (backup workers), update t sums the first N
// pushes of step t to arrive; a push of step t arriving after update t
// was made is dropped. Pushing step t needs the weights of update t-1,
// so a push of a step beyond the next update is the worker's error.
//
// Async with MaxStaleness k (stale-synchronous parallel): each push is
// applied on arrival, as an update of its own, and a worker about to
// compute step s pulls once every worker still in the run has pushed
// its steps before s-k: its weights miss at most the last k steps of the
// others. With k = 0 no push may be applied to weights other than those
// it was computed from, so the pushes of a step wait for one another and
// are summed, in worker order, into one update: sync's, bit for bit. A
// worker that leaves (or whose stream is lost) is waited for no more,
// until it rejoins (Rejoin).
type Machine struct {
	rule    Rule
	version int64 // updates made so far
	arrived []int // sync: workers whose push of step version is in, in arrival order
	dropped []int64
	// Async: each worker's clock (the steps it has pushed), the version
	// it last pulled, whether it has left, and (k = 0) whether its push of
	// the step in progress waits for the others'.
	clock   []int64
	pulled  []int64
	left    []bool
	pending []bool
}

// NewMachine starts a group at version (the updates already applied: 0,
// or the step a run resumes from).
func NewMachine(r Rule, version int64) (*Machine, error) {
	if r.Workers < 1 || r.Aggregate < 0 || r.Aggregate > r.Workers || r.MaxStaleness < 0 || (r.Async && r.Aggregate != 0) {
		return nil, fmt.Errorf("ps: rule %+v", r)
	}
	m := &Machine{rule: r, version: version, dropped: make([]int64, r.Workers),
		clock: make([]int64, r.Workers), pulled: make([]int64, r.Workers), left: make([]bool, r.Workers), pending: make([]bool, r.Workers)}
	for w := range m.clock {
		m.clock[w], m.pulled[w] = version, version
	}
	return m, nil
}

// Version is the number of updates made: the weights a pull returns are
// those after update Version-1.
func (m *Machine) Version() int64 { return m.version }

// Dropped is how many of worker w's pushes were dropped.
func (m *Machine) Dropped(w int) int64 { return m.dropped[w] }

// Pullable reports whether worker w, about to compute step, may pull:
// in sync mode once the update of every earlier step is made; in async
// mode once every other worker still in the run has pushed its steps
// before step-MaxStaleness, and w's own are applied.
func (m *Machine) Pullable(w int, step int64) bool {
	if !m.rule.Async {
		return m.version >= step
	}
	if m.pending[w] {
		return false
	}
	for v, c := range m.clock {
		if v != w && !m.left[v] && c < step-int64(m.rule.MaxStaleness) {
			return false
		}
	}
	return true
}

// Done reports whether every worker has left with its pushes applied:
// the weights are final.
func (m *Machine) Done() bool {
	for w, left := range m.left {
		if !left || m.pending[w] {
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
	case m.pending[w]:
		return nil, fmt.Errorf("ps: worker %d pushed step %d while its push of step %d waits: it must pull in between", w, step+1, m.clock[w])
	}
	m.clock[w] = step + 1
	if m.rule.MaxStaleness > 0 {
		up := &Update{Step: step, Workers: []int{w}, Staleness: []int64{m.version - m.pulled[w]}}
		m.version++
		return up, nil
	}
	m.pending[w] = true
	return m.tryStep(), nil
}

// ErrOver is a rejoin refused because every worker has left with its
// pushes applied: the weights are final and the run's training is over.
var ErrOver = errors.New("every worker has left: the run's training is over")

// Left reports whether worker w has left (said goodbye, or was lost).
func (m *Machine) Left(w int) bool { return w >= 0 && w < m.rule.Workers && m.left[w] }

// Rejoin takes back worker w, which left (killed, or its stream lost),
// into an async run: its restarted processes compute from step on, from
// the weights they pull now. It counts as having pushed every step before
// step, so the others wait for its steps from step on only, as
// max_staleness says, and its first push's staleness is counted from the
// current version. Sync mode has no rejoin (every step waits for every
// worker, so none leaves while the run goes on), nor has max_staleness 0,
// whose updates sum every worker's push of one step: a worker rejoining
// behind the others would wait for their next step's pushes while they
// wait for its catching up.
func (m *Machine) Rejoin(w int, step int64) error {
	switch {
	case w < 0 || w >= m.rule.Workers:
		return fmt.Errorf("ps: rejoin of worker %d; the workers are 0-%d", w, m.rule.Workers-1)
	case !m.rule.Async:
		return fmt.Errorf("ps: worker %d cannot rejoin a sync run", w)
	case m.rule.MaxStaleness == 0:
		return fmt.Errorf("ps: worker %d cannot rejoin an async run with max_staleness 0, whose updates sum each step's pushes", w)
	case m.Done():
		return ErrOver
	case !m.left[w]:
		return fmt.Errorf("ps: worker %d is still in the run: a second process for it?", w)
	case step < 0:
		return fmt.Errorf("ps: worker %d rejoins at step %d", w, step+1)
	}
	m.left[w], m.pulled[w], m.clock[w] = false, m.version, step
	return nil
}

// Leave records that worker w is done (or gone): the others no longer
// wait for it. It returns the update its leaving makes possible, if any.
func (m *Machine) Leave(w int) *Update {
	if w < 0 || w >= m.rule.Workers || m.left[w] {
		return nil
	}
	m.left[w] = true
	if !m.rule.Async || m.rule.MaxStaleness > 0 {
		return nil
	}
	return m.tryStep()
}

// tryStep (max_staleness 0) makes the update of the waiting pushes once
// every worker still in the run has pushed the step.
func (m *Machine) tryStep() *Update {
	up := &Update{Step: -1}
	for w, waits := range m.pending {
		switch {
		case waits:
			up.Workers = append(up.Workers, w)
			up.Staleness = append(up.Staleness, m.version-m.pulled[w])
			up.Step = max(up.Step, m.clock[w]-1)
		case !m.left[w]:
			return nil // w has not pushed the step yet
		}
	}
	if len(up.Workers) == 0 {
		return nil
	}
	for _, w := range up.Workers {
		m.pending[w] = false
	}
	m.version++
	return up
}
