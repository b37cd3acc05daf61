package schedule

import (
	"fmt"
	"math"
)

// CoreGroups says which stages compute on shared cores (Costs.Cores). The
// stages of one group share its cores by processor sharing: while stages
// whose Demand adds up to D compute at once on a group of C cores, each
// progresses at min(1, C/D) of the speed its costs were measured at. An
// action's cost is then its work, done at full speed only while the group
// has a core for every demand, so stages slow each other only while they
// compute at the same time; one that idles in the bubble leaves its cores
// to the others. Waiting uses no core: for a peer's message, a transfer,
// the hand-off Gap, an all-reduce (which the model leaves to the network).
//
// The zero value shares nothing, and Simulate and Replay give exactly
// (bit for bit) what they give without it. A stage in no group (-1) has
// cores of its own, as under the zero value.
type CoreGroups struct {
	// Group[s] is the group stage s computes on, or -1 when it has cores of
	// its own. nil: no stage shares.
	Group []int
	// Cores[g] is how many cores group g has, > 0.
	Cores []float64
	// Demand[s] is how many cores stage s keeps busy while it computes: its
	// processes (a stage's data-parallel replicas compute in step) times
	// the BLAS threads each runs with. nil: 1 each, one single-threaded
	// process a stage.
	Demand []float64
}

// OneGroup returns CoreGroups in which all p stages share the same cores,
// each keeping demand of them busy while it computes.
func OneGroup(p int, cores, demand float64) CoreGroups {
	g := CoreGroups{Group: make([]int, p), Cores: []float64{cores}, Demand: make([]float64, p)}
	for s := range g.Demand {
		g.Demand[s] = demand
	}
	return g
}

// shared reports whether g puts any stage in a group.
func (g CoreGroups) shared() bool { return g.Group != nil }

func (g CoreGroups) demand(st int) float64 {
	if g.Demand == nil {
		return 1
	}
	return g.Demand[st]
}

// check verifies g for p stages: a group (or -1) per stage, each group's
// cores and each stage's demand finite and > 0.
func (g CoreGroups) check(p int) error {
	if g.Group == nil {
		if g.Cores != nil || g.Demand != nil {
			return fmt.Errorf("core groups give cores or demands but no stage's group")
		}
		return nil
	}
	if len(g.Group) != p {
		return fmt.Errorf("core groups name %d stages' groups, want %d", len(g.Group), p)
	}
	for k, c := range g.Cores {
		if !(c > 0) || math.IsInf(c, 1) {
			return fmt.Errorf("core group %d: cores must be finite and > 0, got %v", k, c)
		}
	}
	for st, k := range g.Group {
		if k < -1 || k >= len(g.Cores) {
			return fmt.Errorf("stage %d: core group %d, want -1 or one of the %d groups", st, k, len(g.Cores))
		}
	}
	if g.Demand == nil {
		return nil
	}
	if len(g.Demand) != p {
		return fmt.Errorf("core groups give %d stages' demands, want %d (or none, for 1 each)", len(g.Demand), p)
	}
	for st, d := range g.Demand {
		if !(d > 0) || math.IsInf(d, 1) {
			return fmt.Errorf("stage %d: core demand must be finite and > 0, got %v", st, d)
		}
	}
	return nil
}

// A coreTask is one stage's next or current computation in share.
type coreTask struct {
	state coreState
	start float64 // when it starts (or started)
	full  float64 // its work at full speed
	left  float64 // work left at last
	last  float64 // when left and rate were last set
	rate  float64 // speed since last, 0 before it starts
	end   float64 // when it ends at rate
	// slowed marks a computation that ran below full speed at some point:
	// only then is its busy time its span rather than its work.
	slowed bool
}

type coreState int

const (
	coreIdle     coreState = iota // no computation known
	coreStarting                  // known, not begun
	coreBusy                      // computing
)

// share plays p stages' computations in time order on g's groups, the
// event-driven loop processor sharing needs: an action's end depends on
// what else computes meanwhile, so the stages cannot be swept one at a
// time as without sharing. poll(st) is called for a stage not computing:
// it advances the stage through what needs no core, saying whether it
// moved, and when its next computation is determined gives its start and
// work. done(st, start, end, busy) records one computation's end, with the
// time to count as the stage's busy time. share returns when no stage has
// anything left it can run: the caller tells a finished schedule from a
// deadlock.
//
// A computation that runs at full speed throughout ends at exactly start +
// work, its busy time exactly work, as without groups: the rate of a
// computation and its end are recomputed only when the rate changes.
func (g CoreGroups) share(p int, poll func(st int) (start, work float64, ok, moved bool), done func(st int, start, end, busy float64)) {
	tasks := make([]coreTask, p)
	busy := make([]float64, len(g.Cores)) // per group, the demand computing now
	now := 0.0
	for {
		for moved := true; moved; {
			moved = false
			for st := range tasks {
				if tasks[st].state != coreIdle {
					continue
				}
				start, work, ok, m := poll(st)
				moved = moved || m || ok
				if ok {
					tasks[st] = coreTask{state: coreStarting, start: start, full: work, left: work}
				}
			}
		}
		g.rates(tasks, busy, now)
		next := math.Inf(1)
		for _, t := range tasks {
			switch t.state {
			case coreStarting:
				next = min(next, t.start)
			case coreBusy:
				next = min(next, t.end)
			}
		}
		if math.IsInf(next, 1) {
			return
		}
		now = next
		for st := range tasks {
			t := &tasks[st]
			switch {
			case t.state == coreBusy && t.end == now:
				b := t.full
				if t.slowed {
					b = t.end - t.start
				}
				done(st, t.start, t.end, b)
				*t = coreTask{}
			case t.state == coreStarting && t.start == now:
				t.state, t.last = coreBusy, now
			}
		}
	}
}

// rates sets each computing task's speed at now: min(1, cores/demand) of its
// group, 1 outside any group. A task whose speed changes is charged the work
// done at its old speed since it was last set, and its end moves.
func (g CoreGroups) rates(tasks []coreTask, busy []float64, now float64) {
	clear(busy)
	for st, t := range tasks {
		if k := g.Group[st]; t.state == coreBusy && k >= 0 {
			busy[k] += g.demand(st)
		}
	}
	for st := range tasks {
		t := &tasks[st]
		if t.state != coreBusy {
			continue
		}
		r := 1.0
		if k := g.Group[st]; k >= 0 && busy[k] > g.Cores[k] {
			r = g.Cores[k] / busy[k]
		}
		if r == t.rate {
			continue
		}
		if t.rate > 0 {
			t.left = max(0, t.left-t.rate*(now-t.last))
		}
		t.last, t.rate = now, r
		t.end = now + t.left/r
		t.slowed = t.slowed || r < 1
	}
}
