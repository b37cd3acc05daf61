package schedule

import (
	"fmt"
	"strings"
)

// Schedule is the work of one training step: Actions[s] is stage s's list of
// actions in execution order. It is plain data so that it can be printed
// (Grid, WriteCSV, WriteYAML), read back (ParseGrid, Load), checked (Check)
// and simulated (Simulate) the same way whether it came from Build or from a
// user's file. Chunks is the number of chunks (virtual stages) per stage, 1
// unless the schedule interleaves, and Placement says which model stage each
// chunk holds (Loop, the zero value, unless the schedule is V-shaped).
type Schedule struct {
	Name         string
	Stages       int
	MicroBatches int
	Chunks       int
	Placement    Placement
	Actions      [][]Action
}

// SplitsBackward reports whether any stage runs a backward as separate
// input-gradient and weight passes (I and W) rather than whole (B): the
// trainer must then be able to split its layers' backward.
func (s *Schedule) SplitsBackward() bool {
	for _, list := range s.Actions {
		for _, a := range list {
			if a.Kind == Input || a.Kind == Weight {
				return true
			}
		}
	}
	return false
}

// SplitsChunk reports whether a stage's actions run chunk's backward as
// separate I and W passes, for which the stage builds that chunk's engine
// split.
func SplitsChunk(actions []Action, chunk int) bool {
	for _, a := range actions {
		if a.Chunk == chunk && (a.Kind == Input || a.Kind == Weight) {
			return true
		}
	}
	return false
}

// builtin describes one named schedule: its size rules, how to build it, its
// placement and its closed-form bubble, kept side by side so that they cannot
// drift apart silently (the tests compare them against the simulator).
type builtin struct {
	name      string
	sizes     func(p, m, v int) error // rules beyond checkSize; the error omits the name
	build     func(p, m, v int) ([][]Action, error)
	placement Placement
	bubble    func(p, m, v int) float64
}

