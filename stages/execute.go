package stages

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// The executor runs a stage's lowered schedule (schedule.Lower): its ops in
// order, each receive, compute and send as the op names it. Where a tensor
// comes from and goes to, and how it is tagged on the wire, is the lowered
// schedule's to say (with its topology); the executor only checks, when the
// stage is set up, that each op's peer is the neighbour at the end of the
// link it uses. A send and receive naming the stage itself hand the tensor
// from one chunk to another in memory. What a
// compute op computes is its Computer's business (the stage's engines, or a
// test's fake), so the executor can be tested by feeding messages in and
// checking the messages and actions that come out.

// Computer runs the executor's compute ops.
type Computer interface {
	// Compute runs action a of step on in, the tensor a receive op took for
	// it (nil when none did), and returns what the action's send op hands on
	// (nil when it sends nothing) and the event kind it logs.
	Compute(step int, a schedule.Action, in *tensor.Dense) (out *tensor.Dense, kind string, err error)
	// SyncTied runs a SyncTied op.
	SyncTied(ctx context.Context, step int, o schedule.Op) error
	// ReduceGrad runs a ReduceGrad op: chunk's gradients are final for the step.
	ReduceGrad(ctx context.Context, step, chunk int) error
	// ClipNorm runs a ClipNorm op: the stages agree on the step's gradient
	// norm and clip by it.
	ClipNorm(ctx context.Context, step int) error
}

// received is a tensor a receive op took for a later compute op.
type received struct {
	v      *tensor.Dense
	waited time.Duration // how long the receive waited for it
}

// executor runs one stage's ops. It is used by one goroutine.
type executor struct {
	stage, stages int
	top           schedule.Topology // routes and tags the ops; Loop unless set
	ops           []schedule.Op
	prev, next    *peer // nil where the stage has no such link
	compute       Computer
	act           *activity
	// hold keeps a received message until its micro-batch is finished
	// (may be nil); record logs an action's event, ending now.
	hold   func(chunk, mb int, msg *transport.Tensor)
	record func(ev runlog.Event, start time.Time) error

	// Between a step's ops: what receives took for compute ops, what compute
	// ops made for send ops, and the event of a compute op whose send
	// follows it (an action's event spans its send, as the profile expects).
	inbox      map[schedule.Action]received
	outbox     map[schedule.Action]*tensor.Dense
	local      map[handoff]*tensor.Dense // handed from one chunk to another, not yet received
	pending    runlog.Event              // valid when hasPending
	hasPending bool
	start      time.Time // of the pending event's compute
}

func newExecutor(stage, stages int, ops []schedule.Op, prev, next *peer, c Computer, act *activity) *executor {
	return &executor{stage: stage, stages: stages, top: schedule.Topology{Stages: stages}, ops: ops, prev: prev, next: next, compute: c, act: act,
		inbox: map[schedule.Action]received{}, outbox: map[schedule.Action]*tensor.Dense{}, local: map[handoff]*tensor.Dense{}}
}

// link returns the peer at the end of route r (nil for none, or local).
func (x *executor) link(r route) *peer {
	switch r {
	case routePrev:
		return x.prev
	case routeNext:
		return x.next
	}
	return nil
}

// check verifies that every send and receive of ops names the neighbour at
// the end of the link it travels on (see routeOf), or the stage itself for a
// hand-off between its chunks.
func (x *executor) check(ops []schedule.Op) error {
	for _, o := range ops {
		r := routeOf(x.top, x.stage, o)
		if r == routeNone || r == routeLocal {
			continue
		}
		p := x.link(r)
		if p == nil {
			return fmt.Errorf("stage %d: %v: this stage has no link for it", x.stage, o)
		}
		if p.stage != o.Peer {
			return fmt.Errorf("stage %d: %v: the link it travels on leads to stage %d", x.stage, o, p.stage)
		}
	}
	return nil
}

// run executes the ops for one training step.
func (x *executor) run(ctx context.Context, step int) error {
	for i, o := range x.ops {
		if x.act != nil {
			x.act.in(i)
		}
		if err := x.runOp(ctx, step, o, i); err != nil {
			return fmt.Errorf("%v: %w", o, err)
		}
	}
	if x.act != nil {
		x.act.in(-1)
	}
	return nil
}

