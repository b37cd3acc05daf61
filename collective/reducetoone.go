package collective

import "context"

// Reduce-to-one (all_reduce.algorithm: reduce-to-one, TensorFlow's
// ReductionToOneDevice) over the ring's own links, which join each rank to
// its neighbours only. Each bucket travels whole, as one message, along
// 2R-2 hops of the ring: hop h goes from rank h mod R to rank h+1 mod R.
//
//   - Hops 0 to R-2 reduce: rank 0 sends its part, and each rank i after it
//     adds its part to the running sum it receives and passes it on, so
//     rank R-1 ends with ((g[0] + g[1]) + g[2]) + ... + g[R-1], the ranks'
//     parts folded left to right in rank order.
//   - Hops R-1 to 2R-3 broadcast: rank R-1 sends the sum to rank 0, which
//     stores it and passes it on, round to rank R-2.
//
// So every element of every bucket is folded in rank order whatever the
// bucket size (sumInRankOrder computes it in one process), where the ring
// folds each chunk from a different rank. The price is traffic: each
// rank sends about 2N values per all-reduce, against the ring's
// 2N(R-1)/R, and a bucket's last hop waits for 2R-2 hops of whole buckets.
//
// Buckets follow one another a hop apart: at step k bucket b is at hop
// k-b. In each step every rank first sends, then receives, its buckets'
// messages of that step, in bucket order, so each link carries at most two
// messages per step (hops h and h+R) and they arrive in the order they are
// awaited; two never fill a link's queue.
//
// The rules of AllReduce's buffers hold as for the ring: each rank's
// values change after they were sent only when the sum comes back, which
// depends on the next rank having used them; and every rank's last
// receive of a call depends on the next rank having started that call,
// so having finished the previous one.
func reduceToOne[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T) error {
	R := r.Size
	if R == 1 {
		return nil
	}
	hops, B := 2*(R-1), len(p.Buckets)
	for k := 0; k < B-1+hops; k++ {
		lo, hi := max(0, k-hops+1), min(B-1, k)
		for b := lo; b <= hi; b++ {
			if h := k - b; h%R == r.Rank {
				if err := sendHop(ctx, r, step, base, p, b, h, vals); err != nil {
					return err
				}
			}
		}
		for b := lo; b <= hi; b++ {
			if h := k - b; (h+1)%R == r.Rank {
				if err := recvHop(ctx, r, step, base, p, b, h, vals); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// sendHop sends bucket b's values on hop h, tagged base+b with phase h.
func sendHop[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, b, h int, vals []T) error {
	v := vals[p.Buckets[b][0]:p.Buckets[b][1]]
	if h == r.Size-1 {
		// The last rank keeps what the others will receive: rounded to
		// the wire's precision, or replicas would drift apart under
		// compression.
		roundToWire(r.DType, v)
	}
	if r.streams() {
		return sendStream(ctx, r, step, h, base+b, v)
	}
	return r.send(ctx, step, h, base+b, v)
}

// recvHop receives bucket b's values of hop h: a running sum to add to
// during the reduction, the sum to store during the broadcast.
func recvHop[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, b, h int, vals []T) error {
	v := vals[p.Buckets[b][0]:p.Buckets[b][1]]
	summing := h < r.Size-1
	if r.streams() {
		return recvStream(ctx, r, step, h, base+b, v, summing)
	}
	if summing {
		// The part plus the running sum: IEEE addition commutes, so these
		// are the bits of the running sum plus the part.
		return recvInto(ctx, r, step, h, base+b, v, add[T])
	}
	return recvInto(ctx, r, step, h, base+b, v, set[T])
}

// sumInRankOrder sets out to ((parts[0] + parts[1]) + ...) + parts[R-1],
// element by element: reduce-to-one's fold.
func sumInRankOrder[T float32 | float64](parts [][]T, out []T) {
	copy(out, parts[0])
	for _, part := range parts[1:] {
		add(out, part)
	}
}
