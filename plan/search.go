package plan

import (
	"math"
	"slices"

	"github.com/pipetrain/pipetrain/schedule"
)

// searchBudget bounds the work of one Solve, in units of one search node or
// one simulated action (each some 100 ns): a few seconds at worst. Small
// problems never come near it; see Solve.
var searchBudget = 20_000_000

// below returns the largest time that counts as strictly faster than x: step
// times within a relative 1e-12 are ties (the simulator adds the same costs in
// different orders for different splits).
func below(x float64) float64 {
	if math.IsInf(x, 1) {
		return x
	}
	return x - 1e-12*max(1, math.Abs(x))
}

// above is the other side of below: times up to above(x) tie with x.
func above(x float64) float64 {
	if math.IsInf(x, 1) {
		return x
	}
	return x + 1e-12*max(1, math.Abs(x))
}

// minMax is the dynamic programme over contiguous splits: val[s][i] is the
// smallest achievable largest cost(s, a, b) over the ways to cut layers
// i..n-1 into stages s..p-1 (each non-empty, in order) whose every stage
// satisfies ok, or +Inf when there is none; next[s][i] is where stage s ends
// in the first such split found. ok must be monotone: once a stage [i, j)
// fails it, so does [i, j+1) (memory never shrinks as a stage grows).
func (c *candidate) minMax(cost func(s, i, j int) float64, ok func(s, i, j int) bool) (val [][]float64, next [][]int) {
	p, n := c.p.Stages, c.n
	val, next = make([][]float64, p), make([][]int, p)
	for s := p - 1; s >= 0; s-- {
		val[s], next[s] = make([]float64, n+1), make([]int, n+1)
		for i := range val[s] {
			val[s][i] = math.Inf(1)
		}
		for i := s; i <= n-(p-s); i++ {
			if s == p-1 {
				if ok(s, i, n) {
					val[s][i], next[s][i] = cost(s, i, n), n
				}
				continue
			}
			for j := i + 1; j <= n-(p-1-s) && ok(s, i, j); j++ {
				if v := max(cost(s, i, j), val[s+1][j]); v < val[s][i] {
					val[s][i], next[s][i] = v, j
				}
			}
		}
	}
	return val, next
}

// prepare runs the dynamic programmes: the seed, simulated (c.seed), and the
// tables the bounds use; or, when nothing fits the memory limit, the smallest
// limit that would (c.need).
func (c *candidate) prepare() error {
	if c.vshape {
		return c.prepareV()
	}
	p, n := c.p.Stages, c.n
	c.shape, c.back, c.fk = shapes(c.sched), c.b, c.fwdBack
	if c.split {
		c.back, c.fk = c.i, c.fwdInpt
	}
	c.rest, _ = c.minMax(func(_, i, j int) float64 { return c.stage(i, j).work }, c.fits)
	if math.IsInf(c.rest[0][0], 1) {
		need, _ := c.minMax(c.memory, func(int, int, int) bool { return true })
		c.need = need[0][0]
		return nil
	}
	// The classic bottleneck split, each stage also charged its outgoing
	// boundary.
	var err error
	_, next := c.minMax(func(_, i, j int) float64 {
		x := c.stage(i, j).work
		if j < n {
			x += c.transfer(j)
		}
		return x
	}, c.fits)
	if c.seed, err = c.simulate(c.follow(next)); err != nil {
		return err
	}
	// The same programme minimising the largest of the stages' own bounds
	// (see bnb), each stage charged its outgoing transfer, often does
	// better: it sees the fill, the drain and the in-flight loops.
	_, next = c.minMax(func(s, i, j int) float64 {
		T := 0.0
		if j < n {
			T = c.transfer(j)
		}
		return c.alone(s, i, j, T)
	}, c.fits)
	other, err := c.simulate(c.follow(next))
	if err != nil {
		return err
	}
	if other.StepMS < below(c.seed.StepMS) {
		c.seed = other
	}
	// For the bounds on the stages not yet placed (see bnb): the smallest
	// largest F, largest weighted sum of a stage's own passes, and largest
	// boundary transfer that the later stages can have.
	c.maxF, _ = c.minMax(func(_, i, j int) float64 { return c.stage(i, j).F }, c.fits)
	c.chain, _ = c.minMax(func(s, i, j int) float64 { return c.own(s, c.stage(i, j)) }, c.fits)
	c.alone0, _ = c.minMax(func(s, i, j int) float64 { return c.alone(s, i, j, 0) }, c.fits)
	c.tmin, _ = c.minMax(func(_, _, j int) float64 {
		if j == n {
			return 0
		}
		return c.transfer(j)
	}, c.fits)
	c.minPost = make([][3]float64, p+1)
	c.minPost[p] = [3]float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	for s := p - 1; s >= 0; s-- {
		for k := range 3 {
			c.minPost[s][k] = min(c.minPost[s+1][k], c.shape[s].post[k])
		}
	}
	return nil
}