// builtins is ordered; Names reports this order.
var builtins = []builtin{
	{"gpipe", oneChunk, perStage(gpipeStage), Loop, fillDrainBubble},
	{"1f1b", oneChunk, perStage(oneFOneBStage), Loop, fillDrainBubble},
	{"interleaved", interleavedSizes, perStage(interleavedStage), Loop, interleavedBubble},
	{"zb-h1", oneChunk, zbH1, Loop, zbH1Bubble},
	{"zb-v", zbVSizes, perStage(zbVStage), V, zbVBubble},
	{"interleaved-zb", interleavedSizes, interleavedZB, Loop, interleavedZBBubble},
	{"dualpipev", dualPipeVSizes, perStage(dualPipeVStage), V, dualPipeVBubble},
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

// Build returns the named schedule for the given number of stages,
// micro-batches per step and chunks (virtual stages) per stage.
//
// gpipe: every stage runs all forwards then all backwards (F0..F(m-1),
// B0..B(m-1)); simple, but each stage stashes activations for all m
// micro-batches. chunks must be 1.
//
// 1f1b (PipeDream-Flush): stage s runs min(p-s-1, m) warm-up forwards, then
// alternates one forward and one backward while forwards remain, then drains
// the remaining backwards. Same bubble as gpipe, but stage s stashes at most
// min(p-s, m) activations. chunks must be 1.
//
// interleaved (Megatron-LM's interleaved 1F1B, Narayanan et al., SC'21): each
// stage holds v >= 2 chunks, and the model stages are placed round-robin
// (stage s holds model stages s, s+p, ...). Each stage walks its m*v
// (micro-batch, chunk) units in groups of p micro-batches: forwards of chunk
// 0 for micro-batches 0..p-1, chunk 1 for the same micro-batches, ...,
// chunk v-1, then chunk 0 for micro-batches p..2p-1 and so on; backwards in
// the same order with the chunks reversed. Stage s runs
// min(2(p-s-1) + (v-1)p, m*v) warm-up forwards (as Megatron's
// forward_backward_pipelining_with_interleaving), then alternates one forward
// and one backward, then drains; so it stashes at most one more than that
// many micro-batch chunks, each a v-th of a stage's activations. Like
// Megatron it needs at least two stages and m a multiple of p; it cuts the
// bubble by v at the cost of v times as many transfers.
//
// zb-h1 (Zero Bubble's ZB-H1, Qi et al., ICLR 2024): the backward is split
// into I and W. Each stage runs 1F1B's order of forwards and input-gradient
// passes and defers each weight pass to a point where the stage would
// otherwise wait, or must free memory: the order is the list schedule with
// unit F = I = W that runs the oldest pending W whenever the next forward or
// input-gradient pass is not ready yet (or is a forward while min(p, m)
// micro-batches are in flight), and drains the remaining Ws at the end.
// Every stage then stashes at most min(p, m) micro-batches (released at W),
// which is 1F1B's peak, reached on 1F1B's first stage; the paper keeps the
// pipeline's peak, not each stage's, and no schedule can keep each stage
// within 1F1B's min(p-s, m) and reach ZB-H1's bubble: with the last stage
// holding one micro-batch, the first stage cannot finish before
// (p-1)(F+I) + m(F+I+W). chunks must be 1.
//
// zb-v (Zero Bubble's ZB-V, Qi et al.; torch.distributed.pipelining's
// ScheduleZBVZeroBubble): the backward is split into I and W, and each stage
// holds two chunks placed in a V (Placement V): stage s holds model stages s
// and 2p-1-s, so the forward runs down the stages on chunk 0, turns on the
// last stage (its chunk 0 hands the activation to its chunk 1 locally) and
// comes back up to stage 0, which computes the loss; the backward runs the V
// the other way. Each stage's order is the paper's hand-crafted one (see
// zbVStage), built for F = I = W: the only idle time is the start-up skew,
// half a forward for each stage the first micro-batch passes before reaching
// a stage (see zbVBubble). Stage s stashes at most min(m, 2p-1-s) +
// min(m, s+1) micro-batch chunks, each half a stage's activations: never more
// than 1F1B's first stage, and as much on every stage once m >= 2p-1. It
// sends twice as many tensors as 1F1B (two boundaries per link, each way).
// chunks must be 2 and micro-batches at least 3p/2, rounded down.
//
// interleaved-zb (interleaved zero bubble; torch.distributed.pipelining's
// ScheduleInterleavedZeroBubble): interleaved's placement and order with the
// backward split into I and W, each weight pass deferred to where the stage
// would otherwise wait. The order is zb-h1's list schedule (F = I = W = 1
// per chunk) on interleaved's order with input-gradient passes for its
// backwards: a free stage runs the next forward or input-gradient pass of
// that order if it is ready (for a forward, while fewer than
// min((v+1)p-1, m*v) micro-batch chunks are in flight, interleaved 1F1B's
// peak on its first stage), else its oldest pending W, and drains the
// remaining Ws at the end. Every stage then stashes exactly
// min((v+1)p-1, m*v) micro-batch chunks at its peak, each a v-th of a
// stage's activations: as much as interleaved's first stage, never more (nor
// could the limit be lower: that stage runs as many forwards before its
// first input-gradient pass). The only idle time is the start-up skew, one
// chunk forward for each stage before the last (see interleavedZBBubble).
// Same sizes as interleaved: chunks >= 2, stages >= 2, micro-batches a
// multiple of stages.
//
// dualpipev (DeepSeek's DualPipeV, DualPipe cut in half onto a V;
// torch.distributed.pipelining's ScheduleDualPipeV): the same V placement as
// zb-v, in dualpipev.py's order (see dualPipeVStage): warm-up forwards of
// chunk 0, then of both chunks, a steady state of forward-and-backward pairs
// (a forward of one chunk, then a full backward of the other, which DualPipe
// overlaps on a GPU), and a drain whose later backwards are split into I and
// W. A chunk may mix B and I/W; the runtime then builds its engine split and
// runs each B as I then W. On unit costs its bubble is zb-v's (see
// dualPipeVBubble); every stage stashes at most 2p+1 micro-batch chunks.
// chunks must be 2 and micro-batches at least 2p (DualPipeV's rule; with
// one stage, which holds both ends of the model, that is 2).
func Build(name string, stages, microBatches, chunks int) (*Schedule, error) {
	b, ok := lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown schedule %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	if err := b.check(stages, microBatches, chunks); err != nil {
		return nil, err
	}
	actions, err := b.build(stages, microBatches, chunks)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Schedule{Name: name, Stages: stages, MicroBatches: microBatches, Chunks: chunks, Placement: b.placement, Actions: actions}, nil
}

// PlacementOf returns the placement of the named built-in schedule; ok is
// false for an unknown name.
func PlacementOf(name string) (pl Placement, ok bool) {
	b, ok := lookup(name)
	return b.placement, ok
}

// check applies checkSize and then b's own rules.
func (b builtin) check(p, m, v int) error {
	if err := checkSize(p, m, v); err != nil {
		return err
	}
	if err := b.sizes(p, m, v); err != nil {
		return fmt.Errorf("%s needs %w", b.name, err)
	}
	return nil
}

func checkSize(stages, microBatches, chunks int) error {
	if stages < 1 {
		return fmt.Errorf("stages must be >= 1, got %d", stages)
	}
	if microBatches < 1 {
		return fmt.Errorf("micro-batches must be >= 1, got %d", microBatches)
	}
	if chunks < 1 {
		return fmt.Errorf("chunks must be >= 1, got %d", chunks)
	}
	return nil
}

func oneChunk(p, m, v int) error {
	if v != 1 {
		return fmt.Errorf("chunks == 1, got %d", v)
	}
	return nil
}

func interleavedSizes(p, m, v int) error {
	switch {
	case v < 2:
		return fmt.Errorf("chunks >= 2, got %d", v)
	case p < 2:
		return fmt.Errorf("stages >= 2, got %d", p)
	case m%p != 0:
		return fmt.Errorf("micro_batches to be a multiple of stages (%d micro-batches, %d stages)", m, p)
	}
	return nil
}

// zbVMinMicroBatches is the fewest micro-batches zb-v accepts on p stages:
// from there on its makespan meets the lower bound zbVBubble describes.
func zbVMinMicroBatches(p int) int { return 3 * p / 2 }

func zbVSizes(p, m, v int) error {
	switch {
	case v != 2:
		return fmt.Errorf("chunks == 2 (one model stage on the way down the V and one on the way up), got %d", v)
	case m < zbVMinMicroBatches(p):
		return fmt.Errorf("micro_batches >= %d for %d stages (3*stages/2, rounded down: with fewer it cannot hide the first micro-batch's trip down and up the V), got %d",
			zbVMinMicroBatches(p), p, m)
	}
	return nil
}

// perStage turns a builder of one stage's list into a builder of all lists.
func perStage(stage func(s, p, m, v int) []Action) func(p, m, v int) ([][]Action, error) {
	return func(p, m, v int) ([][]Action, error) {
		out := make([][]Action, p)
		for s := range p {
			out[s] = stage(s, p, m, v)
		}
		return out, nil
	}
}

func gpipeStage(s, p, m, v int) []Action {
	out := make([]Action, 0, 2*m)
	for i := range m {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: i})
	}
	for i := range m {
		out = append(out, Action{Stage: s, Kind: Backward, MicroBatch: i})
	}
	return out
}

