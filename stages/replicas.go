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
	"github.com/pipetrain/pipetrain/engine"
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

// reduction is one chunk's all-reduce in progress.
type reduction struct {
	step  int64
	chunk int
	flat  any // []float32 or []float64: the chunk's gradients, flattened
	start time.Time
	end   time.Time
	sent  int64
	err   error
	done  chan struct{}
}

// reducer runs the stage's all-reduces one after another, in the order the
// stage hands them over: every replica does so in schedule order, so the
// ring's messages never interleave.
type reducer struct {
	ring    *collective.Ring
	plans   []collective.Plan
	bases   []int // first tag of each chunk's plan
	jobs    chan *reduction
	pending []*reduction
	// buffers are each chunk's two flat vectors, used on alternate steps:
	// a ring may still be sending from one until its next all-reduce has
	// returned (collective.AllReduce).
	buffers [][2]any
}

func newReducer(l *Layout, ring *collective.Ring) *reducer {
	rd := &reducer{ring: ring, plans: l.Plans, jobs: make(chan *reduction, len(l.Plans)), buffers: make([][2]any, len(l.Plans))}
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
		s := j.step
		before := rd.ring.Sent
		switch v := j.flat.(type) {
		case []float32:
			j.err = collective.AllReduce(ctx, rd.ring, s, rd.bases[j.chunk], rd.plans[j.chunk], v)
		case []float64:
			j.err = collective.AllReduce(ctx, rd.ring, s, rd.bases[j.chunk], rd.plans[j.chunk], v)
		}
		j.sent, j.end = rd.ring.Sent-before, time.Now()
		close(j.done)
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

// denseGrads is an engine's summed gradients as dense tensors.
func denseGrads(e *engine.Engine) ([]*tensor.Dense, error) {
	vals, err := e.Gradients()
	if err != nil {
		return nil, err
	}
	out := make([]*tensor.Dense, len(vals))
	for i, v := range vals {
		d, ok := v.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("%s: gradient is a %T", e.Params()[i].Name(), v)
		}
		out[i] = d
	}
	return out, nil
}

