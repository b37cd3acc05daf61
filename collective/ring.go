package collective

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

// Ring is one rank's place in a ring of Size ranks: it sends to rank
// Rank+1 over Next and hears rank Rank-1 over Prev (indices mod Size). Next
// is the link this rank dialed, so its messages travel as
// transport.Activation; Prev is the one it accepted. With Size 1 there are
// no links and every operation is local.
type Ring struct {
	Rank, Size int
	Next, Prev transport.Link
	// DType is the links' wire dtype: Float64 for float64 vectors; Float32,
	// or BFloat16 / Float16 under compression, for float32 vectors.
	DType transport.DType
	// Timeout bounds each wait for the previous rank (0: none but ctx).
	Timeout time.Duration
	// Name says who the ranks are in errors ("replica %d of stage 2").
	Name func(rank int) string
	// Sent counts the payload bytes this rank has sent.
	Sent int64
	// Out and In, when both are set, carry AllReduce's messages instead of
	// Next and Prev: byte streams to the next rank and from the previous
	// one (all_reduce.transport: stream), beside the links, which still
	// carry AllGather's control messages.
	Out     *transport.StreamOut
	In      *transport.StreamIn
	scratch []byte // In's receive block (scratchFor)
}

func (r *Ring) name(rank int) string {
	rank = (rank%r.Size + r.Size) % r.Size
	if r.Name != nil {
		return r.Name(rank)
	}
	return fmt.Sprintf("rank %d", rank)
}

// AllReduce replaces vals, this rank's part, with the sum of every rank's
// part in the plan's fold order (see Sum), bucket after bucket. Messages are
// tagged step and, as transport chunk, base plus the plan's tag, so one link
// can carry several plans (a stage's model chunks) and control messages.
// A plan of another algorithm than the ring runs that algorithm
// (reduceToOne), under the same rules.
//
// Uncompressed, the messages are sent from vals' own memory, uncopied: a
// link may still be sending the last of them when AllReduce returns, so
// vals must not change until the next AllReduce on this ring has returned
// (by then the next rank has taken every message of this one: it took part
// in the next). Alternating two buffers is enough. Within one call no part
// of vals changes after it was handed to the link: a chunk is sent once its
// running sum is complete, and is overwritten by the all-gather only after
// the rank it went to has used it, which the gathered sum depends on.
func AllReduce[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T) error {
	if err := r.check(p, len(vals)); err != nil {
		return err
	}
	switch p.Algorithm {
	case ReduceToOne:
		return reduceToOne(ctx, r, step, base, p, vals)
	case Hierarchical:
		return hierarchical(ctx, r, step, base, p, vals)
	}
	return phases(ctx, r, step, base, p, vals, 0, 2*(r.Size-1))
}

// ReduceScatter runs the reduce-scatter half of AllReduce, with its
// messages: afterwards each rank's vals hold the whole sum of the chunks it
// owns (Owned), folded as AllReduce folds them, and running sums elsewhere.
// vals is sent from as AllReduce sends from it.
func ReduceScatter[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T) error {
	if err := r.checkRing(p, len(vals)); err != nil {
		return err
	}
	return phases(ctx, r, step, base, p, vals, 0, r.Size-1)
}

// AllGatherOwned passes round the chunks each rank owns (Owned): the
// all-gather half of AllReduce, with its messages, so that afterwards every
// rank's vals hold each owner's chunks. A rank that updated its own chunks
// from a reduce-scattered sum (a sharded optimizer) shares them this way.
// vals is sent from as AllReduce sends from it. Under a compressed wire
// dtype the chunks would arrive rounded: callers gather at full precision.
func AllGatherOwned[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T) error {
	if err := r.checkRing(p, len(vals)); err != nil {
		return err
	}
	return phases(ctx, r, step, base, p, vals, r.Size-1, 2*(r.Size-1))
}

// Owned is the element ranges rank holds the whole sum of after the
// reduce-scatter half of a ring all-reduce with plan p: chunk rank+1 of
// each bucket, in ascending order.
func Owned(p Plan, rank int) [][2]int {
	out := make([][2]int, 0, len(p.Buckets))
	for b := range p.Buckets {
		lo, hi := p.Chunk(b, (rank+1)%p.Ranks)
		out = append(out, [2]int{lo, hi})
	}
	return out
}

// checkRing is check for the ring's halves, which other algorithms lack.
func (r *Ring) checkRing(p Plan, n int) error {
	if !p.ring() {
		return fmt.Errorf("the %s all-reduce has no ring halves (reduce-scatter, all-gather)", p.Algorithm)
	}
	return r.check(p, n)
}