// own is the part of the chain bound for stage s that depends on its own
// passes alone (see bnb).
func (c *candidate) own(s int, x cost) float64 {
	sh := c.shape[s]
	return sh.toLast[0]*x.F + (sh.toLast[1]-1)*x.back + sh.toLast[2]*x.W
}

// alone is the bound on the step time from stage s = layers [i, j) alone,
// with transfer T: the stages before it enter only through sums, which do not
// depend on where they are cut (see bnb).
func (c *candidate) alone(s, i, j int, T float64) float64 {
	x, ov := c.stage(i, j), c.p.OverheadMS
	ready, far, after, cycle := c.terms(s, j, x, c.scale*c.f[i]+float64(s)*ov, c.scale*c.back[i]+float64(s)*ov, T, x.F, 0)
	return max(max(ready, far)+after, cycle, c.reduced(s, x, max(ready, far)))
}

// reduced bounds the step by stage s's all-reduce, given a time its first
// backward cannot start before: from there the stage still runs its other
// forwards and every backward, and only then hands its gradients over.
func (c *candidate) reduced(s int, x cost, from float64) float64 {
	if x.AR == 0 || c.layered() {
		// Per-layer buckets may start before the last backward ends.
		return math.Inf(-1)
	}
	m := float64(c.m)
	return from + (m-c.shape[s].nf)*x.F + m*(x.work-x.F) + x.AR
}

// follow returns the split that minMax's next table chose.
func (c *candidate) follow(next [][]int) []int {
	cuts := make([]int, c.p.Stages)
	for s := 1; s < len(cuts); s++ {
		cuts[s] = next[s-1][cuts[s-1]]
	}
	return cuts
}

// newSearch starts the search of c's splits for one whose step time is
// below limit, spending from *left. Call prepare first; c.seed must be set.
func (c *candidate) newSearch(limit float64, left *int) *bnb {
	b := &bnb{c: c, limit: limit, left: left}
	if c.seed.StepMS < b.limit {
		b.best, b.limit = c.seed, below(c.seed.StepMS)
	}
	return b
}

// bnb is the search over the cuts: a descent from the seed, then a
// depth-first branch and bound placing stages from the first.
//
// The bounds hold for any schedule: they use only the dependencies the
// simulator enforces, that a stage runs its list in order one action at a
// time, and that longer actions and transfers never make anything earlier.
// With F_s the forward of stage s, K_s the pass the stage before it waits for
// (B_s, or I_s when the backward is split), T the transfer, m micro-batches,
// and n_s the number of forwards stage s runs before its first backward (all
// read off the schedule's lists, see shape):
//
//   - Stage s's n_s-th forward cannot end before A_s = sum_{j<s} (F_j + T) +
//     F_s + (n_s-1)*max_{j<=s} F_j: every stage up to s has run n_s forwards
//     and the last of them has travelled on to s. Its first backward starts
//     at S_s >= A_s, and at S_s >= S_{s+1} + K_{s+1} + T (it needs a later
//     stage's backward), so S_s >= A_{p-1} + sum_{j>s} (K_j + T), where
//     A_{p-1} >= (all F) + (p-1)T + (n_{p-1}-1)*max F: the round trip through
//     the later stages, whatever they hold.
//   - After S_t stage t still runs the rest of its list; and the part up to
//     its last B (or I) is followed by the chain sum_{j<t} (T + K_j) down to
//     stage 0, and there by what stage 0's list holds after that
//     micro-batch's backward. So the step takes at least S_s plus, for any
//     t <= s, that much plus sum_{t<j<=s} (K_j + T) (node.down).
//   - The in-flight loop: a forward listed after the backward of a
//     micro-batch d forwards earlier waits for that micro-batch's round trip
//     through the later stages, so 1F1B's late stages, which keep few
//     micro-batches in flight, cannot go faster than their round trip allows
//     (terms' cycle).
//   - A stage hands its gradients to the all-reduce after its last pass, so
//     the step lasts at least S_s plus the stage's remaining work plus its
//     all-reduce (reduced).
//   - For the stages not yet placed: one of them does at least the smallest
//     possible bottleneck work rest[s][i], and cannot finish before the
//     forwards reach it and it runs m of those; and adding up the first two
//     bounds for any stage u gives (all F) + (all K) + 2(p-1)T +
//     (n_{p-1}-1)*max F plus a weighted sum of u's own passes (own), whose
//     smallest possible maxima over the later stages the dynamic programme
//     gives too (maxF, chain), as it does for each stage's bounds on its own
//     (alone0) and for the largest transfer (tmin).
//
// For gpipe the first two are the forward and backward fill and drain of a
// flow shop, which the simulator matches exactly; for the others the bounds
// follow the schedule's order closely enough that most splits no faster than
// the best are pruned rather than simulated. T is the largest transfer among
// the boundaries placed so far and the smallest the later ones allow, which
// only grows, so bounds computed with it stay valid.
type bnb struct {
	c     *candidate
	limit float64 // prune at or above this: the best step time found, less the tie margin
	best  *Plan   // the fastest split found below the limit, if any
	cuts  []int
	left  *int // budget, shared by the candidates of one Solve
	err   error
}