func oneFOneBStage(s, p, m, v int) []Action {
	return oneFOneB(s, p, m, Backward)
}

// oneFOneB is stage s's 1F1B order, with backwards of kind back.
func oneFOneB(s, p, m int, back Kind) []Action {
	out := make([]Action, 0, 2*m)
	f, b := 0, 0 // next forward / backward micro-batch
	for f < min(p-s-1, m) {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: f})
		f++
	}
	for f < m {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: f})
		out = append(out, Action{Stage: s, Kind: back, MicroBatch: b})
		f++
		b++
	}
	for b < m {
		out = append(out, Action{Stage: s, Kind: back, MicroBatch: b})
		b++
	}
	return out
}

// interleavedWarmup is the number of warm-up forwards of stage s in the
// interleaved schedule.
func interleavedWarmup(s, p, m, v int) int {
	return min(2*(p-s-1)+(v-1)*p, m*v)
}

// interleavedUnit returns the j-th (micro-batch, chunk) unit of stage s's
// forward (or, with the chunks reversed, backward) order.
func interleavedUnit(j, s, p, v int, k Kind) Action {
	group, r := j/(p*v), j%(p*v)
	c := r / p
	if k != Forward {
		c = v - 1 - c
	}
	return Action{Stage: s, Kind: k, MicroBatch: group*p + r%p, Chunk: c}
}

func interleavedStage(s, p, m, v int) []Action {
	return interleavedOrder(s, p, m, v, Backward)
}

