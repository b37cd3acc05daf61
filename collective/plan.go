// Package collective sums gradients across the data-parallel replicas of one
// pipeline stage with a ring all-reduce (a reduce-scatter, then an
// all-gather) over transport links, bucket by bucket.
//
// The sum is deterministic: every element is folded in an order fixed by the
// Plan alone (Sum computes the same bits in one process), so a run with
// replicas can be checked bit for bit against one process that holds every
// replica's share of the batch. In a ring, chunk c of a bucket starts at rank
// c and collects ranks c+1, c+2, ... in turn, so its fold is
// ((g[c] + g[c+1]) + g[c+2]) + ... + g[c-1] (indices mod R), and rank c-1
// ends up holding it. With two replicas the order cannot matter (IEEE
// addition commutes); with more it is the plan's, not the rank order.
//
// A Ring is used by one goroutine at a time; it owns nothing but its
// position and borrows the links, which belong to the caller.
package collective

import (
	"fmt"

	"github.com/pipetrain/pipetrain/engine"
)

// Plan fixes how a vector of N elements is all-reduced among Ranks ranks:
// cut into buckets of at most BucketElems elements, in order, each bucket cut
// into Ranks chunks as equal as can be (the first ones one longer). Every
// rank must use the same plan; the ring links' handshake checks it (Shapes).
type Plan struct {
	N, Ranks, BucketElems int
	Buckets               [][2]int // half-open element ranges
	// Algorithm is how the buckets are reduced ("": RingAlgorithm).
	Algorithm Algorithm
	// Groups are the sizes of the runs of consecutive ranks that share a
	// host, in rank order (WithGroups): the hierarchical all-reduce's
	// hosts. None: one host.
	Groups []int
}

// BucketElems is how many elements of elemSize bytes a bucket of at most
// bucketBytes holds: whole elements, and at least one. The replicas' plans
// (NewPlan) and every model of their cost cut buckets with it.
func BucketElems(bucketBytes, elemSize int) int { return max(1, bucketBytes/elemSize) }

// NewPlan plans an all-reduce of n elements among ranks in buckets of at
// most bucketElems (0: one bucket).
func NewPlan(n, bucketElems, ranks int) (Plan, error) {
	if ranks < 1 || n < 0 || bucketElems < 0 {
		return Plan{}, fmt.Errorf("collective: plan of %d elements among %d ranks in buckets of %d", n, ranks, bucketElems)
	}
	if bucketElems == 0 || bucketElems > n {
		bucketElems = max(n, 1)
	}
	p := Plan{N: n, Ranks: ranks, BucketElems: bucketElems}
	for lo := 0; lo < n; lo += bucketElems {
		p.Buckets = append(p.Buckets, [2]int{lo, min(n, lo+bucketElems)})
	}
	return p, nil
}

// Chunk is the element range of chunk c of bucket b.
func (p Plan) Chunk(b, c int) (lo, hi int) {
	start, end := p.Buckets[b][0], p.Buckets[b][1]
	n, r := end-start, p.Ranks
	size, extra := n/r, n%r
	lo = start + c*size + min(c, extra)
	hi = lo + size
	if c < extra {
		hi++
	}
	return lo, hi
}

// Tags is the number of message tags the plan uses: one per chunk of each
// bucket in a ring, one per bucket and per chunk among hosts in a
// hierarchical plan, one per bucket otherwise (whole buckets travel).
func (p Plan) Tags() int {
	if p.Algorithm == Hierarchical {
		return len(p.Buckets) * (1 + len(p.groups()))
	}
	if !p.ring() {
		return len(p.Buckets)
	}
	return len(p.Buckets) * p.Ranks
}

// Shapes lists, by tag, the shape of the message carrying that chunk: what
// the ring links' handshakes compare, so replicas with different plans (a
// different model split or bucket size) fail at connection, not mid-step.
func (p Plan) Shapes() [][]int {
	if p.Algorithm == Hierarchical {
		return hierarchicalShapes(p)
	}
	out := make([][]int, 0, p.Tags())
	if !p.ring() {
		for _, b := range p.Buckets {
			out = append(out, []int{b[1] - b[0]})
		}
		return out
	}
	for b := range p.Buckets {
		for c := range p.Ranks {
			lo, hi := p.Chunk(b, c)
			out = append(out, []int{hi - lo})
		}
	}
	return out
}

// Sum writes into out the element-wise sum of parts (one per rank, each of
// length N), folded in the order the plan's all-reduce folds it.
func Sum[T float32 | float64](p Plan, parts [][]T, out []T) error {
	if len(parts) != p.Ranks {
		return fmt.Errorf("collective: %d parts for a plan among %d ranks", len(parts), p.Ranks)
	}
	for r, part := range parts {
		if len(part) != p.N {
			return fmt.Errorf("collective: part %d has %d elements, the plan %d", r, len(part), p.N)
		}
	}
	if len(out) != p.N {
		return fmt.Errorf("collective: output of %d elements, the plan %d", len(out), p.N)
	}
	switch p.Algorithm {
	case ReduceToOne:
		sumInRankOrder(parts, out)
		return nil
	case Hierarchical:
		sumHierarchical(p, parts, out)
		return nil
	}
	for b := range p.Buckets {
		for c := range p.Ranks {
			lo, hi := p.Chunk(b, c)
			acc := out[lo:hi]
			copy(acc, parts[c][lo:hi])
			for k := 1; k < p.Ranks; k++ {
				add(acc, parts[(c+k)%p.Ranks][lo:hi])
			}
		}
	}
	return nil
}

// add sets acc[i] = acc[i] + v[i]: the running sum first, as the ring adds.
// float32 sums take the engine's vector kernel, whose lanes add as this
// loop does.
func add[T float32 | float64](acc, v []T) {
	if a, ok := any(acc).([]float32); ok {
		engine.AddFloat32s(a, any(v).([]float32))
		return
	}
	v = v[:len(acc)]
	for i := range acc {
		acc[i] += v[i]
	}
}

// Slice is the plan of buckets [lo, hi) alone, over the same N elements:
// AllReduce with it and base+lo·Ranks runs exactly those buckets' messages,
// tagged and folded as the whole plan's, so a vector may be reduced a few
// buckets at a time, in any order, with the same bits.
func (p Plan) Slice(lo, hi int) Plan {
	q := p
	q.Buckets = p.Buckets[lo:hi]
	return q
}
