package collective

import (
	"context"
	"fmt"
)

// Hierarchical all-reduce (all_reduce.algorithm: hierarchical, TensorFlow's
// HierarchicalCopyAllReduce) over the ring's own links. The plan's Groups
// cut the ranks into runs of consecutive ranks, one run per host, so every
// ring link joins two ranks of one host except the G links from a host's
// last rank, its leader, to the next host's first. Each bucket, in turn:
//
//   - Within each host, the bucket travels whole down the run: its first
//     rank sends its part, each next rank adds its own, and the leader ends
//     with the host's sum H[g] = ((g[s] + g[s+1]) + ...) + g[e-1], its
//     ranks' parts folded left to right.
//   - Across hosts, the leaders run a ring over G chunks of the bucket: in
//     the reduce-scatter chunk c starts at leader c and collects leaders
//     c+1, c+2, ... in turn, so it folds ((H[c] + H[c+1]) + ...) + H[c-1]
//     (indices mod G), as the ring folds ranks' parts. A message from
//     leader g to leader g+1 crosses one host link, then is relayed,
//     unchanged, down host g+1's run to its leader.
//   - The all-gather passes each finished chunk round the leaders the same
//     way, one round more than the leaders need, so every relaying rank
//     also stores every chunk: the broadcast within each host rides on it.
//
// Within hosts the ranks send copies: their values are overwritten by
// relayed chunks before the next rank need have taken them.
//
// So each element's fold depends on the hosts' layout and the bucket alone
// (Sum computes it in one process). Every step of the schedule carries at
// most one message per link, and each rank sends before it receives, as
// the ring does; buckets run one after another. A rank's values change
// after they were sent only by a later message whose contents depend on
// the next rank having taken them, so the rules of AllReduce's buffers
// hold. The host links carry about (2G-1)N/G values each, the ring's
// 2N(R-1)/R being no more when hosts hold equal runs: what the shape
// saves is the number of host-link messages of a call, 2G-1 per bucket
// against the ring's 2R-2.

// Hierarchical is the value of all_reduce.algorithm for hierarchical.go.
const Hierarchical Algorithm = "hierarchical"

// WithGroups is p with its ranks cut into groups of the given sizes, in
// rank order: the hosts of a hierarchical all-reduce.
func (p Plan) WithGroups(sizes []int) (Plan, error) {
	total := 0
	for g, s := range sizes {
		if s < 1 {
			return Plan{}, fmt.Errorf("collective: group %d of %v is empty", g, sizes)
		}
		total += s
	}
	if total != p.Ranks {
		return Plan{}, fmt.Errorf("collective: groups %v hold %d ranks, the plan %d", sizes, total, p.Ranks)
	}
	p.Groups = append([]int(nil), sizes...)
	return p, nil
}

// groups is p's groups as [start, end) rank ranges: one group of every
// rank where none are set.
func (p Plan) groups() [][2]int {
	sizes := p.Groups
	if len(sizes) == 0 {
		sizes = []int{p.Ranks}
	}
	out := make([][2]int, len(sizes))
	start := 0
	for g, s := range sizes {
		out[g] = [2]int{start, start + s}
		start += s
	}
	return out
}

// groupChunk is the element range of chunk c (mod G) of bucket b when the
// bucket is cut among G leaders, as Chunk cuts it among ranks.
func (p Plan) groupChunk(b, c, G int) (lo, hi int) {
	c = ((c % G) + G) % G
	q := p
	q.Ranks = G
	return q.Chunk(b, c)
}

// hop is one message of the schedule: from rank `from` to from+1, of
// elements [lo, hi), added to the receiver's values or stored over them.
type hop struct {
	from, lo, hi int
	tag          int // within the bucket's tags (hierarchicalTag)
	adding       bool
	round        bool // the sender rounds its values to the wire first
	// copied: the sender sends a copy, as its values are overwritten by
	// relayed chunks that need not wait for the next rank to take them.
	copied bool
}

// hierarchicalShapes lists the message shapes of a hierarchical plan by
// tag: per bucket, the whole bucket (within hosts), then its G chunks.
func hierarchicalShapes(p Plan) [][]int {
	G := len(p.groups())
	var out [][]int
	for b, bk := range p.Buckets {
		out = append(out, []int{bk[1] - bk[0]})
		for c := range G {
			lo, hi := p.groupChunk(b, c, G)
			out = append(out, []int{hi - lo})
		}
	}
	return out
}