// shape is what the bounds use of one stage's action list. Counts are by
// pass: forward, backward (B or I), weight.
type shape struct {
	nf     float64    // forwards before the first backward
	toLast [3]float64 // passes from the first backward to the last B or I, inclusive
	post   [3]float64 // passes stage 0 runs after its B or I of the micro-batch of this stage's last B or I
	// The in-flight loop: the last forward waits for loops round trips
	// (see bnb), after the flow-shop bound for the forward with index
	// loopFrom; then comes fin, the passes from the last forward's B or I
	// to the last B or I, inclusive.
	loops, loopFrom float64
	fin             [3]float64
}

func shapes(sc *schedule.Schedule) []shape {
	pass := func(a schedule.Action) int {
		switch a.Kind {
		case schedule.Forward:
			return 0
		case schedule.Weight:
			return 2
		}
		return 1
	}
	out := make([]shape, sc.Stages)
	for t, list := range sc.Actions {
		first, last := len(list), -1
		for k, a := range list {
			if pass(a) != 0 && first == len(list) {
				first = k
			}
			if pass(a) == 1 {
				last = k
			}
		}
		out[t].nf = float64(first)
		if last < 0 { // not a valid schedule; Simulate will say so
			continue
		}
		for _, a := range list[first : last+1] {
			out[t].toLast[pass(a)]++
		}
		zero := sc.Actions[0]
		if k := slices.IndexFunc(zero, func(a schedule.Action) bool {
			return pass(a) == 1 && a.MicroBatch == list[last].MicroBatch
		}); k >= 0 {
			for _, a := range zero[k+1:] {
				out[t].post[pass(a)]++
			}
		}
		out[t].loops, out[t].loopFrom, out[t].fin = loop(list, pass)
	}
	return out
}

// loop finds the in-flight loop of one stage's list: a forward that comes
// after the B or I of a micro-batch whose forward is d forwards earlier (or
// less) cannot start before that micro-batch's round trip through the later
// stages has ended. Following such steps back from the last forward gives
// loops steps, down to the forward with index from.
func loop(list []schedule.Action, pass func(schedule.Action) int) (loops, from float64, fin [3]float64) {
	index := map[int]int{} // forward index of each micro-batch at this stage
	var fwds []int         // micro-batch of each forward, in order
	g := -1                // the largest forward index among the micro-batches whose B or I came so far
	d, first := 0, -1      // largest distance to it, and the first forward after a B or I
	for _, a := range list {
		switch pass(a) {
		case 0:
			index[a.MicroBatch] = len(fwds)
			if g >= 0 {
				d = max(d, len(fwds)-g)
				if first < 0 {
					first = len(fwds)
				}
			}
			fwds = append(fwds, a.MicroBatch)
		case 1:
			g = max(g, index[a.MicroBatch])
		}
	}
	lastF := len(fwds) - 1
	if first < 0 || lastF < first {
		return 0, 0, fin
	}
	start, end := -1, -1
	for k, a := range list {
		if pass(a) == 1 {
			end = k
			if a.MicroBatch == fwds[lastF] {
				start = k
			}
		}
	}
	if start < 0 { // not a valid schedule; Simulate will say so
		return 0, 0, fin
	}
	for _, a := range list[start : end+1] {
		fin[pass(a)]++
	}
	j := (lastF-first)/d + 1
	return float64(j), float64(max(lastF-j*d, 0)), fin
}

