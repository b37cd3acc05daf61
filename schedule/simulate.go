package schedule

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Costs gives the simulator the duration of each kind of action, per stage
// (any unit), and the transfer cost added between the end of a sending action
// and the message becoming available on another stage. F[s] and B[s] are the
// forward and full backward of all of stage s's layers; I[s] and W[s] the
// input-gradient and weight passes, which split B[s]. I or W may be nil,
// meaning B/2. A recomputation (RF) costs what the forward costs. With v chunks per stage a chunk holds 1/v of the stage's
// layers, so an action on one chunk costs a v-th of these. A transfer between
// two chunks of the same stage is free.
//
// AllReduce[s][c], when given, is how long the all-reduce of chunk c's
// gradients among stage s's data-parallel replicas takes (RingAllReduce.Time
// gives it from the gradient's bytes). It runs in the background from the
// moment the chunk's gradients are final for the step (its last B or W), so
// it costs the step only what the stage's remaining work and the other
// stages do not cover. nil means one replica: nothing to reduce.
//
// Chunks, when given, replaces F, B, I and W chunk by chunk: Chunks[s][c] is
// what chunk c of stage s costs, its own layers' passes rather than a v-th of
// the stage's, for chunks that hold unequal shares of a stage's layers (a
// planner weighing uneven splits). F and B must still be given.
type Costs struct {
	F, B      []float64 // len == Stages
	I, W      []float64 // len == Stages, or nil for B/2
	Transfer  float64
	AllReduce [][]float64   // len == Stages, each len == Chunks; or nil
	Chunks    [][]ChunkCost // len == Stages, each len == Chunks; or nil
	// Gap, when given, is per stage the hand-off between one of its actions
	// and the next: the time a runtime spends after an action (sending its
	// output, logging it) before it can start the next, idle in the
	// timeline. An action starts no earlier than Gap after the previous one
	// on its stage ends; the first of a step has none. nil means none.
	Gap []float64 // len == Stages, or nil
	// Cores, when it puts stages in groups, has the stages of a group share
	// its cores while they compute at once, each action taking its cost
	// only at full speed (see CoreGroups). The zero value: every stage
	// computes at full speed.
	Cores CoreGroups
	// Buckets, when given (all_reduce.overlap: layer), cuts a chunk's
	// all-reduce into its buckets, in the order the ring runs them, each
	// starting once the chunk's last weight pass (W) has made its gradients
	// final, while that pass computes the earlier layers'. nil, or nil for
	// a chunk, starts the whole AllReduce[s][c] at the chunk's last B or W;
	// so does a chunk whose last pass is a full backward (B), which reports
	// no layer's progress.
	Buckets [][][]Bucket // len == Stages, each len == Chunks; or nil
	// ReduceAtStepEnd starts every chunk's AllReduce[s][c] when stage s's
	// last action ends, in chunk order, rather than when the chunk's
	// gradients are final: parameter servers' push and pull, which end the
	// stage's step. A cost of the whole stage goes on chunk 0.
	ReduceAtStepEnd bool
}

// Bucket is one bucket of a chunk's all-reduce under Costs.Buckets: Ready is
// the share of the chunk's last weight pass done when the bucket's
// gradients are final (0 to 1), Time how long its all-reduce takes.
type Bucket struct {
	Ready, Time float64
}

// gap is stage st's hand-off between actions (0 without Costs.Gap).
func (c Costs) gap(st int) float64 {
	if c.Gap == nil {
		return 0
	}
	return c.Gap[st]
}

// ChunkCost is one chunk's passes of one micro-batch: forward, full
// backward, input-gradient and weight pass.
type ChunkCost struct{ F, B, I, W float64 }

// UniformCosts returns Costs with the same forward and full backward duration
// on every stage, and I = W = b/2 (I and W left nil).
func UniformCosts(stages int, f, b, transfer float64) Costs {
	c := Costs{F: make([]float64, stages), B: make([]float64, stages), Transfer: transfer}
	for s := range stages {
		c.F[s], c.B[s] = f, b
	}
	return c
}

// duration returns how long a runs on its stage under c with v chunks.
func (c Costs) duration(a Action, v int) float64 {
	if c.Chunks != nil {
		x := c.Chunks[a.Stage][a.Chunk]
		switch a.Kind {
		case Forward, Recompute:
			return x.F
		case Backward:
			return x.B
		case Input:
			return x.I
		}
		return x.W
	}
	var d float64
	switch a.Kind {
	case Forward, Recompute:
		d = c.F[a.Stage]
	case Backward:
		d = c.B[a.Stage]
	case Input:
		d = c.B[a.Stage] / 2
		if c.I != nil {
			d = c.I[a.Stage]
		}
	case Weight:
		d = c.B[a.Stage] / 2
		if c.W != nil {
			d = c.W[a.Stage]
		}
	}
	return d / float64(v)
}

