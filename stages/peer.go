package stages

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/transport"
)

// peer wraps the link to one neighbour. The transport has checked every
// tensor that arrives against the handshake (kind, dtype, chunk, shape); the
// peer checks that it belongs to the step being run and hands tensors out by
// (step, micro-batch, chunk), holding early arrivals, so a schedule may
// consume in any order.
type peer struct {
	link  transport.Link
	name  string
	stage int            // the neighbour's
	kind  transport.Kind // what arrives on this link
	dtype transport.DType
	held  map[slot]*transport.Tensor
	// timeout bounds each wait for a tensor, and for room in the send queue; 0
	// means only ctx bounds them.
	timeout      time.Duration
	microBatches int      // per training step; 0 skips the range check
	metrics      *Metrics // counts the bytes moved; may be nil
	side         string   // which of the stage's links this is, for metrics: "prev" or "next"
	// act, when set, is told of every wait on this neighbour (stage), so a
	// status query names the stage this one waits for.
	act *activity
	// vshape says that the link joins two stages of a V, whose chunk 1
	// (odd tags) sends its activations the way chunk 0 sends gradients.
	vshape bool
}

// meaning is what a tensor sent as kind k (the direction it crosses the
// link) with tag chunk carries, for messages: under a V, odd tags carry the
// other kind.
func (p *peer) meaning(k transport.Kind, chunk int) transport.Kind {
	if !p.vshape || chunk%2 == 0 {
		return k
	}
	if k == transport.Activation {
		return transport.Gradient
	}
	return transport.Activation
}

type slot struct {
	step  int64
	mb    int
	chunk int
}

// maxHeld bounds early arrivals; more means the neighbour runs a different schedule.
const maxHeld = 1024

func newPeer(l transport.Link, kind transport.Kind, timeout time.Duration) *peer {
	h := l.Peer()
	return &peer{link: l, stage: h.Stage, name: fmt.Sprintf("stage %d (%s)", h.Stage, h.Address), kind: kind, dtype: h.DType, held: map[slot]*transport.Tensor{}, timeout: timeout}
}

// recv returns micro-batch mb of step, for the boundary tagged chunk, as a tensor
// the caller owns.
func (p *peer) recv(ctx context.Context, step int64, mb, chunk int) (*tensor.Dense, error) {
	v, _, err := p.recvHeld(ctx, step, mb, chunk)
	return v, err
}

// recvHeld is recv that also returns the received message, whose memory v
// shares, for the caller to Release once done with v.
func (p *peer) recvHeld(ctx context.Context, step int64, mb, chunk int) (v *tensor.Dense, msg *transport.Tensor, err error) {
	t, err := p.recvMsg(ctx, step, mb, chunk)
	if err != nil {
		return nil, nil, err
	}
	shape := t.Shape
	switch t.DType {
	case transport.Float64:
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(t.Float64s())), t, nil
	case transport.Float32:
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(t.Float32s())), t, nil
	default: // 16 bits on the wire, widened back to float32
		if err := t.Widen(); err != nil {
			return nil, nil, err
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(t.Float32s())), t, nil
	}
}

// recvMsg returns the message of micro-batch mb of step tagged chunk as it
// arrived.
func (p *peer) recvMsg(ctx context.Context, step int64, mb, chunk int) (*transport.Tensor, error) {
	want := slot{step, mb, chunk}
	t, ok := p.held[want]
	delete(p.held, want)
	if !ok && p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.timeout, fmt.Errorf("nothing arrived within transport.recv_timeout %v", p.timeout))
		defer cancel()
	}
	if !ok && p.act != nil {
		// Left set on failure: the stage's last status then names the
		// neighbour it gave up on.
		p.act.waitOn(p.stage)
	}
	for !ok {
		got, err := p.link.Recv(ctx)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
				err = cause
			}
			return nil, fmt.Errorf("waiting for %s of %s micro-batch %d%s from %s: %w", p.meaning(p.kind, chunk), stepText(step), mb, chunkText(chunk), p.name, err)
		}
		if err := p.checkTag(got, step); err != nil {
			return nil, err
		}
		s := slot{got.Step, int(got.MicroBatch), int(got.Chunk)}
		if s == want {
			t, ok = got, true
			break
		}
		if _, dup := p.held[s]; dup || len(p.held) >= maxHeld {
			return nil, fmt.Errorf("%s sent %s for %s micro-batch %d%s while this stage waits for %s micro-batch %d%s: the stages disagree on the schedule",
				p.name, p.meaning(got.Kind, int(got.Chunk)), stepText(got.Step), got.MicroBatch, chunkText(int(got.Chunk)), stepText(step), mb, chunkText(chunk))
		}
		p.held[s] = got
	}
	if p.act != nil {
		p.act.resumed()
	}
	if p.metrics != nil {
		p.metrics.receivedOn(p.side, int64(len(t.Data)))
	}
	return t, nil
}

func chunkText(chunk int) string {
	if chunk == 0 {
		return ""
	}
	return fmt.Sprintf(" chunk %d", chunk)
}