// interleavedOrder is stage s's interleaved 1F1B order, with backwards of
// kind back.
func interleavedOrder(s, p, m, v int, back Kind) []Action {
	total := m * v
	warm := interleavedWarmup(s, p, m, v)
	out := make([]Action, 0, 2*total)
	for j := range warm {
		out = append(out, interleavedUnit(j, s, p, v, Forward))
	}
	for j := range total - warm {
		out = append(out, interleavedUnit(warm+j, s, p, v, Forward))
		out = append(out, interleavedUnit(j, s, p, v, back))
	}
	for j := total - warm; j < total; j++ {
		out = append(out, interleavedUnit(j, s, p, v, back))
	}
	return out
}

// zbH1 builds ZB-H1 by list scheduling on unit costs (see splitList): each
// stage's base order is its 1F1B order, and at most min(p, m) micro-batches
// are in flight on any stage.
func zbH1(p, m, v int) ([][]Action, error) {
	return splitList(p, m, v, min(p, m), func(s int) []Action { return oneFOneB(s, p, m, Input) })
}

// interleavedZB builds interleaved-zb by the same list scheduling, on
// interleaved 1F1B's order with input-gradient passes for its backwards, and
// at most as many micro-batch chunks in flight on any stage as interleaved
// 1F1B holds on its first stage.
func interleavedZB(p, m, v int) ([][]Action, error) {
	limit := min(interleavedWarmup(0, p, m, v)+1, m*v)
	return splitList(p, m, v, limit, func(s int) []Action {
		return interleavedOrder(s, p, m, v, Input)
	})
}

// splitList builds a schedule whose backwards are split into I and W by list
// scheduling on unit costs (every chunk's F = I = W = 1, free transfers), one
// time unit at a time, so that every decision is made knowing exactly which
// inputs have arrived. Model stage k is chunk k/p of stage k%p (Loop). A
// free stage runs the next forward or input-gradient pass of its base order
// (order(s)) if that is ready: a forward's input has arrived from the
// previous model stage and fewer than limit micro-batch chunks are in flight
// on the stage (forwarded, their weight pass not yet run); an input-gradient
// pass's forward has run and its gradient has arrived from the next model
// stage (the last model stage needs only its forward). Otherwise it runs its
// oldest pending weight pass, else idles. The remaining weight passes drain
// at the end.
func splitList(p, m, v, limit int, order func(s int) []Action) ([][]Action, error) {
	out := make([][]Action, p)
	base := make([][]Action, p)
	next := make([]int, p)         // position in base
	pending := make([][]Action, p) // weight passes whose I is done, oldest first
	inFlight := make([]int, p)
	free := make([]int, p) // when each stage finishes its last action
	last := p*v - 1
	// done[k][ms][i] is the end of the action of kind k (Forward or Input)
	// on micro-batch i at model stage ms, or -1.
	var done [2][][]int
	for s := range p {
		base[s] = order(s)
	}
	for k := range done {
		done[k] = make([][]int, p*v)
		for ms := range p * v {
			done[k][ms] = make([]int, m)
			for i := range m {
				done[k][ms][i] = -1
			}
		}
	}
	arrived := func(k, ms, i, t int) bool { return done[k][ms][i] >= 0 && done[k][ms][i] <= t }
	ready := func(a Action, t int) bool {
		ms, i := a.Chunk*p+a.Stage, a.MicroBatch
		if a.Kind == Forward {
			return inFlight[a.Stage] < limit && (ms == 0 || arrived(0, ms-1, i, t))
		}
		return arrived(0, ms, i, t) && (ms == last || arrived(1, ms+1, i, t))
	}
	left := 3 * p * m * v
	for t := 0; left > 0; t++ {
		if t > 6*p*m*v+2*p*v {
			// Unreachable for any size Build accepts (the tests build every
			// size up to p = 8, m = 32, v = 4); an error rather than a loop
			// or a panic.
			return nil, fmt.Errorf("list scheduling stalled at time %d (p=%d, m=%d, v=%d)", t, p, m, v)
		}
		for s := range p {
			if free[s] > t {
				continue
			}
			var a Action
			switch {
			case next[s] < len(base[s]) && ready(base[s][next[s]], t):
				a = base[s][next[s]]
				next[s]++
			case len(pending[s]) > 0:
				a = pending[s][0]
				pending[s] = pending[s][1:]
			default:
				continue
			}
			out[s] = append(out[s], a)
			free[s] = t + 1
			left--
			ms := a.Chunk*p + a.Stage
			switch a.Kind {
			case Forward:
				done[0][ms][a.MicroBatch] = t + 1
				inFlight[s]++
			case Input:
				done[1][ms][a.MicroBatch] = t + 1
				w := a
				w.Kind = Weight
				pending[s] = append(pending[s], w)
			case Weight:
				inFlight[s]--
			}
		}
	}
	return out, nil
}

