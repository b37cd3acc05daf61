package plan

import (
	"math"
	"slices"

	"github.com/pipetrain/pipetrain/schedule"
)

// A V-shaped schedule (zb-v, dualpipev) cuts the model into 2p model stages, stage s
// holding model stages s and 2p-1-s as its two chunks, so a stage's cost is
// that of two ranges of layers that need not be neighbours: the dynamic
// programmes and bounds of the one-chunk search, which see a stage as one
// range, do not apply. Its splits are searched by simulation alone: a
// descent from a seed that gives every model stage about the same work, and
// then every split, pruned only by the busiest stage's work, while the
// budget lasts. Small problems are searched to the end (the plan is then the
// fastest split for the cost model); large ones keep the fastest found.

// vPieces returns the model stages a candidate cuts the model into: one per
// stage, or two under a V.
func (c *candidate) vPieces() int { return c.sched.Stages * c.sched.Chunks }

// pieceEnd is where model stage k of cuts ends.
func (c *candidate) pieceEnd(cuts []int, k int) int {
	if k+1 < len(cuts) {
		return cuts[k+1]
	}
	return c.n
}

// chunkStates returns, per stage, the numbers of micro-batches its chunks
// hold at once (one count per chunk) at the moments that could be its
// fullest: every state the schedule's order passes through that no other
// state exceeds on every chunk. A stage's peak bytes are the largest of
// these counts weighed by its chunks' activations, which need not peak
// together: zb-v's chunk 0 holds most while chunk 1 holds least.
func chunkStates(s *schedule.Schedule) [][][]int {
	out := make([][][]int, s.Stages)
	for st, list := range s.Actions {
		n := make([]int, s.Chunks)
		var states [][]int
		for _, a := range list {
			switch a.Kind {
			case schedule.Forward:
				n[a.Chunk]++
			case schedule.Backward, schedule.Weight:
				n[a.Chunk]--
				continue // fewer than the state before
			}
			if slices.ContainsFunc(states, func(x []int) bool { return covers(x, n) }) {
				continue
			}
			states = slices.DeleteFunc(states, func(x []int) bool { return covers(n, x) })
			states = append(states, slices.Clone(n))
		}
		out[st] = states
	}
	return out
}

// covers reports whether a holds at least as much as b on every chunk.
func covers(a, b []int) bool {
	for i := range a {
		if a[i] < b[i] {
			return false
		}
	}
	return true
}

// vMemory returns each stage's bytes under cuts: its chunks' parameters, its
// fullest state's scaled activations (chunkStates), and with replicas the
// all-reduce's copy of the gradients.
func (c *candidate) vMemory(cuts []int) []float64 {
	top := c.sched.Topology()
	mem := make([]float64, c.p.Stages)
	act := make([][]float64, c.p.Stages)
	for st := range act {
		act[st] = make([]float64, c.sched.Chunks)
	}
	for k, i := range cuts {
		j := c.pieceEnd(cuts, k)
		st, ch := top.Locate(k)
		act[st][ch] = math.Ceil(float64(c.act[j]-c.act[i]) * c.mbs / float64(c.p.MicroBatch))
		mem[st] += float64(c.param[j] - c.param[i])
		if c.p.replicas() > 1 {
			mem[st] += float64(c.grad[j] - c.grad[i])
		}
	}
	for st, states := range c.chunkStates {
		peak := 0.0
		for _, n := range states {
			held := 0.0
			for ch, k := range n {
				held += float64(k) * act[st][ch]
			}
			peak = max(peak, held)
		}
		mem[st] += peak
	}
	return mem
}

func (c *candidate) vFits(cuts []int) bool {
	return c.p.MemoryLimit == 0 || slices.Max(c.vMemory(cuts)) <= float64(c.p.MemoryLimit)
}

// vBusiest is the work of the busiest stage under cuts, each of its actions
// charged its chunk's cost (a full B once, where a split one pays I and W):
// a lower bound on the step, since a stage runs its passes one at a time.
func (c *candidate) vBusiest(cuts []int) float64 {
	if c.vKinds == nil {
		c.vKinds = kindCounts(c.sched)
	}
	top := c.sched.Topology()
	var busiest float64
	for st, chunks := range c.vKinds {
		var work float64
		for ch, n := range chunks {
			k := top.ModelStageOf(schedule.Action{Stage: st, Chunk: ch})
			x := c.stage(cuts[k], c.pieceEnd(cuts, k))
			work += n[schedule.Forward]*x.F + n[schedule.Recompute]*x.F + n[schedule.Backward]*x.B + n[schedule.Input]*x.I + n[schedule.Weight]*x.W
		}
		busiest = max(busiest, work)
	}
	return busiest
}