// checkTag rejects a tensor that cannot belong to the step being waited for or the
// next one: a neighbour may run at most a step ahead (or into the evaluation that
// follows a step), never behind, and its micro-batch index must be in range.
// Evaluations are tagged with negative steps (evalTag).
func (p *peer) checkTag(t *transport.Tensor, step int64) error {
	var ok bool
	if step >= 0 {
		ok = t.Step == step || t.Step == step+1 || t.Step == EvalStep || t.Step == int64(evalTag(int(step)+1))
	} else {
		// After the evaluation following step done comes training step done.
		ok = t.Step == step || (step != EvalStep && t.Step == -1-step)
	}
	if !ok {
		return fmt.Errorf("%s sent %s for %s while this stage is at %s: the stages are out of step (a stage restarted from another checkpoint?)",
			p.name, t.Kind, stepText(t.Step), stepText(step))
	}
	if t.MicroBatch < 0 || (t.Step >= 0 && p.microBatches > 0 && int(t.MicroBatch) >= p.microBatches) {
		return fmt.Errorf("%s sent %s for micro-batch %d of %s; steps have micro-batches 0-%d", p.name, t.Kind, t.MicroBatch, stepText(t.Step), p.microBatches-1)
	}
	return nil
}

// stepText names a message tag for errors: "step 3", "the final evaluation".
func stepText(tag int64) string {
	switch {
	case tag >= 0:
		return fmt.Sprintf("step %d", tag+1)
	case tag == EvalStep:
		return "the final evaluation"
	}
	return fmt.Sprintf("the evaluation after step %d", -1-tag)
}

// send queues a copy of v for the neighbour and returns the payload size and
// how long the send was blocked by a full queue (backpressure).
func (p *peer) send(ctx context.Context, kind transport.Kind, step int64, mb, chunk int, v *tensor.Dense) (sent int64, blocked time.Duration, err error) {
	return p.sendAs(ctx, kind, step, mb, chunk, v, false)
}

// sendOwned is send of a tensor the caller hands over: v itself goes on the
// wire, uncopied, so the caller must never touch it again. The stage's outputs
// and input gradients are fresh copies the engine made for this send.
func (p *peer) sendOwned(ctx context.Context, kind transport.Kind, step int64, mb, chunk int, v *tensor.Dense) (sent int64, blocked time.Duration, err error) {
	return p.sendAs(ctx, kind, step, mb, chunk, v, true)
}

func (p *peer) sendAs(ctx context.Context, kind transport.Kind, step int64, mb, chunk int, v *tensor.Dense, owned bool) (sent int64, blocked time.Duration, err error) {
	var t *transport.Tensor
	switch d := v.Data().(type) {
	case []float32:
		if owned && p.dtype == transport.Float32 {
			t, err = transport.WrapFloat32s(kind, step, int32(mb), []int(v.Shape()), d)
		} else {
			t, err = transport.FromFloat32sAs(p.dtype, kind, step, int32(mb), []int(v.Shape()), d)
		}
	case []float64:
		if owned {
			t, err = transport.WrapFloat64s(kind, step, int32(mb), []int(v.Shape()), d)
		} else {
			t, err = transport.FromFloat64s(kind, step, int32(mb), []int(v.Shape()), d)
		}
	default:
		err = fmt.Errorf("unsupported value type %T", d)
	}
	if err != nil {
		return 0, 0, err
	}
	t.Chunk = int32(chunk)
	start := time.Now()
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, p.timeout, fmt.Errorf("no room in the send queue within transport.recv_timeout %v: the neighbour stopped reading", p.timeout))
		defer cancel()
	}
	if p.act != nil {
		p.act.waitOn(p.stage)
	}
	if err := p.link.Send(ctx, t); err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
			err = cause
		}
		return 0, 0, fmt.Errorf("sending %s of %s micro-batch %d%s to %s: %w", p.meaning(kind, chunk), stepText(step), mb, chunkText(chunk), p.name, err)
	}
	if p.act != nil {
		p.act.resumed()
	}
	if p.metrics != nil {
		p.metrics.sentOn(p.side, int64(len(t.Data)))
	}
	return int64(len(t.Data)), time.Since(start), nil
}

// sendBytes sends b as a raw message tagged chunk: the bytes travel as they
// are, whatever the link's dtype, padded to the message the handshake lists
// for the tag (collective.BytesShape).
func (p *peer) sendBytes(ctx context.Context, kind transport.Kind, step int64, chunk int, b []byte) error {
	shape := p.link.Peer().Shapes[chunk]
	data := make([]byte, shape[0]*p.dtype.Size())
	if len(b) > len(data) {
		return fmt.Errorf("%d bytes for tag %d, whose messages hold %d", len(b), chunk, len(data))
	}
	copy(data, b)
	t := &transport.Tensor{Kind: kind, Step: step, Chunk: int32(chunk), DType: p.dtype, Shape: shape, Data: data}
	if p.act != nil {
		p.act.waitOn(p.stage)
	}
	if err := p.link.Send(ctx, t); err != nil {
		return fmt.Errorf("sending %s's tag %d to %s: %w", stepText(step), chunk, p.name, err)
	}
	if p.act != nil {
		p.act.resumed()
	}
	if p.metrics != nil {
		p.metrics.sentOn(p.side, int64(len(data)))
	}
	return nil
}

// recvBytes receives the first n bytes of the raw message tagged chunk.
func (p *peer) recvBytes(ctx context.Context, step int64, chunk, n int) ([]byte, error) {
	t, err := p.recvMsg(ctx, step, 0, chunk)
	if err != nil {
		return nil, err
	}
	defer t.Release()
	if len(t.Data) < n {
		return nil, fmt.Errorf("%s sent %d bytes for tag %d of %s, want %d", p.name, len(t.Data), chunk, stepText(step), n)
	}
	return append([]byte(nil), t.Data[:n]...), nil
}