func (r *Ring) check(p Plan, n int) error {
	if n != p.N {
		return fmt.Errorf("all-reduce of %d elements with a plan for %d", n, p.N)
	}
	if p.Ranks != r.Size {
		return fmt.Errorf("all-reduce among %d ranks with a plan for %d", r.Size, p.Ranks)
	}
	return nil
}

// phases runs phases [from, to) of each bucket's ring (the reduce-scatter's
// are 0 to R-2, the all-gather's R-1 to 2R-3) over vals.
func phases[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, vals []T, from, to int) error {
	if r.Size == 1 {
		return nil
	}
	// Two buckets are in flight at once, the second a half-turn behind the
	// first, so one bucket's messages cross the link while the other's are
	// summed. Every rank runs the same order, so messages arrive in the
	// order they are awaited; two in flight never fill a link's queue.
	P := to - from     // phases per bucket
	lag := (P + 1) / 2 // steps between the starts of successive buckets
	B := len(p.Buckets)
	last := (B-1)*lag + P
	for k := 0; k < last; k++ {
		lo, hi := max(0, (k-P+lag)/lag), min(B-1, k/lag)
		for b := lo; b <= hi; b++ {
			if t := k - b*lag; t >= 0 && t < P {
				if err := sendPhase(ctx, r, step, base, p, b, from+t, vals); err != nil {
					return err
				}
			}
		}
		for b := lo; b <= hi; b++ {
			if t := k - b*lag; t >= 0 && t < P {
				if err := recvPhase(ctx, r, step, base, p, b, from+t, vals); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// The two halves of the ring, phase by phase on bucket b. In the
// reduce-scatter (phases t < R-1) rank i hands its running sum of chunk i-t
// to the next rank, which adds its own part; after R-1 phases rank i holds
// the whole sum of chunk i+1. The all-gather (phases R-1+t) then passes the
// finished chunks round.

// bucketChunk is chunk c (mod R) of bucket b, and its message tag.
func bucketChunk[T float32 | float64](r *Ring, base int, p Plan, b, c int, vals []T) ([]T, int) {
	R := r.Size
	c = ((c % R) + R) % R
	lo, hi := p.Chunk(b, c)
	return vals[lo:hi], base + b*R + c
}

func sendPhase[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, b, t int, vals []T) error {
	R, i := r.Size, r.Rank
	c := i - t
	if t >= R-1 {
		c = i + 1 - (t - R + 1)
		if t == R-1 {
			// The owner keeps what the others will receive: rounded to the
			// wire's precision, or replicas would drift apart under compression.
			own, _ := bucketChunk(r, base, p, b, i+1, vals)
			roundToWire(r.DType, own)
		}
	}
	v, tag := bucketChunk(r, base, p, b, c, vals)
	if r.streams() {
		return sendStream(ctx, r, step, t, tag, v)
	}
	return r.send(ctx, step, t, tag, v)
}

func recvPhase[T float32 | float64](ctx context.Context, r *Ring, step int64, base int, p Plan, b, t int, vals []T) error {
	R, i := r.Size, r.Rank
	if t < R-1 {
		v, tag := bucketChunk(r, base, p, b, i-t-1, vals)
		if r.streams() {
			return recvStream(ctx, r, step, t, tag, v, true)
		}
		return recvInto(ctx, r, step, t, tag, v, add[T])
	}
	v, tag := bucketChunk(r, base, p, b, i-(t-R+1), vals)
	if r.streams() {
		return recvStream(ctx, r, step, t, tag, v, false)
	}
	return recvInto(ctx, r, step, t, tag, v, set[T])
}

func set[T float32 | float64](dst, v []T) { copy(dst, v) }

// moveOnly sends and receives AllReduce's messages, phase by phase and
// bucket by bucket, discarding what arrives (Trial.RunLinksOnly).
func moveOnly(ctx context.Context, r *Ring, step int64, p Plan, vals []float32) error {
	if r.Size == 1 {
		return nil
	}
	if r.streams() {
		return moveOnlyStreams(ctx, r, step, p, vals)
	}
	for b := range p.Buckets {
		for t := range 2 * (r.Size - 1) {
			v, tag := bucketChunk(r, 0, p, b, r.Rank-t, vals)
			if err := r.send(ctx, step, t, tag, v); err != nil {
				return err
			}
			_, want := bucketChunk(r, 0, p, b, r.Rank-t-1, vals)
			m, err := r.recv(ctx, step, t, want)
			if err != nil {
				return err
			}
			m.Release()
		}
	}
	return nil
}

// send encodes vals in the wire dtype and queues them for the next rank.
func (r *Ring) send(ctx context.Context, step int64, phase, tag int, vals any) error {
	var t *transport.Tensor
	var err error
	switch v := vals.(type) {
	case []float32:
		if r.DType == transport.Float32 {
			t, err = transport.WrapFloat32s(transport.Activation, step, int32(phase), []int{len(v)}, v)
		} else {
			t, err = transport.FromFloat32sAs(r.DType, transport.Activation, step, int32(phase), []int{len(v)}, v)
		}
	case []float64:
		t, err = transport.WrapFloat64s(transport.Activation, step, int32(phase), []int{len(v)}, v)
	}
	if err != nil {
		return err
	}
	t.Chunk = int32(tag)
	if err := r.Next.Send(ctx, t); err != nil {
		return fmt.Errorf("to %s: %w", r.name(r.Rank+1), err)
	}
	r.Sent += int64(len(t.Data))
	return nil
}

// recvInto takes the previous rank's message for (step, phase, tag) and
// combines it into dst.
func recvInto[T float32 | float64](ctx context.Context, r *Ring, step int64, phase, tag int, dst []T, combine func(dst, v []T)) error {
	m, err := r.recv(ctx, step, phase, tag)
	if err != nil {
		return err
	}
	defer m.Release()
	var v []T
	switch any(dst).(type) {
	case []float32:
		v = any(m.AsFloat32s()).([]T)
	case []float64:
		v = any(m.Float64s()).([]T)
	}
	if len(v) != len(dst) {
		return fmt.Errorf("from %s: %d values for a chunk of %d", r.name(r.Rank-1), len(v), len(dst))
	}
	combine(dst, v)
	return nil
}

// recv waits for the previous rank's next message and checks that it is the
// one the ring expects now: both ranks run the same plan in the same order,
// so anything else is a bug or a mismatched peer, never to be summed.
func (r *Ring) recv(ctx context.Context, step int64, phase, tag int) (*transport.Tensor, error) {
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, r.Timeout, fmt.Errorf("%s sent nothing for %v", r.name(r.Rank-1), r.Timeout))
		defer cancel()
	}
	m, err := r.Prev.Recv(ctx)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && context.Cause(ctx) != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("from %s: %w", r.name(r.Rank-1), err)
	}
	if m.Step != step || int(m.MicroBatch) != phase || int(m.Chunk) != tag {
		m.Release()
		return nil, fmt.Errorf("from %s: got step %d phase %d tag %d, expected step %d phase %d tag %d",
			r.name(r.Rank-1), m.Step, m.MicroBatch, m.Chunk, step, phase, tag)
	}
	return m, nil
}

// roundToWire rounds float32 values to a 16-bit wire dtype and back, so a
// value kept locally equals the copies the other ranks receive.
func roundToWire(dt transport.DType, vals any) {
	v, ok := vals.([]float32)
	if !ok || dt == transport.Float32 || len(v) == 0 {
		return
	}
	t, err := transport.FromFloat32sAs(dt, transport.Activation, 0, 0, []int{len(v)}, v)
	if err != nil {
		return
	}
	copy(v, t.AsFloat32s())
}

// AllGather sends mine round the ring and returns every rank's block in rank
// order. Blocks travel as raw bytes in a message of the link's dtype, tagged
// tag; BytesShape gives the shape the handshake must list for it.
func (r *Ring) AllGather(ctx context.Context, step int64, tag int, mine []byte) ([][]byte, error) {
	out := make([][]byte, r.Size)
	out[r.Rank] = mine
	shape := BytesShape(r.DType, len(mine))
	padded := make([]byte, shape[0]*r.DType.Size())
	mod := func(k int) int { return ((k % r.Size) + r.Size) % r.Size }
	for t := 0; t < r.Size-1; t++ {
		copy(padded, out[mod(r.Rank-t)])
		m := &transport.Tensor{Kind: transport.Activation, Step: step, MicroBatch: int32(t), Chunk: int32(tag), DType: r.DType, Shape: shape, Data: padded}
		if err := r.Next.Send(ctx, m); err != nil {
			return nil, fmt.Errorf("to %s: %w", r.name(r.Rank+1), err)
		}
		padded = make([]byte, len(padded)) // the link may still hold the last one
		in, err := r.recv(ctx, step, t, tag)
		if err != nil {
			return nil, err
		}
		out[mod(r.Rank-t-1)] = append([]byte(nil), in.Data[:len(mine)]...)
		in.Release()
	}
	return out, nil
}

// BytesShape is the shape of a message of dtype dt that holds n bytes.
func BytesShape(dt transport.DType, n int) []int {
	s := dt.Size()
	return []int{max(1, (n+s-1)/s)}
}