// kindCounts counts each stage's actions by chunk and kind.
func kindCounts(s *schedule.Schedule) [][][schedule.Recompute + 1]float64 {
	out := make([][][schedule.Recompute + 1]float64, s.Stages)
	for st, list := range s.Actions {
		out[st] = make([][schedule.Recompute + 1]float64, max(s.Chunks, 1))
		for _, a := range list {
			out[st][a.Chunk][a.Kind]++
		}
	}
	return out
}

// simulateV builds the simulator's costs for a V split, each chunk charged
// its own layers, and plays it.
func (c *candidate) simulateV(cuts []int) (*Plan, error) {
	p, top := c.p.Stages, c.sched.Topology()
	costs := schedule.Costs{F: make([]float64, p), B: make([]float64, p), I: make([]float64, p), W: make([]float64, p),
		Chunks: make([][]schedule.ChunkCost, p), Cores: c.p.cores(), ReduceAtStepEnd: c.p.servers() != nil}
	replicated := c.p.reduces()
	if replicated {
		costs.AllReduce = make([][]float64, p)
	}
	for st := range p {
		costs.Chunks[st] = make([]schedule.ChunkCost, c.sched.Chunks)
		if replicated {
			costs.AllReduce[st] = make([]float64, c.sched.Chunks)
		}
	}
	for k, i := range cuts {
		j := c.pieceEnd(cuts, k)
		st, ch := top.Locate(k)
		x := c.stage(i, j)
		costs.Chunks[st][ch] = schedule.ChunkCost{F: x.F, B: x.B, I: x.I, W: x.W}
		costs.F[st] += x.F
		costs.B[st] += x.B
		costs.I[st] += x.I
		costs.W[st] += x.W
		if replicated && c.served == nil {
			costs.AllReduce[st][ch] = x.AR
		}
		// The boundary after model stage k crosses a link unless both
		// sides are chunks of one stage (the turn of the V).
		if next, _ := top.Locate(k + 1); j < c.n && next != st {
			costs.Transfer = max(costs.Transfer, c.transfer(j))
		}
	}
	if replicated && c.served != nil {
		c.pushPerStage(cuts, costs.AllReduce)
	}
	mem := c.vMemory(cuts)
	tl, err := schedule.Simulate(c.sched, costs)
	if err != nil {
		return nil, err
	}
	pl := &Plan{Boundaries: slices.Clone(cuts), Schedule: c.name, MicroBatches: c.m, StepMS: tl.Makespan, Bubble: tl.Bubble,
		MemoryBytes: make([]int64, p), Replicas: c.p.replicas()}
	for st, b := range mem {
		pl.MemoryBytes[st] = int64(b)
	}
	if tl.Makespan > 0 {
		pl.SamplesPerSecond = 1000 * float64(c.p.Batch) / tl.Makespan
	}
	if replicated {
		pl.ExposedMS = tl.Exposed
		for st := range p {
			pl.AllReduceMS = append(pl.AllReduceMS, tl.AllReduce(st))
		}
	}
	return pl, nil
}

// vEnumerate bounds the splits prepareV weighs one by one (memory and work
// only, no simulation).
const vEnumerate = 200_000

// prepareV seeds a V candidate's search. When the splits are few enough it
// weighs every one: the one that fits the memory limit with the least work
// on its busiest stage is the seed, and with none fitting c.need is exactly
// the smallest limit that fits. Otherwise the seed gives every model stage
// about the same work, moved, when that does not fit, one cut at a time
// towards the split whose fullest stage holds least; with no fitting split
// found c.need is the fullest stage's bytes at the end of that descent, a
// limit that fits if not always the smallest.
func (c *candidate) prepareV() error {
	k := c.vPieces()
	var cuts []int
	if splitCount(c.n, k) <= vEnumerate {
		work, need := math.Inf(1), math.Inf(1)
		forEachSplit(c.n, k, func(at []int) {
			need = min(need, slices.Max(c.vMemory(at)))
			if w := c.vBusiest(at); c.vFits(at) && w < work {
				cuts, work = slices.Clone(at), w
			}
		})
		if cuts == nil {
			c.need, c.needExact = need, true
			return nil
		}
	} else {
		cuts = c.balancedCuts(k)
		for !c.vFits(cuts) {
			best, bestMem := []int(nil), slices.Max(c.vMemory(cuts))
			for _, next := range c.vMoves(cuts) {
				if m := slices.Max(c.vMemory(next)); m < bestMem {
					best, bestMem = next, m
				}
			}
			if best == nil {
				c.need = bestMem
				return nil
			}
			cuts = best
		}
	}
	var err error
	c.seed, err = c.simulateV(cuts)
	return err
}

