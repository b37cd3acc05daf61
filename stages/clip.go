package stages

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// Gradient clipping by the global norm (train.clip_grad_norm), as
// torch.nn.utils.clip_grad_norm_ does in one process: once the step's
// gradients are final (reduced over the replicas, tied halves summed), the
// norm over every parameter of the model is taken, and when it exceeds the
// limit every gradient is scaled by limit / (norm + 1e-6). In a pipeline the
// parameters live on several stages: the lowered schedule's ClipNorm op has
// each stage add its part to the sum received from the previous stage and
// pass it on; the last stage has the total and passes it back, so every
// stage scales by the same factor. A tied weight's second holder is not
// counted (both hold the same summed gradient), nor are replicas (they hold
// the same gradients and each replica's pipeline agrees on its own).
//
// The total is exact: each parameter's sum of squares is a float64 computed
// in element order, and those are added exactly (normSum), so the order in
// which stages add their parts, and how the model is split, change no bit:
// the pipeline's norm is its one-process reference's.

// normBytes is a normSum on the wire: 2304 bits hold the exact sum of 2^206
// finite float64 values.
const normBytes = 288

// normSum is an exact sum of non-negative finite float64 values. Each is an
// integer multiple of 2^-1074, the least subnormal, so their sum is an
// integer times 2^-1074, held in a big.Int whatever the order of addition.
type normSum struct{ n big.Int }

// add adds v, which must be finite and non-negative.
func (s *normSum) add(v float64) {
	if v == 0 {
		return
	}
	mant, exp := math.Frexp(v) // v = mant·2^exp, mant in [0.5, 1)
	m := new(big.Int).SetInt64(int64(mant * (1 << 53)))
	// v = m·2^(exp-53) = (m·2^(exp-53+1074))·2^-1074; a subnormal's m
	// has the trailing zeros a right shift drops.
	if shift := exp - 53 + 1074; shift >= 0 {
		m.Lsh(m, uint(shift))
	} else {
		m.Rsh(m, uint(-shift))
	}
	s.n.Add(&s.n, m)
}

// merge adds o's sum.
func (s *normSum) merge(o *normSum) { s.n.Add(&s.n, &o.n) }

// float64 is the sum rounded to the nearest float64.
func (s *normSum) float64() float64 {
	f := new(big.Float).SetInt(&s.n)
	f.SetMantExp(f, -1074)
	v, _ := f.Float64()
	return v
}

func (s *normSum) bytes() ([]byte, error) {
	if s.n.BitLen() > 8*normBytes {
		return nil, fmt.Errorf("the gradients' squared norm does not fit %d bytes", normBytes)
	}
	return s.n.FillBytes(make([]byte, normBytes)), nil
}

func (s *normSum) setBytes(b []byte) { s.n.SetBytes(b) }

// squares is the sum of t's squared elements in float64, in element order.
func squares(t *tensor.Dense) float64 {
	var s float64
	switch d := t.Data().(type) {
	case []float32:
		for _, x := range d {
			v := float64(x)
			s += v * v
		}
	case []float64:
		for _, x := range d {
			s += x * x
		}
	}
	return s
}

// addSquares adds the squared norm of each of the stage's gradients to s,
// but a tied weight's second holder's.
func (r *Runtime) addSquares(s *normSum, step int) error {
	for _, c := range r.chunks {
		grads, err := c.Gradients()
		if err != nil {
			return err
		}
		for _, g := range grads {
			if slices.ContainsFunc(r.tied, func(pair [2]string) bool { return pair[1] == g.Name }) {
				continue
			}
			v := squares(g.Value)
			if !finite(v) {
				return &nonFiniteError{what: "squared norm of the gradient of " + g.Name, value: v, step: step + 1, stage: r.name()}
			}
			s.add(v)
		}
	}
	return nil
}

// controlTag is the tag of the raw control messages on a pipeline link
// (the gradient norm's parts, an evaluation's loss): the last the
// handshake lists (LinkShapes).
func controlTag(p *peer) int { return len(p.link.Peer().Shapes) - 1 }

// ClipNorm runs a ClipNorm op (Computer): it adds the stage's part of the
// step's squared gradient norm to the previous stage's sum, passes it on,
// takes the total back from the next stage (the last stage has it) and
// hands it to the previous one, and scales the stage's gradients when the
// norm exceeds train.clip_grad_norm. The norm is kept for metrics.jsonl.
func (r *Runtime) ClipNorm(ctx context.Context, step int) error {
	if err := r.awaitReductions(ctx, step); err != nil {
		return err
	}
	start := time.Now()
	if err := r.clipNorm(ctx, step); err != nil {
		return err
	}
	r.live.action(runlog.ClipNorm, time.Since(start), 0, r.inFlight())
	return r.events.add(runlog.Event{Stage: r.stage, Replica: r.replica, Step: step, Kind: runlog.ClipNorm, StartNS: start.UnixNano(), EndNS: time.Now().UnixNano()})
}

// clipNorm is ClipNorm's exchange and scaling.
func (r *Runtime) clipNorm(ctx context.Context, step int) error {
	var sum normSum
	if err := r.addSquares(&sum, step); err != nil {
		return err
	}
	s := int64(step)
	if r.stage > 0 {
		b, err := r.prev.recvBytes(ctx, s, controlTag(r.prev), normBytes)
		if err != nil {
			return fmt.Errorf("the gradient norm's part: %w", err)
		}
		var before normSum
		before.setBytes(b)
		sum.merge(&before)
	}
	if r.stage < r.stages-1 {
		b, err := sum.bytes()
		if err != nil {
			return err
		}
		tag := controlTag(r.next)
		if err := r.next.sendBytes(ctx, transport.Activation, s, tag, b); err != nil {
			return fmt.Errorf("the gradient norm's part: %w", err)
		}
		if b, err = r.next.recvBytes(ctx, s, tag, normBytes); err != nil {
			return fmt.Errorf("the gradient norm: %w", err)
		}
		sum.setBytes(b)
	}
	if r.stage > 0 {
		b, err := sum.bytes()
		if err != nil {
			return err
		}
		if err := r.prev.sendBytes(ctx, transport.Gradient, s, controlTag(r.prev), b); err != nil {
			return fmt.Errorf("the gradient norm: %w", err)
		}
	}
	r.gradNorm = math.Sqrt(sum.float64())
	if math.IsInf(r.gradNorm, 0) {
		return &nonFiniteError{what: "gradient norm", value: r.gradNorm, step: step + 1, stage: r.name()}
	}
	return clipGradients(r.chunks, r.cfg.Train.ClipGradNorm, r.gradNorm)
}

// clipGradients scales every gradient of chunks by limit / (norm + 1e-6)
// when that is below 1, as clip_grad_norm_ does, in the gradients' dtype.
func clipGradients(chunks []compute.Stage, limit, norm float64) error {
	coef := limit / (norm + 1e-6)
	if coef >= 1 {
		return nil
	}
	for _, c := range chunks {
		grads, err := c.Gradients()
		if err != nil {
			return err
		}
		for _, g := range grads {
			switch d := g.Value.Data().(type) {
			case []float32:
				k := float32(coef)
				for i := range d {
					d[i] *= k
				}
			case []float64:
				for i := range d {
					d[i] *= coef
				}
			}
		}
		if err := c.LoadGradients(grads); err != nil {
			return err
		}
	}
	return nil
}
