package stages

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/runlog"
)

// Data-parallel replicas. Each replica of a stage trains on its own share of
// every batch (its micro-batches are replica·m ... replica·m+m-1 of the
// global batch), so each ends the step's backward with its share's
// gradient. At each chunk's ReduceGrad op the stage hands that chunk's
// gradients to a reducer goroutine, which all-reduces them over the
// replicas' ring while the stage runs its remaining ops; the optimizer step
// (and a tied-weight exchange) waits for every reduction of the step. The
// sum follows the collective plan's fold order, which the reference
// reproduces in one process (reduceShares), so a run with replicas equals
// it bit for bit.

// ErrDiverged is the cause of a run stopped because a stage's replicas hold
// different weights: a deterministic fault that restarting would repeat.
var ErrDiverged = errors.New("the replicas have diverged")

// reduction is one chunk's all-reduce in progress. Its buckets go to the
// reducer in backward order, a few at a time (jobs): those whose elements
// the chunk's last weight pass has finished while it computes the earlier
// layers' (GradientWatcher), the rest at the chunk's ReduceGrad op. Each
// bucket is folded as the whole plan folds it (collective.Plan.Slice), so
// the order the buckets go in changes no bit.
type reduction struct {
	step  int64
	chunk int
	flat  any // []float32 or []float64: the chunk's gradients, flattened
	start time.Time
	end   time.Time
	sent  int64
	err   error
	done  chan struct{}
	// handed is the first bucket handed to the reducer (buckets
	// [handed, B) are); flatFrom the first element copied into flat.
	handed, flatFrom int
}

// job is buckets [lo, hi) of a reduction; last closes it.
type job struct {
	red    *reduction
	lo, hi int
	last   bool
}

// reducer runs the stage's all-reduces one after another, in the order the
// stage hands them over: every replica does so in schedule order, so the
// ring's messages never interleave.
type reducer struct {
	ring *collective.Ring
	// scatter runs the reduce-scatter alone: each replica then holds the
	// whole sum of its own chunks only (zero.go).
	scatter bool
	plans   []collective.Plan
	bases   []int // first tag of each chunk's plan
	jobs    chan job
	pending []*reduction
	// open is each chunk's reduction of the step whose buckets are not
	// all handed over yet (nil when none).
	open []*reduction
	// buffers are each chunk's two flat vectors, used on alternate steps:
	// a ring may still be sending from one until its next all-reduce has
	// returned (collective.AllReduce).
	buffers [][2]any
}

func newReducer(l *Layout, ring *collective.Ring) *reducer {
	n := len(l.Plans)
	rd := &reducer{ring: ring, plans: l.Plans, jobs: make(chan job, 4*n), open: make([]*reduction, n), buffers: make([][2]any, n)}
	base := 0
	for _, p := range l.Plans {
		rd.bases = append(rd.bases, base)
		base += p.Tags()
	}
	return rd
}

// run serves jobs until ctx ends or jobs is closed; it owns the ring while
// a job is in progress.
func (rd *reducer) run(ctx context.Context) {
	for j := range rd.jobs {
		r := j.red
		if j.lo < j.hi && r.err == nil {
			before := rd.ring.Sent
			switch v := r.flat.(type) {
			case []float32:
				r.err = reduceChunk(ctx, rd, r.step, r.chunk, j.lo, j.hi, v)
			case []float64:
				r.err = reduceChunk(ctx, rd, r.step, r.chunk, j.lo, j.hi, v)
			}
			r.sent += rd.ring.Sent - before
		}
		if j.last {
			r.end = time.Now()
			close(r.done)
		}
	}
}

// flatten copies grads into one vector, reusing buf when it fits.
func flatten(grads []*tensor.Dense, buf any) any {
	n := 0
	for _, g := range grads {
		n += g.Shape().TotalSize()
	}
	switch grads[0].Data().(type) {
	case []float64:
		out, _ := buf.([]float64)
		if len(out) != n {
			out = make([]float64, n)
		}
		o := 0
		for _, g := range grads {
			o += copy(out[o:], g.Data().([]float64))
		}
		return out
	default:
		out, _ := buf.([]float32)
		if len(out) != n {
			out = make([]float32, n)
		}
		o := 0
		for _, g := range grads {
			o += copy(out[o:], g.Data().([]float32))
		}
		return out
	}
}