// zbVStage is stage s's ZB-V list (Qi et al.'s hand-crafted schedule, as
// torch.distributed.pipelining's ScheduleZBVZeroBubble orders it), built for
// n = max(m, 2p-1) micro-batches with those past m left out: chunk 0 is model
// stage s, chunk 1 model stage 2p-1-s. In order:
//
//  1. 2(p-s)-1 forwards of chunk 0: stage s is busy until the first
//     micro-batch has come down the V and back up to it;
//  2. s pairs: a forward of chunk 1, then one of chunk 0;
//  3. p-s triples on chunk 1: forward, input gradient, weight;
//  4. the steady state, until every forward has run: a forward of chunk 0
//     (while any are left), then chunk 0's next input-gradient and weight
//     passes, then chunk 1's forward, input-gradient and weight passes;
//  5. the cool-down: s pairs of input-gradient passes, chunk 0 then chunk 1,
//     their weight passes deferred; p-s of chunk 0's input-gradient passes,
//     each followed by chunk 0's oldest deferred weight pass; then chunk 1's
//     deferred weight passes and chunk 0's last ones.
//
// Chunk 0's forwards run ahead of chunk 1's by up to 2p-1-s micro-batches,
// and each is held until its weight pass: the stage holds at most
// min(m, 2p-1-s) + min(m, s+1) micro-batch chunks at once, 2p on every stage
// once m >= 2p-1 (chunk 0 alone reaches min(m, 2p-s), chunk 1 min(m, s+1),
// but not at the same time).
func zbVStage(s, p, m, v int) []Action {
	n := max(m, 2*p-1)
	out := make([]Action, 0, 6*m)
	var f, b, w [2]int // the next forward, input-gradient and weight pass of each chunk
	add := func(k Kind, c int) {
		next := &f[c]
		switch k {
		case Input:
			next = &b[c]
		case Weight:
			next = &w[c]
		}
		if *next < m {
			out = append(out, Action{Stage: s, Kind: k, MicroBatch: *next, Chunk: c})
		}
		*next++
	}
	for range 2*(p-s) - 1 {
		add(Forward, 0)
	}
	for range s {
		add(Forward, 1)
		add(Forward, 0)
	}
	for range p - s {
		add(Forward, 1)
		add(Input, 1)
		add(Weight, 1)
	}
	for f[1] < f[0] || f[0] < n {
		if f[0] < n {
			add(Forward, 0)
		}
		add(Input, 0)
		add(Weight, 0)
		add(Forward, 1)
		add(Input, 1)
		add(Weight, 1)
	}
	for range s {
		add(Input, 0)
		add(Input, 1)
	}
	for range p - s {
		add(Input, 0)
		add(Weight, 0)
	}
	for w[1] < b[1] {
		add(Weight, 1)
	}
	for w[0] < b[0] {
		add(Weight, 0)
	}
	return out
}

// The closed forms below are the idle fraction of the makespan, the same on
// every stage, for uniform costs F = B/2 = I = W on every stage and free
// transfers: a forward costs one unit, a full backward two, an input-gradient
// or weight pass one each. Each chunk's actions cost a v-th of that.

// fillDrainBubble is the idle fraction of a schedule that fills and drains the
// pipeline once per step: each stage is busy for m*(f+b) out of
// (m+p-1)*(f+b).
func fillDrainBubble(p, m, v int) float64 {
	return float64(p-1) / float64(m+p-1)
}

// interleavedBubble: the fill and drain shrink to (p-1)(f+b)/v, so each stage
// is busy m(f+b) out of m(f+b) + (p-1)(f+b)/v; that is Megatron's bubble of
// (p-1)/(v m) of the ideal time.
func interleavedBubble(p, m, v int) float64 {
	return float64(p-1) / float64(v*m+p-1)
}