// Span is one action's execution interval in a Timeline.
type Span struct {
	Action     Action
	Start, End float64
}

// Reduction is one chunk's all-reduce in a Timeline.
type Reduction struct {
	Chunk      int
	Start, End float64
}

// Timeline is the result of simulating one training step. The makespan is
// the latest end of any stage's work: its last action, or the end of its
// all-reduces when they finish later (the optimizer step waits for them).
type Timeline struct {
	Makespan     float64
	Spans        [][]Span  // per stage, in execution order
	Busy         []float64 // per stage, sum of span durations
	Bubble       []float64 // per stage, 1 - Busy/Makespan (0 when Makespan is 0)
	PeakInFlight []int     // per stage, as Schedule.PeakInFlight

	// With Costs.AllReduce, and nil without: per stage, its chunks'
	// all-reduces in the order they ran (one at a time, as one ring serves
	// a stage; each bucket apart under Costs.Buckets), and Exposed, how far
	// the last of them ends after the step would have ended with no
	// all-reduce at all: the part of the stage's all-reduce that no
	// computation hides. The step is longer than it
	// would be without them by the largest Exposed (in a lowered schedule
	// whose tied weights' exchange waits for the all-reduces, by up to a
	// transfer more).
	Reductions [][]Reduction
	Exposed    []float64
}

// AllReduce returns stage st's total all-reduce time (0 without
// Costs.AllReduce).
func (tl *Timeline) AllReduce(st int) float64 {
	var t float64
	if tl.Reductions != nil {
		for _, r := range tl.Reductions[st] {
			t += r.End - r.Start
		}
	}
	return t
}

// Simulate plays the schedule: each stage runs its list in order, and an
// action starts when its stage is free and its inputs are available (the
// sender's end, plus Costs.Transfer when the sender is another stage; the
// stage's own forward for a backward or input-gradient pass, its own
// input-gradient pass for a weight pass). It first checks the schedule's
// structure and returns the same errors as Check, including on deadlock.
// With Costs.Cores, stages that share cores slow each other while they
// compute at once (see CoreGroups).
func Simulate(s *Schedule, c Costs) (*Timeline, error) {
	x, err := s.validate()
	if err != nil {
		return nil, err
	}
	if err := c.check(s.Stages, s.Chunks); err != nil {
		return nil, err
	}
	return simulate(s, x, c, nil)
}

// check verifies costs for p stages of v chunks: one forward and backward
// (and, if given, input-gradient and weight) entry per stage, and if given
// one all-reduce entry per chunk of each stage, all finite and >= 0.
func (c Costs) check(p, v int) error {
	if len(c.F) != p || len(c.B) != p {
		return fmt.Errorf("costs have %d forward and %d backward entries, want %d each", len(c.F), len(c.B), p)
	}
	for _, opt := range []struct {
		what string
		vals []float64
	}{{"input-gradient", c.I}, {"weight", c.W}} {
		if opt.vals != nil && len(opt.vals) != p {
			return fmt.Errorf("costs have %d %s entries, want %d (or none, for B/2)", len(opt.vals), opt.what, p)
		}
	}
	for st := range p {
		ok := nonNegative(c.F[st]) && nonNegative(c.B[st])
		got := fmt.Sprintf("F=%v B=%v", c.F[st], c.B[st])
		if c.I != nil {
			ok = ok && nonNegative(c.I[st])
			got += fmt.Sprintf(" I=%v", c.I[st])
		}
		if c.W != nil {
			ok = ok && nonNegative(c.W[st])
			got += fmt.Sprintf(" W=%v", c.W[st])
		}
		if !ok {
			return fmt.Errorf("stage %d: costs must be finite and >= 0, got %s", st, got)
		}
	}
	if !nonNegative(c.Transfer) {
		return fmt.Errorf("transfer cost must be finite and >= 0, got %v", c.Transfer)
	}
	if c.Gap != nil {
		if len(c.Gap) != p {
			return fmt.Errorf("costs have %d hand-off entries, want %d (one per stage, or none)", len(c.Gap), p)
		}
		for st, g := range c.Gap {
			if !nonNegative(g) {
				return fmt.Errorf("stage %d: hand-off must be finite and >= 0, got %v", st, g)
			}
		}
	}
	if c.Chunks != nil {
		if len(c.Chunks) != p {
			return fmt.Errorf("costs have %d per-chunk entries, want %d (one per stage, or none)", len(c.Chunks), p)
		}
		for st, chunks := range c.Chunks {
			if len(chunks) != v {
				return fmt.Errorf("stage %d: costs have %d per-chunk entries, want one per chunk, %d", st, len(chunks), v)
			}
			for ch, x := range chunks {
				if !nonNegative(x.F) || !nonNegative(x.B) || !nonNegative(x.I) || !nonNegative(x.W) {
					return fmt.Errorf("stage %d chunk %d: costs must be finite and >= 0, got %+v", st, ch, x)
				}
			}
		}
	}
	if err := c.Cores.check(p); err != nil {
		return err
	}
	if c.AllReduce == nil {
		if c.Buckets != nil {
			return errors.New("costs have all-reduce buckets but no all-reduce")
		}
		return nil
	}
	if err := c.checkBuckets(p, v); err != nil {
		return err
	}
	if len(c.AllReduce) != p {
		return fmt.Errorf("costs have %d all-reduce entries, want %d (one per stage, or none)", len(c.AllReduce), p)
	}
	for st, chunks := range c.AllReduce {
		if len(chunks) != v {
			return fmt.Errorf("stage %d: costs have %d all-reduce entries, want one per chunk, %d", st, len(chunks), v)
		}
		for ch, d := range chunks {
			if !nonNegative(d) {
				return fmt.Errorf("stage %d chunk %d: all-reduce cost must be finite and >= 0, got %v", st, ch, d)
			}
		}
	}
	return nil
}