func (x *executor) runOp(ctx context.Context, step int, o schedule.Op, i int) error {
	a := o.Action
	switch o.Kind {
	case schedule.RecvAct, schedule.RecvGrad:
		return x.receive(ctx, step, o)
	case schedule.SendAct, schedule.SendGrad:
		return x.send(ctx, step, o)
	case schedule.ReduceGrad:
		return x.compute.ReduceGrad(ctx, step, a.Chunk)
	case schedule.SyncTied:
		return x.compute.SyncTied(ctx, step, o)
	case schedule.ClipNorm:
		return x.compute.ClipNorm(ctx, step)
	case schedule.Compute:
		start := time.Now()
		out, kind, err := x.compute.Compute(step, a, x.inbox[a].v)
		if err != nil {
			return err
		}
		if out != nil {
			x.outbox[a] = out
		}
		ev := runlog.Event{Stage: x.stage, Step: step, Kind: kind, MB: a.MicroBatch, Chunk: a.Chunk,
			StartNS: start.UnixNano(), WaitNS: x.inbox[a].waited.Nanoseconds()}
		delete(x.inbox, a)
		if next := i + 1; next < len(x.ops) && x.ops[next].Action == a && (x.ops[next].Kind == schedule.SendAct || x.ops[next].Kind == schedule.SendGrad) {
			x.pending, x.hasPending, x.start = ev, true, start
			return nil
		}
		return x.log(ev, start)
	}
	return fmt.Errorf("op kind %v not supported by this runtime", o.Kind)
}

// receive takes the tensor o names for a later compute op.
func (x *executor) receive(ctx context.Context, step int, o schedule.Op) error {
	r := routeOf(x.top, x.stage, o)
	if r == routeLocal {
		k := handoffOf(x.top, o)
		v, ok := x.local[k]
		if !ok {
			return fmt.Errorf("nothing handed over for it: its sender on this stage has not run")
		}
		delete(x.local, k)
		x.inbox[o.Action] = received{v: v}
		return nil
	}
	t0 := time.Now()
	v, msg, err := x.link(r).recvHeld(ctx, int64(step), o.Action.MicroBatch, x.top.Tag(o))
	if err != nil {
		return err
	}
	if x.hold != nil {
		x.hold(o.Action.Chunk, o.Action.MicroBatch, msg)
	}
	x.inbox[o.Action] = received{v: v, waited: time.Since(t0)}
	return nil
}

// send hands the output of o's compute op to the neighbour, uncopied, or to
// another of the stage's chunks.
func (x *executor) send(ctx context.Context, step int, o schedule.Op) error {
	out, ok := x.outbox[o.Action]
	if !ok {
		return fmt.Errorf("nothing to send: %v has not run", o.Action)
	}
	delete(x.outbox, o.Action)
	var sent int64
	var blocked time.Duration
	if r := routeOf(x.top, x.stage, o); r == routeLocal {
		// The compute made out for this send alone, so the receiving chunk
		// may keep it as the wire's receiver would.
		x.local[handoffOf(x.top, o)] = out
	} else {
		var err error
		sent, blocked, err = x.link(r).sendOwned(ctx, sendKind(r), int64(step), o.Action.MicroBatch, x.top.Tag(o), out)
		if err != nil {
			return err
		}
	}
	if ev := x.pending; x.hasPending && ev.MB == o.Action.MicroBatch && ev.Chunk == o.Action.Chunk {
		x.hasPending = false
		ev.BytesSent, ev.SendNS = sent, blocked.Nanoseconds()
		return x.log(ev, x.start)
	}
	return nil
}

func (x *executor) log(ev runlog.Event, start time.Time) error {
	if x.record == nil {
		return nil
	}
	return x.record(ev, start)
}

// Compute runs a compute op on the chunk's compute (Computer), through
// compute.Stage, whatever device it was opened on.
func (r *Runtime) Compute(step int, a schedule.Action, in *tensor.Dense) (*tensor.Dense, string, error) {
	// An event's kind is its action's, as the schedule spells it (runlog's
	// kinds are those spellings).
	var out *tensor.Dense
	var err error
	switch a.Kind {
	case schedule.Forward:
		out, err = r.forward(step, a, in)
	case schedule.Backward, schedule.Input:
		out, err = r.backward(step, a, in)
	case schedule.Weight:
		err = r.weight(step, a)
	case schedule.Recompute:
		err = r.chunk(a.Chunk).Recomputation(a.MicroBatch)
	default:
		err = fmt.Errorf("kind %v not supported by this runtime", a.Kind)
	}
	return out, a.Kind.String(), err
}