// balancedCuts cuts the model into k model stages of about equal work
// (F+I+W), each at least one layer.
func (c *candidate) balancedCuts(k int) []int {
	cuts := make([]int, k)
	total := c.f[c.n] + c.i[c.n] + c.w[c.n]
	for piece := 1; piece < k; piece++ {
		// The first layer at which the work before it reaches the piece's
		// share, leaving every later piece a layer.
		at := cuts[piece-1] + 1
		for at < c.n-(k-piece) && c.f[at]+c.i[at]+c.w[at] < total*float64(piece)/float64(k) {
			at++
		}
		cuts[piece] = at
	}
	return cuts
}

// splitCount is the number of ways to cut n layers into k non-empty
// contiguous model stages, C(n-1, k-1), saturating well above vEnumerate.
func splitCount(n, k int) int {
	count := 1
	for i := 1; i < k; i++ {
		count = count * (n - i) / i
		if count > 1<<40 {
			return count
		}
	}
	return count
}

// forEachSplit calls f with every split of n layers into k model stages, as
// the first layer of each; f must not keep the slice.
func forEachSplit(n, k int, f func([]int)) {
	cuts := make([]int, k)
	var place func(piece int)
	place = func(piece int) {
		if piece == k {
			f(cuts)
			return
		}
		for at := cuts[piece-1] + 1; at <= n-(k-piece); at++ {
			cuts[piece] = at
			place(piece + 1)
		}
	}
	place(1)
}

// vMoves lists the splits one cut away from cuts, moved by one layer.
func (c *candidate) vMoves(cuts []int) [][]int {
	var out [][]int
	for piece := 1; piece < len(cuts); piece++ {
		for _, d := range []int{-1, 1} {
			next := slices.Clone(cuts)
			next[piece] += d
			if next[piece] <= next[piece-1] || next[piece] >= c.n || piece+1 < len(next) && next[piece] >= next[piece+1] {
				continue
			}
			out = append(out, next)
		}
	}
	return out
}

// descendV improves on the seed as descend does, one cut at a time, with
// the busiest stage's work as the only bound.
func (b *bnb) descendV() {
	c := b.c
	cur := c.seed
	for *b.left > 0 && b.err == nil {
		var step *Plan
		for _, cuts := range c.vMoves(cur.Boundaries) {
			goal := below(cur.StepMS)
			if step != nil {
				goal = below(step.StepMS)
			}
			if !c.vFits(cuts) || c.vBusiest(cuts) >= min(goal, b.limit) {
				continue
			}
			if pl := b.simulateV(cuts); pl != nil && pl.StepMS < goal {
				step = pl
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

// exhaustV visits every split, placing the cuts in order, and simulates
// those that fit the memory limit and whose busiest stage could still beat
// the fastest found.
func (b *bnb) exhaustV() {
	c := b.c
	k := c.vPieces()
	cuts := make([]int, k)
	var place func(piece int)
	place = func(piece int) {
		if piece == k {
			if !c.vFits(cuts) || c.vBusiest(cuts) >= b.limit {
				return
			}
			if pl := b.simulateV(cuts); pl != nil && pl.StepMS < b.limit {
				b.best, b.limit = pl, below(pl.StepMS)
			}
			return
		}
		for at := cuts[piece-1] + 1; at <= c.n-(k-piece) && b.err == nil && *b.left > 0; at++ {
			*b.left--
			cuts[piece] = at
			place(piece + 1)
		}
	}
	place(1)
}

// simulateV plays a V split, charging the budget as simulate does.
func (b *bnb) simulateV(cuts []int) *Plan {
	c := b.c
	*b.left -= 30 + 2*c.actions
	pl, err := c.simulateV(cuts)
	if err != nil {
		b.err = err
	}
	return pl
}

// pushPerStage charges each stage's push and pull with parameter servers
// once, for both its chunks' layers, on chunk 0: a worker stage pushes its
// whole gradient when its step ends (schedule.Costs.ReduceAtStepEnd).
func (c *candidate) pushPerStage(cuts []int, ar [][]float64) {
	top := c.sched.Topology()
	held := make([][]int64, c.p.Stages)
	for k, i := range cuts {
		j := c.pieceEnd(cuts, k)
		st, _ := top.Locate(k)
		if held[st] == nil {
			held[st] = make([]int64, len(c.served))
		}
		for srv, sums := range c.served {
			held[st][srv] += sums[j] - sums[i]
		}
	}
	for st, bytes := range held {
		ar[st][0] = c.p.servers().Time(bytes)
	}
}