// checkBuckets checks Costs.Buckets against p stages of v chunks.
func (c Costs) checkBuckets(p, v int) error {
	if c.Buckets == nil {
		return nil
	}
	if len(c.Buckets) != p {
		return fmt.Errorf("costs have %d all-reduce bucket entries, want %d (one per stage, or none)", len(c.Buckets), p)
	}
	for st, chunks := range c.Buckets {
		if len(chunks) != v {
			return fmt.Errorf("stage %d: costs have %d all-reduce bucket entries, want one per chunk, %d", st, len(chunks), v)
		}
		for ch, bs := range chunks {
			for k, b := range bs {
				if !nonNegative(b.Time) || !(b.Ready >= 0 && b.Ready <= 1) {
					return fmt.Errorf("stage %d chunk %d bucket %d: want a time finite and >= 0 and a ready share from 0 to 1, got %+v", st, ch, k, b)
				}
			}
		}
	}
	return nil
}

func nonNegative(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }

// deps returns what a waits for, the same stage's earlier work first (its
// forward, or its input-gradient pass), then the input from the neighbouring
// model stage.
func (x *index) deps(a Action) []Action {
	ms, last := x.t.ModelStageOf(a), x.p*x.v-1
	var out []Action
	switch a.Kind {
	case Forward:
		if ms > 0 {
			out = append(out, x.t.on(a, Forward, ms-1))
		}
	case Backward, Input:
		f := a
		f.Kind = Recompute
		if x.at(f) < 0 {
			f.Kind = Forward
		}
		out = append(out, f)
		if ms < last {
			out = append(out, x.gradient(a, ms+1))
		}
	case Weight:
		in := a
		in.Kind = Input
		out = append(out, in)
	case Recompute:
		f := a
		f.Kind = Forward
		out = append(out, f)
	}
	return out
}