func dot(n [3]float64, f, k, w float64) float64 { return n[0]*f + n[1]*k + n[2]*w }

// node is what the bounds need of the stages placed so far.
type node struct {
	headF, tail float64 // sums of F and of K over the stages placed
	t           float64 // the largest boundary transfer so far
	f0, k0, w0  float64 // stage 0's F, K and W
	maxF        float64 // the largest F placed
	own         float64 // the largest own part of the chain bound placed, with its stage 0 part
	down        float64 // the largest backward tail from a placed stage, see bnb
	lb          float64 // a lower bound on the makespan
}

// terms returns the bounds' terms for stage s ending at layer j with costs
// x (see bnb): ready, when its first backward can start going by the
// forwards up to it (A_s), and far, going by the round trip through the later
// stages (-Inf for the last stage); after, the least time from then to the end
// of the step; and cycle, the in-flight loop's bound on the whole step (-Inf
// when the stage has no loop). head and tail are the sums of F and of K over
// the stages before s, T the transfer, maxF the largest F up to s, and post
// what stage 0 runs after this stage's last backward reaches it.
func (c *candidate) terms(s, j int, x cost, head, tail, T, maxF, post float64) (ready, far, after, cycle float64) {
	sh := c.shape[s]
	p, m, ov := c.p.Stages, float64(c.m), c.p.OverheadMS
	later := float64(p - 1 - s)
	head, tail = head+float64(s)*T, tail+float64(s)*T
	ready, far, cycle = head+x.F+(sh.nf-1)*maxF, math.Inf(-1), math.Inf(-1)
	if s < p-1 {
		far = c.scale*c.f[c.n] + float64(p)*ov + float64(p-1)*T + (c.shape[p-1].nf-1)*maxF +
			c.scale*(c.back[c.n]-c.back[j]) + later*(ov+T)
	}
	after = max((m-sh.nf)*x.F+m*(x.work-x.F), dot(sh.toLast, x.F, x.back, x.W)+tail+post)
	if sh.loops > 0 {
		// The last forward, then its round trip and what follows, down to
		// stage 0.
		round := c.scale*(c.fk[c.n]-c.fk[j]) + later*2*(ov+T)
		last := head + x.F + sh.loopFrom*maxF + sh.loops*(round+x.back+x.F)
		cycle = last + round + dot(sh.fin, x.F, x.back, x.W) + tail + post
	}
	return ready, far, after, cycle
}

// place returns n after placing stage s with costs x, ending at layer j, with
// every link charged T (at least n.t). grow is the part of the bound that
// cannot shrink as j grows, for the same T.
func (b *bnb) place(n node, s, j int, x cost, T float64) (next node, grow float64) {
	c := b.c
	sh := c.shape[s]
	next = n
	next.headF, next.tail, next.t, next.maxF = n.headF+x.F, n.tail+x.back, T, max(n.maxF, x.F)
	if s == 0 {
		next.f0, next.k0, next.w0 = x.F, x.back, x.W
	}
	post := dot(sh.post, next.f0, next.k0, next.w0)
	next.own = max(n.own, c.own(s, x)+post)
	ready, far, after, cycle := c.terms(s, j, x, n.headF, n.tail, T, next.maxF, post)
	next.down = max(n.down+x.back+T, after)
	next.lb = max(n.lb, max(ready, far)+next.down, cycle, c.reduced(s, x, max(ready, far)))
	return next, max(ready+next.down, cycle, c.reduced(s, x, ready))
}