// flattenRange copies elements [lo, hi) of grads, taken as one vector of n,
// into flat (made when buf does not hold n).
func flattenRange(grads []*tensor.Dense, buf any, n, lo, hi int) any {
	switch grads[0].Data().(type) {
	case []float64:
		out, _ := buf.([]float64)
		if len(out) != n {
			out = make([]float64, n)
		}
		copyRange(grads, out, lo, hi)
		return out
	default:
		out, _ := buf.([]float32)
		if len(out) != n {
			out = make([]float32, n)
		}
		copyRange(grads, out, lo, hi)
		return out
	}
}

func copyRange[T float32 | float64](grads []*tensor.Dense, out []T, lo, hi int) {
	off := 0
	for _, g := range grads {
		d := g.Data().([]T)
		if a, b := max(lo, off), min(hi, off+len(d)); a < b {
			copy(out[a:b], d[a-off:b-off])
		}
		off += len(d)
	}
}

// unflatten copies a flat vector back into grads.
func unflatten(flat any, grads []*tensor.Dense) {
	o := 0
	for _, g := range grads {
		switch v := flat.(type) {
		case []float32:
			o += copy(g.Data().([]float32), v[o:])
		case []float64:
			o += copy(g.Data().([]float64), v[o:])
		}
	}
}

// stepGrads is a chunk's summed gradients in host memory: as the chunk
// hands them out, and their tensors in order.
func stepGrads(s compute.Stage) ([]compute.Weight, []*tensor.Dense, error) {
	ws, err := s.Gradients()
	if err != nil {
		return nil, nil, err
	}
	out := make([]*tensor.Dense, len(ws))
	for i, w := range ws {
		out[i] = w.Value
	}
	return ws, out, nil
}

// replicaSync is what a stage does with its replicas each step: it
// all-reduces each chunk's gradients over their ring, gathers the
// micro-batch losses on the stage that computes them, and compares the
// weights. In the one-process reference of a config with replicas it sums
// the replicas' shares in their plans' order instead. The stage's goroutine
// calls it; its reducer goroutine (run) owns the ring while a job is in
// progress.
type replicaSync struct {
	stage, replica int
	layout         *Layout
	chunks         []compute.Stage
	microBatches   int // of one replica
	checkEvery     int // all_reduce.check_every
	act            *activity
	live           *Metrics

	ring    *collective.Ring // nil in the reference
	reducer *reducer         // nil in the reference
	// perLayer starts each bucket as the chunk's last weight pass finishes
	// its layers (all_reduce.overlap: layer).
	perLayer bool
	// shares holds, in the reference, each replica's share of the step's
	// gradients; gradsDone counts the micro-batches whose gradients are in.
	shares    []any
	gradsDone int

	// sharded says each chunk's optimizer keeps this replica's shard of
	// the state (zero.go).
	sharded bool
	owned   [][][2]int // per chunk, the elements this replica updates
}

// newReplicaSync joins the stage's replicas: over their ring, or in the
// reference as shares. It returns nil for a config without replicas.
func newReplicaSync(o Options, l *Layout, cfg *configs.Config, chunks []compute.Stage, act *activity, live *Metrics) (*replicaSync, error) {
	if l.Replicas < 2 || (cfg.PSEnabled() && !l.Reference) {
		return nil, nil // a single replica, or workers of parameter servers (ps.go)
	}
	rs := &replicaSync{stage: l.Stage, replica: l.Replica, layout: l, chunks: chunks, microBatches: cfg.Data.MicroBatches,
		checkEvery: cfg.AllReduce.CheckEvery, act: act, live: live}
	if l.Reference {
		rs.shares = make([]any, l.Replicas)
		return rs, nil
	}
	if o.ReplicaNext == nil || o.ReplicaPrev == nil {
		return nil, fmt.Errorf("%s: no links to the other replicas", cfg.ProcessName(l.Stage, l.Replica))
	}
	stage := l.Stage
	rs.ring = &collective.Ring{Rank: l.Replica, Size: l.Replicas, Next: o.ReplicaNext, Prev: o.ReplicaPrev,
		DType: l.Reduce.DType, Timeout: cfg.Transport.RecvTimeout, Out: o.ReplicaOut, In: o.ReplicaIn,
		Name: func(k int) string { return fmt.Sprintf("stage %d replica %d", stage, k) }}
	rs.reducer = newReducer(l, rs.ring)
	rs.perLayer = cfg.AllReduce.Overlap == "layer"
	live.sentOn("replicas", 0)
	return rs, nil
}