// simulate assumes a validated schedule (x is its index) and valid costs.
//
// Without Costs.Cores stages share nothing and sends never block, so an
// action's start time is determined solely by its stage's previous action
// and the actions it depends on. Rather than keep an event queue, we
// therefore sweep the stages repeatedly, running every action whose
// dependencies have finished, until nothing moves; this yields exactly the
// times of a discrete-event simulation and is trivially deterministic. With
// stages sharing cores an action's end depends on what else computes
// meanwhile, and CoreGroups.share plays them in time order instead. If
// actions remain when nothing moves, every remaining stage is blocked on a
// dependency that will never finish: a deadlock.
//
// scale, when not nil, multiplies each action's duration (Expect's draws).
func simulate(s *Schedule, x *index, c Costs, scale func(Action) float64) (*Timeline, error) {
	p, v := s.Stages, s.Chunks
	end := make([]float64, len(x.pos)) // finishing time by index slot, -1 while not yet run
	for i := range end {
		end[i] = -1
	}
	// ready returns when a's inputs are available, or the first dependency
	// that has not run yet.
	ready := func(a Action) (float64, Action, bool) {
		t := 0.0
		for _, dep := range x.deps(a) {
			e := end[x.slot(dep)]
			if e < 0 {
				return 0, dep, false
			}
			if dep.Stage != a.Stage {
				e += c.Transfer
			}
			t = max(t, e)
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
	// next returns stage st's next action, when it can start and its
	// duration at full speed, or ok false when it has none or its inputs
	// are not all there yet.
	next := func(st int) (a Action, start, d float64, ok bool) {
		n := len(tl.Spans[st])
		if n == len(s.Actions[st]) {
			return a, 0, 0, false
		}
		a = s.Actions[st][n]
		t, _, ok := ready(a)
		if !ok {
			return a, 0, 0, false
		}
		d = c.duration(a, v)
		if scale != nil {
			d *= scale(a)
		}
		start = max(free[st], t)
		if n > 0 {
			start = max(free[st]+c.gap(st), t)
		}
		return a, start, d, true
	}
	record := func(st int, a Action, start, stop, busy float64) {
		free[st] = stop
		end[x.slot(a)] = stop
		tl.Spans[st] = append(tl.Spans[st], Span{Action: a, Start: start, End: stop})
		tl.Busy[st] += busy
	}
	if c.Cores.shared() {
		c.Cores.share(p, func(st int) (float64, float64, bool, bool) {
			_, start, d, ok := next(st)
			return start, d, ok, false
		}, func(st int, start, stop, busy float64) {
			record(st, s.Actions[st][len(tl.Spans[st])], start, stop, busy)
		})
	}
	for moved := !c.Cores.shared(); moved; {
		moved = false
		for st := range p {
			for {
				a, start, d, ok := next(st)
				if !ok {
					break
				}
				record(st, a, start, start+d, d)
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

	if c.AllReduce == nil {
		tl.finish(free, nil)
		return tl, nil
	}
	// A chunk's reduction starts where the lowering puts its ReduceGrad:
	// right after its last B or W (the sends that follow take no time).
	rings := make([]ring, p)
	for st, spans := range tl.Spans {
		if c.ReduceAtStepEnd {
			rings[st].reduceAtEnd(c, st, free[st])
			continue
		}
		last := make([]int, v)
		for i := range last {
			last[i] = -1
		}
		for i, sp := range spans {
			if sp.Action.Kind == Backward || sp.Action.Kind == Weight {
				last[sp.Action.Chunk] = i
			}
		}
		for i, sp := range spans {
			for ch, at := range last {
				if at == i {
					rings[st].reduceAfter(c, st, ch, sp, sp.End)
				}
			}
		}
	}
	// Nothing waits for a reduction before the step's end, so the step
	// without them ends where the compute does.
	tl.finish(free, &reduced{rings: rings, bare: latest(free)})
	return tl, nil
}

// ring is one stage's all-reduces: they run one after another, each from
// the time its chunk is handed over or the previous one ends.
type ring struct {
	free float64 // when the last reduction handed over ends
	done []Reduction
}

func (r *ring) reduce(chunk int, at, d float64) {
	start := max(at, r.free)
	r.free = start + d
	r.done = append(r.done, Reduction{Chunk: chunk, Start: start, End: r.free})
}

// reduceAfter runs chunk's all-reduce on stage st after last, the chunk's
// last B or W: whole from at, when the chunk is handed over, or bucket by
// bucket within a weight pass (Costs.Buckets).
func (r *ring) reduceAfter(c Costs, st, chunk int, last Span, at float64) {
	if c.Buckets == nil || c.Buckets[st][chunk] == nil || last.Action.Kind != Weight {
		r.reduce(chunk, at, c.AllReduce[st][chunk])
		return
	}
	for _, b := range c.Buckets[st][chunk] {
		r.reduce(chunk, last.Start+b.Ready*(last.End-last.Start), b.Time)
	}
}

// reduceAtEnd runs stage st's chunks' reductions, in chunk order, from end,
// when the stage's last action ends (Costs.ReduceAtStepEnd).
func (r *ring) reduceAtEnd(c Costs, st int, end float64) {
	for ch, d := range c.AllReduce[st] {
		r.reduce(ch, end, d)
	}
}

// reduced is what finish needs of the all-reduces: each stage's ring, and
// the makespan the step would have without any.
type reduced struct {
	rings []ring
	bare  float64
}

// finish sets the makespan, the latest of the stages' end times (each the
// later of the stage's ends and its reductions' end), each stage's bubble
// from it and, with reductions, the timeline's Reductions and Exposed.
func (tl *Timeline) finish(ends []float64, r *reduced) {
	for st, e := range ends {
		if r != nil {
			e = max(e, r.rings[st].free)
		}
		tl.Makespan = max(tl.Makespan, e)
	}
	for st := range tl.Bubble {
		if tl.Makespan > 0 {
			tl.Bubble[st] = 1 - tl.Busy[st]/tl.Makespan
		}
	}
	if r == nil {
		return
	}
	tl.Reductions, tl.Exposed = make([][]Reduction, len(ends)), make([]float64, len(ends))
	for st, rg := range r.rings {
		tl.Reductions[st] = rg.done
		tl.Exposed[st] = max(0, rg.free-r.bare)
	}
}

func latest(ts []float64) float64 {
	var t float64
	for _, x := range ts {
		t = max(t, x)
	}
	return t
}