// forward runs a forward: on the model's first stage from the step's data,
// elsewhere from the received activation; the last stage keeps the loss.
// It returns the output to send (nil on the last model stage).
func (r *Runtime) forward(step int, a schedule.Action, input *tensor.Dense) (*tensor.Dense, error) {
	e, mb := r.chunk(a.Chunk), a.MicroBatch
	var targets []int
	if e.IsFirst() || e.IsLast() {
		var x *tensor.Dense
		x, targets = r.takeData(step, a)
		if e.IsFirst() {
			input = x
		}
	}
	if d, ok := e.(compute.Drawing); ok {
		d.TrainNext(step, r.mbBase+mb)
	}
	out, err := e.Forward(mb, input, targets)
	if err != nil {
		return nil, err
	}
	if e.IsLast() {
		r.losses[mb] = scalar(out)
		return nil, r.checkLoss(step, r.losses[mb])
	}
	return out, nil
}

// backward runs a full backward (B) or its input-gradient part (I) from the
// received output gradient (the loss's on the last model stage). It returns
// the input gradient to send (nil on the first model stage).
func (r *Runtime) backward(step int, a schedule.Action, in *tensor.Dense) (*tensor.Dense, error) {
	e, mb := r.chunk(a.Chunk), a.MicroBatch
	grad := e.LossScale(r.scaleMBs)
	if !e.IsLast() {
		grad = in
	}
	var dx *tensor.Dense
	var err error
	if a.Kind == schedule.Input {
		dx, err = e.Input(mb, grad)
	} else {
		err = r.watchingGradients(step, a, func() error {
			var err error
			dx, err = e.Backward(mb, grad)
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	if a.Kind != schedule.Input {
		r.finish(a.Chunk, mb)
		if err := r.replicas.gradDone(a.Chunk); err != nil {
			return nil, err
		}
	}
	if e.IsFirst() {
		return nil, nil
	}
	return dx, nil
}

func (r *Runtime) weight(step int, a schedule.Action) error {
	if err := r.watchingGradients(step, a, func() error { return r.chunk(a.Chunk).Weight(a.MicroBatch) }); err != nil {
		return err
	}
	r.finish(a.Chunk, a.MicroBatch)
	return r.replicas.gradDone(a.Chunk)
}

// watchingGradients runs pass, a backward or weight pass of a. When a is
// its chunk's last of the step, all_reduce.overlap is layer and the chunk
// reports its weight pass's progress (compute.GradientWatcher), the
// replicas' all-reduce starts on
// each bucket whose layers the pass has finished while it computes the
// rest, instead of at the ReduceGrad op that follows.
func (r *Runtime) watchingGradients(step int, a schedule.Action, pass func() error) error {
	w, ok := r.chunk(a.Chunk).(compute.GradientWatcher)
	if !ok || !r.finalPasses[a] || r.replicas == nil || !r.replicas.perLayer {
		return pass()
	}
	var handErr error
	w.WatchGradients(r.replicas.watch(r.stepCtx, step, a.Chunk, &handErr))
	err := pass()
	w.WatchGradients(nil)
	return cmp.Or(err, handErr)
}

// finalPasses finds in a stage's ops each chunk's last backward or weight
// pass of the step: the compute op a ReduceGrad of its chunk follows
// (schedule.AddReduceGrad), with only that op's send between them.
func finalPasses(ops []schedule.Op) map[schedule.Action]bool {
	out := map[schedule.Action]bool{}
	last := map[int]schedule.Action{}
	for _, o := range ops {
		switch {
		case o.Kind == schedule.Compute && (o.Action.Kind == schedule.Backward || o.Action.Kind == schedule.Weight):
			last[o.Action.Chunk] = o.Action
		case o.Kind == schedule.ReduceGrad:
			if a, ok := last[o.Action.Chunk]; ok {
				out[a] = true
			}
		}
	}
	return out
}

// record logs an action's event, ending now.
func (r *Runtime) record(ev runlog.Event, start time.Time) error {
	r.live.action(ev.Kind, time.Since(start), time.Duration(ev.SendNS), r.inFlight())
	ev.EndNS, ev.Stashed, ev.Replica = time.Now().UnixNano(), r.inFlight(), r.replica
	if f := r.fed; ev.Kind == runlog.Forward && f.a.Chunk == ev.Chunk && f.a.MicroBatch == ev.MB && f.a.Kind == schedule.Forward {
		ev.DataNS, ev.DataWaitNS = f.read.Nanoseconds(), f.wait.Nanoseconds()
		r.fed = fedData{}
	}
	r.peakStash = max(r.peakStash, ev.Stashed)
	ev.StashBytes, ev.HeapBytes = r.heldBytes(), heapBytes()
	return r.events.add(ev)
}