// unplaced raises n.lb by the bounds for the stages after s, which start at
// layer j and can fit the memory limit.
func (b *bnb) unplaced(n *node, s, j int) {
	c := b.c
	p, T, ov, r := c.p.Stages, n.t, c.p.OverheadMS, c.rest[s+1][j]
	fu := float64(s + 1)
	v := n.headF + fu*T + float64(c.m)*r
	if !c.split {
		v += n.tail + fu*T
	}
	nl := c.shape[p-1].nf
	all := c.scale*(c.f[c.n]+c.back[c.n]) + 2*float64(p)*ov + 2*float64(p-1)*T
	later := c.chain[s+1][j] + dot(c.minPost[s+1], n.f0, n.k0, n.w0)
	n.lb = max(n.lb, v, all+(nl-1)*max(n.maxF, c.maxF[s+1][j])+max(n.own, later), c.alone0[s+1][j])
}

// bound returns a lower bound on the makespan of a whole split, or +Inf when
// a stage does not fit the memory limit.
func (b *bnb) bound(cuts []int) float64 {
	c := b.c
	p, T := len(cuts), 0.0
	for s := 1; s < p; s++ {
		T = max(T, c.transfer(cuts[s]))
	}
	n := node{down: math.Inf(-1)}
	for s, i := range cuts {
		j := c.n
		if s+1 < p {
			j = cuts[s+1]
		}
		if !c.fits(s, i, j) {
			return math.Inf(1)
		}
		n, _ = b.place(n, s, j, c.stage(i, j), T)
	}
	return n.lb
}

// simulate plays a split, charging the budget for its actions (a simulated
// action costs about two search nodes, and a simulation some thirty more).
func (b *bnb) simulate(cuts []int) *Plan {
	c := b.c
	*b.left -= 30 + 2*c.actions
	pl, err := c.simulate(cuts)
	if err != nil {
		b.err = err
	}
	return pl
}

// descend improves on the seed: it moves one cut by one layer at a time,
// taking the move with the fastest simulated step, while that beats the
// current split. Only moves whose bound beats both the limit and the current
// split are simulated. It finds a good split quickly, so that the branch and
// bound starts with a tight limit.
func (b *bnb) descend() {
	if b.c.vshape {
		b.descendV()
		return
	}
	c := b.c
	cur := c.seed
	for *b.left > 0 && b.err == nil {
		var step *Plan
		for s := 1; s < c.p.Stages; s++ {
			for _, d := range []int{-1, 1} {
				cuts := slices.Clone(cur.Boundaries)
				cuts[s] += d
				if cuts[s] <= cuts[s-1] || cuts[s] >= c.n || s+1 < len(cuts) && cuts[s] >= cuts[s+1] {
					continue
				}
				goal := below(cur.StepMS)
				if step != nil {
					goal = below(step.StepMS)
				}
				if b.bound(cuts) >= min(goal, b.limit) {
					continue
				}
				if pl := b.simulate(cuts); pl != nil && pl.StepMS < goal {
					step = pl
				}
			}
		}
		if step == nil {
			return
		}
		cur = step
		if cur.StepMS < b.limit {
			b.best, b.limit = cur, below(cur.StepMS)
		}
	}
}

// exhaust runs the branch and bound over all splits.
func (b *bnb) exhaust() {
	if b.c.vshape {
		b.exhaustV()
		return
	}
	b.dfs(0, 0, node{down: math.Inf(-1)})
}

// dfs places stage s, starting at layer i, after the stages summed in n.
func (b *bnb) dfs(s, i int, n node) {
	c := b.c
	p, last := c.p.Stages, s == c.p.Stages-1
	b.cuts = append(b.cuts[:s], i)
	lo, hi := i+1, c.n-(p-1-s)
	if last {
		lo = c.n
	}
	for j := lo; j <= hi && b.err == nil && *b.left > 0; j++ {
		*b.left--
		if !c.fits(s, i, j) {
			break // memory only grows with j
		}
		x := c.stage(i, j)
		if _, grow := b.place(n, s, j, x, n.t); grow >= b.limit {
			break
		}
		if !last && math.IsInf(c.rest[s+1][j], 1) {
			continue // the later stages cannot fit the memory limit
		}
		T := n.t
		if !last {
			T = max(T, c.transfer(j), c.tmin[s+1][j])
		}
		next, _ := b.place(n, s, j, x, T)
		if !last {
			b.unplaced(&next, s, j)
		}
		if next.lb >= b.limit {
			continue
		}
		if !last {
			b.dfs(s+1, j, next)
			continue
		}
		if pl := b.simulate(b.cuts); pl != nil && pl.StepMS < b.limit {
			b.best, b.limit = pl, below(pl.StepMS)
		}
	}
}