// hierarchicalSteps is bucket b's schedule: per step, the hops of that
// step, at most one per link.
func hierarchicalSteps(p Plan, b int) [][]hop {
	gs := p.groups()
	G, longest := len(gs), 0
	for _, g := range gs {
		longest = max(longest, g[1]-g[0])
	}
	var steps [][]hop
	// Within hosts: down each run to its leader.
	bucketLo, bucketHi := p.Buckets[b][0], p.Buckets[b][1]
	for t := 0; t < longest-1; t++ {
		var step []hop
		for _, g := range gs {
			if g[0]+t+1 < g[1] {
				step = append(step, hop{from: g[0] + t, lo: bucketLo, hi: bucketHi, adding: true, copied: true})
			}
		}
		steps = append(steps, step)
	}
	// Across hosts: round t of the reduce-scatter (t < G-1) or of the
	// all-gather; leader g sends to leader g+1 through g+1's run.
	for t := 0; t < 2*G-1; t++ {
		for k := 0; k < longest; k++ {
			var step []hop
			for g := range G {
				next := gs[(g+1)%G]
				from := next[0] - 1 + k // leader g's link, then down the run
				if k == 0 {
					from = gs[g][1] - 1
				}
				last := next[0]+k == next[1]-1
				if next[0]+k >= next[1] || (t == 2*G-2 && last) {
					continue // past the run, or the leader has the chunk
				}
				var c int
				if t < G-1 {
					c = g - t
				} else {
					c = g + 1 - (t - G + 1)
				}
				lo, hi := p.groupChunk(b, c, G)
				step = append(step, hop{from: from, lo: lo, hi: hi, tag: 1 + ((c%G)+G)%G,
					adding: t < G-1 && last, round: t == G-1 && k == 0})
			}
			steps = append(steps, step)
		}
	}
	return steps
}

// hierarchical runs AllReduce's hierarchical plans.
func hierarchical[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T) error {
	if r.Size == 1 {
		return nil
	}
	tags := 1 + len(p.groups())
	for b := range p.Buckets {
		for s, hops := range hierarchicalSteps(p, b) {
			for _, h := range hops {
				if h.from%r.Size == r.Rank {
					if err := sendHierarchical(ctx, r, step, base+b*tags+h.tag, s, h, vals); err != nil {
						return err
					}
				}
			}
			for _, h := range hops {
				if (h.from+1)%r.Size == r.Rank {
					if err := recvHierarchical(ctx, r, step, base+b*tags+h.tag, s, h, vals); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

func sendHierarchical[T float32 | float64](ctx context.Context, r *Ring, step int64, tag, phase int, h hop, vals []T) error {
	v := vals[h.lo:h.hi]
	if h.round {
		// The leader keeps what the others will receive: rounded to the
		// wire's precision, or replicas would drift apart under compression.
		roundToWire(r.DType, v)
	}
	if h.copied {
		v = append([]T(nil), v...)
	}
	if r.streams() {
		return sendStream(ctx, r, step, phase, tag, v)
	}
	return r.send(ctx, step, phase, tag, v)
}

func recvHierarchical[T float32 | float64](ctx context.Context, r *Ring, step int64, tag, phase int, h hop, vals []T) error {
	v := vals[h.lo:h.hi]
	if r.streams() {
		return recvStream(ctx, r, step, phase, tag, v, h.adding)
	}
	if h.adding {
		// The running sum plus this rank's values: IEEE addition commutes.
		return recvInto(ctx, r, step, phase, tag, v, add[T])
	}
	return recvInto(ctx, r, step, phase, tag, v, set[T])
}

// sumHierarchical sets out to the hierarchical fold of parts: each host's
// parts left to right, then the hosts' sums round the leaders' ring.
func sumHierarchical[T float32 | float64](p Plan, parts [][]T, out []T) {
	gs := p.groups()
	G := len(gs)
	hosts := make([][]T, G)
	for g, rg := range gs {
		hosts[g] = make([]T, p.N)
		sumInRankOrder(parts[rg[0]:rg[1]], hosts[g])
	}
	for b := range p.Buckets {
		for c := range G {
			lo, hi := p.groupChunk(b, c, G)
			acc := out[lo:hi]
			copy(acc, hosts[c][lo:hi])
			for k := 1; k < G; k++ {
				add(acc, hosts[(c+k)%G][lo:hi])
			}
		}
	}
}