// ringOrNil is the replicas' ring, nil without one (and in the reference).
func (rs *replicaSync) ringOrNil() *collective.Ring {
	if rs == nil {
		return nil
	}
	return rs.ring
}

// start runs the reducer goroutine until the returned stop is called.
func (rs *replicaSync) start(ctx context.Context) (stop func()) {
	if rs == nil || rs.reducer == nil {
		return func() {}
	}
	rd := rs.reducer
	reduceCtx, stopReducing := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		rd.run(reduceCtx)
	}()
	return func() {
		stopReducing()
		close(rd.jobs)
		<-stopped
	}
}

// reduce runs a ReduceGrad op: over the ring it hands the chunk's
// gradients, final for the step, to the reducer (the buckets a weight pass
// has not handed over already); in the reference it sums the replicas'
// shares.
func (rs *replicaSync) reduce(ctx context.Context, step, chunk int) error {
	if rs.shares != nil && rs.layout.Config.PSEnabled() {
		return rs.sumWorkerShares(step, chunk)
	}
	if rs.shares != nil {
		return rs.reduceShares(chunk)
	}
	return rs.handOver(ctx, step, chunk, 0, true)
}

// handOver hands the reducer every bucket of the chunk's gradients not yet
// handed that lies in elements [from, N), final for the step, last bucket
// first; last closes the step's reduction of the chunk (from is then 0).
func (rs *replicaSync) handOver(ctx context.Context, step, chunk, from int, last bool) error {
	rd := rs.reducer
	p := rd.plans[chunk]
	r := rd.open[chunk]
	if r == nil {
		r = &reduction{step: int64(step), chunk: chunk, start: time.Now(), done: make(chan struct{}), handed: len(p.Buckets), flatFrom: p.N}
		rd.open[chunk] = r
		rd.pending = append(rd.pending, r)
	}
	lo := r.handed
	for lo > 0 && p.Buckets[lo-1][0] >= from {
		lo--
	}
	if lo == r.handed && !last {
		return nil
	}
	if lo < r.handed {
		_, grads, err := stepGrads(rs.chunks[chunk])
		if err != nil {
			return err
		}
		buf := &rd.buffers[chunk][step%2]
		*buf = flattenRange(grads, *buf, p.N, p.Buckets[lo][0], r.flatFrom)
		r.flat, r.flatFrom = *buf, p.Buckets[lo][0]
	} else if r.flat == nil {
		// A chunk without gradient elements still closes its reduction.
		_, grads, err := stepGrads(rs.chunks[chunk])
		if err != nil {
			return err
		}
		buf := &rd.buffers[chunk][step%2]
		*buf = flattenRange(grads, *buf, p.N, 0, 0)
		r.flat = *buf
	}
	j := job{red: r, lo: lo, hi: r.handed, last: last}
	r.handed = lo
	if last {
		rd.open[chunk] = nil
	}
	select {
	case rd.jobs <- j:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}

// watch returns what a chunk's last weight pass of the step reports its
// finished weights to (compute.GradientWatcher): the buckets lying wholly in
// them go to the reducer at once. The first error is kept in *err, for the
// pass's caller to return.
func (rs *replicaSync) watch(ctx context.Context, step, chunk int, err *error) func(first int) {
	ws, e := rs.chunks[chunk].Gradients()
	if e != nil {
		*err = e
		return func(int) {}
	}
	offsets := make([]int, len(ws)+1)
	for i, w := range ws {
		offsets[i+1] = offsets[i] + w.Value.Shape().TotalSize()
	}
	return func(first int) {
		if *err == nil && first >= 0 && first < len(offsets) {
			*err = rs.handOver(ctx, step, chunk, offsets[first], false)
		}
	}
}

// await waits for the step's all-reduces, puts the sums in place of the
// chunks' gradients and hands each finished reduction to done.
func (rs *replicaSync) await(ctx context.Context, done func(*reduction, time.Duration) error) error {
	if rs == nil || rs.reducer == nil {
		return nil
	}
	rd := rs.reducer
	for len(rd.pending) > 0 {
		j := rd.pending[0]
		t0 := time.Now()
		rs.waitOnRing()
		select {
		case <-j.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		rd.pending = rd.pending[1:]
		if j.err != nil {
			// The wait stays marked: the failure's status names the replica.
			return fmt.Errorf("all-reduce of chunk %d's gradients: %w", j.chunk, j.err)
		}
		rs.act.resumed()
		ws, grads, err := stepGrads(rs.chunks[j.chunk])
		if err != nil {
			return err
		}
		rs.unflattenSums(j, grads)
		if err := rs.chunks[j.chunk].LoadGradients(ws); err != nil {
			return err
		}
		if err := done(j, time.Since(t0)); err != nil {
			return err
		}
	}
	return nil
}

// waitOnRing marks a wait on the replicas' ring, which hears the previous
// replica of the stage: a status query then points the launcher at it.
func (rs *replicaSync) waitOnRing() {
	rs.act.waitOnReplica(rs.stage, (rs.replica-1+rs.ring.Size)%rs.ring.Size)
}

// gradDone notes that one micro-batch's gradients are complete. The
// reference then files away each replica's share as soon as its last
// micro-batch is in, and starts the next from zero, as that replica's own
// process would.
func (rs *replicaSync) gradDone(chunk int) error {
	if rs == nil || rs.shares == nil {
		return nil
	}
	rs.gradsDone++
	if rs.gradsDone%rs.microBatches != 0 {
		return nil
	}
	share := rs.gradsDone/rs.microBatches - 1
	ws, grads, err := stepGrads(rs.chunks[chunk])
	if err != nil {
		return err
	}
	rs.shares[share] = flatten(grads, rs.shares[share])
	for _, g := range grads {
		g.Zero()
	}
	return rs.chunks[chunk].LoadGradients(ws)
}

// reduceShares sums the replicas' shares of the reference's gradients piece
// by piece, each model stage's with the plan its replicas use.
func (rs *replicaSync) reduceShares(chunk int) error {
	ws, grads, err := stepGrads(rs.chunks[chunk])
	if err != nil {
		return err
	}
	out := flatten(grads, nil)
	lo := 0
	for _, p := range rs.layout.Plans {
		hi := lo + p.N
		switch v := out.(type) {
		case []float32:
			err = collective.Sum(p, sharesOf[float32](rs.shares, lo, hi), v[lo:hi])
		case []float64:
			err = collective.Sum(p, sharesOf[float64](rs.shares, lo, hi), v[lo:hi])
		}
		if err != nil {
			return err
		}
		lo = hi
	}
	unflatten(out, grads)
	rs.gradsDone = 0
	return rs.chunks[chunk].LoadGradients(ws)
}

func sharesOf[T float32 | float64](shares []any, lo, hi int) [][]T {
	out := make([][]T, len(shares))
	for i, s := range shares {
		out[i] = s.([]T)[lo:hi]
	}
	return out
}

// gather sends mine round the replicas' ring as control message tag
// (lossTag, digestTag) of step and returns every replica's, marking the
// wait on the ring for status queries.
func (rs *replicaSync) gather(ctx context.Context, step int64, tag int, mine []byte) ([][]byte, error) {
	rs.waitOnRing()
	all, err := rs.ring.AllGather(ctx, step, rs.layout.controlBase()+tag, mine)
	if err == nil {
		rs.act.resumed()
	}
	return all, err
}

// gatherLosses returns every replica's micro-batch losses, in replica order
// (the global batch's micro-batch order), given this replica's.
func (rs *replicaSync) gatherLosses(ctx context.Context, step int, losses []float64) ([]float64, error) {
	if rs == nil || rs.ring == nil {
		return losses, nil
	}
	mine := make([]byte, 8*len(losses))
	for i, l := range losses {
		binary.LittleEndian.PutUint64(mine[8*i:], math.Float64bits(l))
	}
	all, err := rs.gather(ctx, int64(step), lossTag, mine)
	if err != nil {
		return nil, fmt.Errorf("gathering the replicas' losses: %w", err)
	}
	losses = losses[:0]
	for _, b := range all {
		for i := 0; i+8 <= len(b); i += 8 {
			losses = append(losses, math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
		}
	}
	return losses, nil
}

// check compares a digest of the stage's weights among its replicas, which
// must hold the same bits after every step, every all_reduce.check_every
// steps.
func (rs *replicaSync) check(ctx context.Context, step int) error {
	if rs == nil || rs.ring == nil || rs.checkEvery == 0 || (step+1)%rs.checkEvery != 0 {
		return nil
	}
	mine := rs.weightDigest()
	all, err := rs.gather(ctx, int64(step), digestTag, mine)
	if err != nil {
		return fmt.Errorf("comparing the replicas' weights: %w", err)
	}
	for i := 1; i < len(all); i++ {
		if !bytes.Equal(all[i], all[0]) {
			return fmt.Errorf("replicas 0 and %d of stage %d hold different weights after step %d (digests %s and %s): %w",
				i, rs.stage, step+1, hex.EncodeToString(all[0][:6]), hex.EncodeToString(all[i][:6]), ErrDiverged)
		}
	}
	return nil
}

// weightDigest is a SHA-256 of every weight's bits, in order.
func (rs *replicaSync) weightDigest() []byte {
	h := sha256.New()
	var buf []byte
	for _, e := range rs.chunks {
		for _, w := range e.Weights() {
			buf = buf[:0]
			switch v := w.Value.Data().(type) {
			case []float32:
				for _, x := range v {
					buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(x))
				}
			case []float64:
				for _, x := range v {
					buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(x))
				}
			}
			h.Write(buf)
		}
	}
	return h.Sum(nil)
}

// ReduceGrad runs a ReduceGrad op (Computer): with replicas it starts the
// all-reduce of the chunk's gradients, which are final for the step; in the
// reference of a config with replicas it sums the replicas' shares.
func (r *Runtime) ReduceGrad(ctx context.Context, step, chunk int) error {
	if r.replicas == nil {
		return nil
	}
	return r.replicas.reduce(ctx, step, chunk)
}

// awaitReductions waits for the step's all-reduces and logs each as an
// event.
func (r *Runtime) awaitReductions(ctx context.Context, step int) error {
	return r.replicas.await(ctx, func(j *reduction, wait time.Duration) error {
		ev := runlog.Event{Stage: r.stage, Replica: r.replica, Step: step, Kind: runlog.AllReduce, Chunk: j.chunk,
			StartNS: j.start.UnixNano(), EndNS: j.end.UnixNano(), WaitNS: wait.Nanoseconds(), BytesSent: j.sent}
		r.live.action(runlog.AllReduce, j.end.Sub(j.start), 0, r.inFlight())
		r.live.sentOn("replicas", j.sent)
		return r.events.add(ev)
	})
}

// gatherLosses makes r.losses every replica's micro-batch losses on the
// stage that computes the loss.
func (r *Runtime) gatherLosses(ctx context.Context, step int) error {
	if !r.holdsLoss() {
		return nil
	}
	all, err := r.replicas.gatherLosses(ctx, step, r.losses)
	r.losses = all
	return err
}