// ReduceGrad runs a ReduceGrad op (Computer): with replicas it starts the
// all-reduce of the chunk's gradients, which are final for the step; in the
// reference of a config with replicas it sums the replicas' shares.
func (r *Runtime) ReduceGrad(ctx context.Context, step, chunk int) error {
	switch {
	case r.shares != nil:
		return r.reduceShares(chunk)
	case r.reducer == nil:
		return nil
	}
	grads, err := denseGrads(r.engines[chunk])
	if err != nil {
		return err
	}
	rd := r.reducer
	buf := &rd.buffers[chunk][step%2]
	*buf = flatten(grads, *buf)
	j := &reduction{step: int64(step), chunk: chunk, flat: *buf, start: time.Now(), done: make(chan struct{})}
	rd.pending = append(rd.pending, j)
	select {
	case rd.jobs <- j:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}

// awaitReductions waits for the step's all-reduces, puts the sums in place
// of the chunks' gradients and logs each as an event.
func (r *Runtime) awaitReductions(ctx context.Context, step int) error {
	if r.reducer == nil {
		return nil
	}
	rd := r.reducer
	for len(rd.pending) > 0 {
		j := rd.pending[0]
		t0 := time.Now()
		r.waitOnRing()
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
		r.act.resumed()
		grads, err := denseGrads(r.engines[j.chunk])
		if err != nil {
			return err
		}
		unflatten(j.flat, grads)
		ev := runlog.Event{Stage: r.stage, Replica: r.replica, Step: step, Kind: runlog.AllReduce, Chunk: j.chunk,
			StartNS: j.start.UnixNano(), EndNS: j.end.UnixNano(), WaitNS: time.Since(t0).Nanoseconds(), BytesSent: j.sent}
		r.live.action(runlog.AllReduce, j.end.Sub(j.start), 0, r.inFlight())
		r.live.sentOn("replicas", j.sent)
		if err := r.events.add(ev); err != nil {
			return err
		}
	}
	return nil
}

// waitOnRing marks a wait on the replicas' ring, which hears the previous
// replica of the stage: a status query then points the launcher at it.
func (r *Runtime) waitOnRing() {
	r.act.waitOnReplica(r.stage, (r.replica-1+r.ring.Size)%r.ring.Size)
}

// gradDone notes that one micro-batch's gradients are complete. The
// reference of a config with replicas then files away each replica's share
// as soon as its last micro-batch is in, and starts the next from zero, as
// that replica's own process would.
func (r *Runtime) gradDone(chunk int) error {
	if r.shares == nil {
		return nil
	}
	r.gradsDone++
	if r.gradsDone%r.cfg.Data.MicroBatches != 0 {
		return nil
	}
	share := r.gradsDone/r.cfg.Data.MicroBatches - 1
	grads, err := denseGrads(r.engines[chunk])
	if err != nil {
		return err
	}
	r.shares[share] = flatten(grads, r.shares[share])
	for _, g := range grads {
		g.Zero()
	}
	return nil
}

// reduceShares sums the replicas' shares of the reference's gradients piece
// by piece, each model stage's with the plan its replicas use.
func (r *Runtime) reduceShares(chunk int) error {
	grads, err := denseGrads(r.engines[chunk])
	if err != nil {
		return err
	}
	out := flatten(grads, nil)
	lo := 0
	for _, p := range r.layout.Plans {
		hi := lo + p.N
		switch v := out.(type) {
		case []float32:
			err = collective.Sum(p, sharesOf[float32](r.shares, lo, hi), v[lo:hi])
		case []float64:
			err = collective.Sum(p, sharesOf[float64](r.shares, lo, hi), v[lo:hi])
		}
		if err != nil {
			return err
		}
		lo = hi
	}
	unflatten(out, grads)
	r.gradsDone = 0
	return nil
}

func sharesOf[T float32 | float64](shares []any, lo, hi int) [][]T {
	out := make([][]T, len(shares))
	for i, s := range shares {
		out[i] = s.([]T)[lo:hi]
	}
	return out
}

// gatherLosses makes r.losses every replica's micro-batch losses, in
// replica order (the global batch's micro-batch order), on the last stage.
func (r *Runtime) gatherLosses(ctx context.Context, step int) error {
	if r.ring == nil || !r.holdsLoss() {
		return nil
	}
	mine := make([]byte, 8*len(r.losses))
	for i, l := range r.losses {
		binary.LittleEndian.PutUint64(mine[8*i:], math.Float64bits(l))
	}
	r.waitOnRing()
	all, err := r.ring.AllGather(ctx, int64(step), r.layout.controlBase()+lossTag, mine)
	if err != nil {
		return fmt.Errorf("gathering the replicas' losses: %w", err)
	}
	r.act.resumed()
	r.losses = r.losses[:0]
	for _, b := range all {
		for i := 0; i+8 <= len(b); i += 8 {
			r.losses = append(r.losses, math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
		}
	}
	return nil
}

// checkReplicas compares a digest of the stage's weights among its
// replicas, which must hold the same bits after every step.
func (r *Runtime) checkReplicas(ctx context.Context, step int) error {
	every := r.cfg.AllReduce.CheckEvery
	if r.ring == nil || every == 0 || (step+1)%every != 0 {
		return nil
	}
	mine := r.weightDigest()
	r.waitOnRing()
	all, err := r.ring.AllGather(ctx, int64(step), r.layout.controlBase()+digestTag, mine)
	if err != nil {
		return fmt.Errorf("comparing the replicas' weights: %w", err)
	}
	r.act.resumed()
	for i := 1; i < len(all); i++ {
		if !bytes.Equal(all[i], all[0]) {
			return fmt.Errorf("replicas 0 and %d of stage %d hold different weights after step %d (digests %s and %s): %w",
				i, r.stage, step+1, hex.EncodeToString(all[0][:6]), hex.EncodeToString(all[i][:6]), ErrDiverged)
		}
	}
	return nil
}

// weightDigest is a SHA-256 of every parameter's bits, in order.
func (r *Runtime) weightDigest() []byte {
	h := sha256.New()
	var buf []byte
	for _, e := range r.engines {
		for _, p := range e.Params() {
			buf = buf[:0]
			switch v := p.Value().(*tensor.Dense).Data().(type) {
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