// zbH1Bubble: for m >= p, ZB-H1 idles (p-1)(F+I-W) per stage (the paper's
// handcrafted schedules, where its B is our I) against 1F1B's (p-1)(F+I+W),
// out of a makespan of m(F+I+W) + (p-1)(F+I-W); with F = I = W = 1 that is
// p-1 units, and (p-1)/(3m+p-1). The last stage cannot start before (p-1)F and then works
// 3m units, so no schedule does better. For m < p there are too few
// micro-batches to hide the weight passes behind: the makespan is 2m+2p-1
// units (the last stage runs m forwards and m input-gradient passes from p-1
// on, the last I goes back through p-1 stages, and stage 0 then runs its last
// W; again no schedule does better), so the idle fraction is
// (2p-1-m)/(2m+2p-1); both agree at m = p.
func zbH1Bubble(p, m, v int) float64 {
	if m < p {
		return float64(2*p-1-m) / float64(2*m+2*p-1)
	}
	return float64(p-1) / float64(3*m+p-1)
}

// zbVBubble: with F = I = W per stage, each of zb-v's chunk actions takes
// half a unit (a chunk holds half a stage), and each stage works 3m units.
// The forward of the first micro-batch reaches stage s after s half-units, so
// stage p-1 cannot start before (p-1)/2 and the makespan is at least
// 3m + (p-1)/2; the construction meets that bound for every m >= 3p/2
// (rounded down; Build refuses fewer): stage s is busy without a gap from
// s/2 to 3m + s/2, idle (p-1)/2 units in all, which gives (p-1)/(6m+p-1).
// The paper counts ZB-V's bubble as zero: it measures each stage from its
// first pass to its last, a parallelogram whose skew successive steps
// overlap, while the simulator starts a step on an empty pipeline and so
// charges the skew, (p-1)F/2 per stage, to every step.
func zbVBubble(p, m, v int) float64 {
	return float64(p-1) / float64(6*m+p-1)
}

// interleavedZBBubble: with F = I = W per stage, each chunk action takes a
// v-th of a unit, and each stage works 3m units, 3mv chunk actions. The
// forward of the first micro-batch reaches the last stage after p-1 chunk
// forwards, so the makespan is at least 3m + (p-1)/v; the construction meets
// that bound for every size Build accepts (the tests check every p <= 8,
// v <= 4, m <= 32): each stage idles (p-1)/v units in all, which gives
// (p-1)/(3vm+p-1), a third of interleaved's idle time and a v-th of
// zb-h1's.
func interleavedZBBubble(p, m, v int) float64 {
	return float64(p-1) / float64(3*v*m+p-1)
}

// TheoreticalBubble returns the closed-form idle fraction of each stage for
// the named schedule with v chunks per stage, for uniform costs F = B/2 = I =
// W on every stage (a forward one unit, a full backward two, an input-gradient
// or weight pass one each) and free transfers:
//
//	gpipe, 1f1b:    (p-1)/(m+p-1)
//	interleaved:    (p-1)/(v*m+p-1), i.e. Megatron's (p-1)/(v*m) of the ideal time
//	zb-h1:          (p-1)(F+I-W) / (m(F+I+W) + (p-1)(F+I-W)) = (p-1)/(3m+p-1) for m >= p,
//	                (2p-1-m)/(2m+2p-1) for m < p (see zbH1Bubble)
//	zb-v:           (p-1)(F/2) / (m(F+I+W) + (p-1)(F/2)) = (p-1)/(6m+p-1) (see zbVBubble)
//	interleaved-zb: (p-1)(F/v) / (m(F+I+W) + (p-1)(F/v)) = (p-1)/(3vm+p-1) (see interleavedZBBubble)
//	dualpipev:      (p-1)/(6m+p-1), as zb-v, for m >= 2p; DualPipe's (PP/2-1)(F&B+B-3W)
//	                counts each overlapped pair as one block (see dualPipeVBubble)
//
// The first two hold for any uniform forward and backward costs (the idle
// time scales with F+B); zb-h1's, zb-v's, interleaved-zb's and dualpipev's
// need F = I = W (the first three orders are built for those costs). ok is false for an unknown name or sizes Build
// rejects.
func TheoreticalBubble(name string, stages, microBatches, chunks int) (frac float64, ok bool) {
	b, ok := lookup(name)
	if !ok || b.check(stages, microBatches, chunks) != nil {
		return 0, false
	}
	return b.bubble(stages, microBatches, chunks), true
}
