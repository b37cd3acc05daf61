package stages

import (
	"context"
	"fmt"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// The executor runs a stage's lowered schedule (schedule.Lower): its ops in
// order, each receive, compute and send as the op names it. Where a tensor
// comes from and goes to, and how it is tagged on the wire, is the lowered
// schedule's to say; the executor only checks, when the stage is set up, that
// each op's peer is the neighbour at the end of the link it uses.

// received is a tensor a receive op took for a later compute op.
type received struct {
	v      *tensor.Dense
	waited time.Duration // how long the receive waited for it
}

// execState carries tensors between a step's ops: what receives took for
// compute ops, what compute ops made for send ops, and the event of a
// compute op whose send follows it (an action's event spans its send, as
// the profile expects).
type execState struct {
	inbox      map[schedule.Action]received
	outbox     map[schedule.Action]*tensor.Dense
	pending    runlog.Event // valid when hasPending
	hasPending bool
	start      time.Time // of the pending event's compute
}

// checkOps verifies that every send and receive of ops names the neighbour
// at the end of the link it travels on: activations arrive from the previous
// stage and leave for the next, gradients the other way round.
func (r *Runtime) checkOps(ops []schedule.Op) error {
	for _, o := range ops {
		var p *peer
		switch o.Kind {
		case schedule.RecvAct, schedule.SendGrad:
			p = r.prev
		case schedule.SendAct, schedule.RecvGrad:
			p = r.next
		case schedule.SyncTied:
			// Over the ring: stage 0 hears the last stage on its previous
			// link, the last stage talks to stage 0 on its next.
			if o.Peer < 0 {
				continue
			}
			if p = r.next; r.stage == 0 {
				p = r.prev
			}
		default:
			continue
		}
		if p == nil {
			return fmt.Errorf("stage %d: %v: this stage has no link for it", r.stage, o)
		}
		if p.stage != o.Peer {
			return fmt.Errorf("stage %d: %v: the link it travels on leads to stage %d", r.stage, o, p.stage)
		}
	}
	return nil
}

// runOps executes the stage's ops for one training step.
func (r *Runtime) runOps(ctx context.Context, step int) error {
	for i, o := range r.ops {
		r.act.in(i)
		if err := r.runOp(ctx, step, o, i); err != nil {
			return fmt.Errorf("%v: %w", o, err)
		}
	}
	r.act.in(-1)
	return nil
}

func (r *Runtime) runOp(ctx context.Context, step int, o schedule.Op, i int) error {
	a := o.Action
	switch o.Kind {
	case schedule.RecvAct:
		return r.receive(ctx, r.prev, step, o)
	case schedule.RecvGrad:
		return r.receive(ctx, r.next, step, o)
	case schedule.SendAct:
		return r.send(ctx, r.next, transport.Activation, step, o)
	case schedule.SendGrad:
		return r.send(ctx, r.prev, transport.Gradient, step, o)
	case schedule.ReduceGrad:
		return nil // data-parallel replicas reduce here; a lone pipeline has nothing to
	case schedule.SyncTied:
		return r.syncTied(ctx, step, o)
	case schedule.Compute:
		var out *tensor.Dense
		var kind string
		var err error
		start := time.Now()
		switch a.Kind {
		case schedule.Forward:
			out, err = r.forward(step, a)
			kind = runlog.Forward
		case schedule.Backward, schedule.Input:
			out, kind, err = r.backward(a)
		case schedule.Weight:
			err = r.weight(a)
			kind = runlog.Weight
		}
		if err != nil {
			return err
		}
		if out != nil {
			r.exec.outbox[a] = out
		}
		ev := runlog.Event{Stage: r.stage, Step: step, Kind: kind, MB: a.MicroBatch, Chunk: a.Chunk,
			StartNS: start.UnixNano(), WaitNS: r.exec.inbox[a].waited.Nanoseconds()}
		delete(r.exec.inbox, a)
		if next := i + 1; next < len(r.ops) && r.ops[next].Action == a && (r.ops[next].Kind == schedule.SendAct || r.ops[next].Kind == schedule.SendGrad) {
			r.exec.pending, r.exec.hasPending, r.exec.start = ev, true, start
			return nil
		}
		return r.record(ev, start)
	}
	return fmt.Errorf("op kind %v not supported by this runtime", o.Kind)
}

// receive takes the tensor o names for a later compute op.
func (r *Runtime) receive(ctx context.Context, p *peer, step int, o schedule.Op) error {
	t0 := time.Now()
	v, msg, err := p.recvHeld(ctx, int64(step), o.Action.MicroBatch, o.Tag(r.stages))
	if err != nil {
		return err
	}
	r.hold(o.Action.Chunk, o.Action.MicroBatch, msg)
	r.exec.inbox[o.Action] = received{v: v, waited: time.Since(t0)}
	return nil
}

// send hands the output of o's compute op to the neighbour, uncopied.
func (r *Runtime) send(ctx context.Context, p *peer, kind transport.Kind, step int, o schedule.Op) error {
	out, ok := r.exec.outbox[o.Action]
	if !ok {
		return fmt.Errorf("nothing to send: %v has not run", o.Action)
	}
	delete(r.exec.outbox, o.Action)
	sent, blocked, err := p.sendOwned(ctx, kind, int64(step), o.Action.MicroBatch, o.Tag(r.stages), out)
	if err != nil {
		return err
	}
	if ev := r.exec.pending; r.exec.hasPending && ev.MB == o.Action.MicroBatch && ev.Chunk == o.Action.Chunk {
		r.exec.hasPending = false
		ev.BytesSent, ev.SendNS = sent, blocked.Nanoseconds()
		return r.record(ev, r.exec.start)
	}
	return nil
}

// forward runs a forward: on the model's first stage from the step's data,
// elsewhere from the received activation; the last stage keeps the loss.
// It returns the output to send (nil on the last model stage).
func (r *Runtime) forward(step int, a schedule.Action) (*tensor.Dense, error) {
	e, mb := r.engines[a.Chunk], a.MicroBatch
	input := r.exec.inbox[a].v
	var targets []int
	if e.IsFirst() {
		input = r.newInput(e)
	}
	if e.IsFirst() || e.IsLast() {
		x := input
		if !e.IsFirst() {
			x = nil
		}
		targets = r.feed.train(step, mb, x, e.IsLast())
	}
	out, err := e.Forward(mb, input, targets)
	if err != nil {
		return nil, err
	}
	if e.IsLast() {
		r.losses[mb] = scalar(out)
		return nil, nil
	}
	return out, nil
}

// backward runs a full backward (B) or its input-gradient part (I) from the
// received output gradient (the loss's on the last model stage). It returns
// the input gradient to send (nil on the first model stage).
func (r *Runtime) backward(a schedule.Action) (*tensor.Dense, string, error) {
	e, mb := r.engines[a.Chunk], a.MicroBatch
	var grad G.Value = e.LossScale(r.cfg.Data.MicroBatches)
	if !e.IsLast() {
		grad = r.exec.inbox[a].v
	}
	var dx *tensor.Dense
	var err error
	kind := runlog.Backward
	if a.Kind == schedule.Input {
		dx, err = e.Input(mb, grad)
		kind = runlog.Input
	} else {
		dx, err = e.Backward(mb, grad)
	}
	if err != nil {
		return nil, kind, err
	}
	if a.Kind != schedule.Input {
		r.finish(a.Chunk, mb)
	}
	if e.IsFirst() {
		return nil, kind, nil
	}
	return dx, kind, nil
}

func (r *Runtime) weight(a schedule.Action) error {
	if err := r.engines[a.Chunk].Weight(a.MicroBatch); err != nil {
		return err
	}
	r.finish(a.Chunk, a.MicroBatch)
	return nil
}

// record logs an action's event, ending now.
func (r *Runtime) record(ev runlog.Event, start time.Time) error {
	r.live.action(ev.Kind, time.Since(start), ev.BytesSent, r.inFlight())
	ev.EndNS, ev.Stashed = time.Now().UnixNano(), r.inFlight()
	return r.events.add(ev)
}
