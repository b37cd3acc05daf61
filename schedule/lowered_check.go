package schedule

import (
	"fmt"
	"slices"
	"strings"
)

// message names one tensor of a step on the wire: what carries it (an
// activation or a gradient), the micro-batch, and the model stage that sends it.
type message struct {
	grad       bool
	microBatch int
	from       int // model stage of the sender
}

func (o Op) message(stages int) message { return Topology{Stages: stages}.message(o) }

func (t Topology) message(o Op) message {
	return message{grad: o.Kind == SendGrad || o.Kind == RecvGrad, microBatch: o.Action.MicroBatch, from: t.senderModelStage(o)}
}

func (t Topology) senderModelStage(o Op) int {
	ms := t.ModelStageOf(o.Action)
	switch o.Kind {
	case RecvAct:
		return ms - 1
	case RecvGrad:
		return ms + 1
	}
	return ms
}

func (o Op) isSend() bool { return o.Kind == SendAct || o.Kind == SendGrad }
func (o Op) isRecv() bool { return o.Kind == RecvAct || o.Kind == RecvGrad }

// Check verifies a lowered schedule: its compute ops form a schedule that
// passes Schedule.Check; every op sits on its own stage's list; each compute
// op that needs a tensor from another model stage is preceded by exactly one
// receive of it, and each that produces one for another model stage followed
// by exactly one send of it; every send names the stage that receives it and
// has exactly one matching receive there, and every receive one send; each
// chunk's gradients are reduced exactly once, after its last gradient op; and
// the whole plays to the end in the simulator (no deadlock). Errors name the
// first offending op.
func (l *Lowered) Check() error { return l.CheckDepth(0) }

// CheckDepth is Check with links that hold at most depth messages in each of
// their two queues (the sender's and the receiver's read-ahead, as
// transport.queue_depth bounds them): a send waits while 2·depth of its
// link's messages are not yet taken by a receive on the other side, which
// takes every message up to the one it wants (holding early ones), and
// orders that need more room deadlock. depth <= 0 means unbounded.
func (l *Lowered) CheckDepth(depth int) error {
	if err := l.validate(); err != nil {
		return err
	}
	_, err := l.playDepth(UniformCosts(l.Stages, 1, 1, 0), depth)
	return err
}

// validate is Check without the deadlock search.
func (l *Lowered) validate() error {
	if len(l.Ops) != l.Stages {
		return fmt.Errorf("lowered schedule has %d stage lists, want %d", len(l.Ops), l.Stages)
	}
	for st, ops := range l.Ops {
		for j, o := range ops {
			if o.Kind >= numOpKinds {
				return fmt.Errorf("stage %d: op %d: unknown kind %d", st, j, uint8(o.Kind))
			}
			if o.Action.Stage != st {
				return fmt.Errorf("stage %d: op %v at position %d belongs on stage %d's list", st, o, j, o.Action.Stage)
			}
		}
	}
	if err := l.Compute().Check(); err != nil {
		return err
	}
	t, v := l.Topology(), l.Chunks
	first, last := t.TiedStages()
	sends, recvs := map[message]Op{}, map[message]Op{}
	tied := map[[2]int]bool{} // (stage, weight) of each SyncTied
	clips := 0                // stages with a ClipNorm
	for st, ops := range l.Ops {
		reduced := make([]int, v)
		for j, o := range ops {
			bad := func(format string, args ...any) error {
				return fmt.Errorf("stage %d: op %v at position %d: %s", st, o, j, fmt.Sprintf(format, args...))
			}
			switch {
			case o.Kind == Compute:
				if err := l.checkComm(ops, j); err != nil {
					return bad("%v", err)
				}
			case o.isSend() || o.isRecv():
				want := t.SendTo(o.Action)
				if o.isRecv() {
					want = t.RecvFrom(o.Action)
				}
				if want < 0 || (o.Kind == SendAct || o.Kind == RecvAct) != (o.Action.Kind == Forward) || !o.Action.Kind.communicates() {
					return bad("%v carries nothing of this kind", o.Action)
				}
				if o.Peer != want {
					return bad("the other end is stage %d, not %d", want, o.Peer)
				}
				set := sends
				if o.isRecv() {
					set = recvs
				}
				if _, dup := set[t.message(o)]; dup {
					return bad("appears twice")
				}
				set[t.message(o)] = o
			case o.Kind == SyncTied:
				want := first + last - st
				if first == last {
					want = -1
				}
				if (st != first && st != last) || o.Peer != want {
					if first == last {
						return bad("tied weights are both held by stage %d, which sums them alone", first)
					}
					return bad("tied weights are held by stages %d and %d, exchanging with each other", first, last)
				}
				if _, dup := tied[[2]int{st, o.Index}]; dup {
					return bad("appears twice")
				}
				tied[[2]int{st, o.Index}] = true
			case o.Kind == ClipNorm:
				if clips++; slices.ContainsFunc(ops[:j], func(o Op) bool { return o.Kind == ClipNorm }) {
					return bad("appears twice")
				}
				for _, later := range ops[j+1:] {
					if later.Kind == Compute && (later.Action.Kind == Backward || later.Action.Kind == Weight) || later.Kind == ReduceGrad || later.Kind == SyncTied {
						return bad("comes before %v, which still changes the stage's gradients", later)
					}
				}
			case o.Kind == ReduceGrad:
				c := o.Action.Chunk
				if c < 0 || c >= v {
					return bad("chunk %d out of range [0, %d)", c, v)
				}
				if reduced[c]++; reduced[c] > 1 {
					return bad("chunk %d's gradients are reduced twice", c)
				}
				for _, later := range ops[j+1:] {
					if later.Kind == Compute && later.Action.Chunk == c && (later.Action.Kind == Backward || later.Action.Kind == Weight) {
						return bad("comes before %v, which still adds to chunk %d's gradients", later, c)
					}
				}
			}
		}
	}
	for m, s := range sends {
		if _, ok := recvs[m]; !ok {
			return fmt.Errorf("stage %d: send %v has no matching receive on stage %d", s.Action.Stage, s, s.Peer)
		}
	}
	for m, r := range recvs {
		if _, ok := sends[m]; !ok {
			return fmt.Errorf("stage %d: receive %v has no matching send on stage %d", r.Action.Stage, r, r.Peer)
		}
	}
	if clips != 0 && clips != len(l.Ops) {
		return fmt.Errorf("%d of the %d stages clip the gradient norm: every stage must, as the norm is over all of them", clips, len(l.Ops))
	}
	for k := range tied {
		if other := first + last - k[0]; !tied[[2]int{other, k[1]}] {
			return fmt.Errorf("stage %d exchanges tied weight %d's gradient, but stage %d does not", k[0], k[1], other)
		}
	}
	return nil
}

// checkComm verifies that the compute op at ops[j] has the receive it needs
// before it and the send it owes after it, each exactly once on this list.
func (l *Lowered) checkComm(ops []Op, j int) error {
	a := ops[j].Action
	t := l.Topology()
	if !a.Kind.communicates() {
		return nil
	}
	recv, send := RecvAct, SendAct
	if a.Kind != Forward {
		recv, send = RecvGrad, SendGrad
	}
	count := func(k OpKind, from, to int) int {
		n := 0
		for _, o := range ops[from:to] {
			if o.Kind == k && o.Action == a {
				n++
			}
		}
		return n
	}
	if t.RecvFrom(a) >= 0 && count(recv, 0, j) != 1 {
		return fmt.Errorf("needs exactly one %s before it (%v<%d), found %d", recv, a, t.RecvFrom(a), count(recv, 0, j))
	}
	if t.SendTo(a) >= 0 && count(send, j+1, len(ops)) != 1 {
		return fmt.Errorf("needs exactly one %s after it (%v>%d), found %d", send, a, t.SendTo(a), count(send, j+1, len(ops)))
	}
	return nil
}

// Simulate plays a lowered schedule as Simulate plays a compute-only one: a
// stage runs its ops in order; a compute op takes its cost, a receive waits
// for its message (the send's time, plus Costs.Transfer between stages), a
// send takes no time (sends never block: receivers read ahead), and so does
// a reduction for the stage: it hands the chunk's gradients to the stage's
// all-reduce, which takes Costs.AllReduce in the background, one chunk after
// another. A tied weight's exchange first waits for the stage's all-reduces,
// as the runtime's does. On a schedule lowered from s it gives s's timeline
// exactly.
func (l *Lowered) Simulate(c Costs) (*Timeline, error) {
	if err := c.check(l.Stages, l.Chunks); err != nil {
		return nil, err
	}
	return l.simulate(c)
}

func (l *Lowered) simulate(c Costs) (*Timeline, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	return l.play(c)
}

// play is the simulation of a lowered schedule assumed well formed.
func (l *Lowered) play(c Costs) (*Timeline, error) { return l.playDepth(c, 0) }

// link is one direction of one link between two stages: from the end that
// dials to the one that listens (down) or back. Under Loop placement two
// stages may share two links (the ring's, with two stages), told apart by
// the direction; under V one link carries chunk 0's activations and chunk
// 1's gradients the same way.
type link struct {
	from, to int
	down     bool
}

// playDepth is play with links of bounded room (see CheckDepth); the times
// it gives are those of unbounded links, so use it for deadlocks only.
func (l *Lowered) playDepth(c Costs, depth int) (*Timeline, error) {
	p, v, t := l.Stages, l.Chunks, l.Topology()
	sent := map[message]float64{} // when each message left its sender
	seq := map[message]int{}      // its place on its link
	queued := map[link]int{}      // messages sent on each link
	taken := map[link]int{}       // of which a receive has taken (read past) this many
	clock := make([]float64, p)   // each stage's time after its last op
	next := make([]int, p)        // each stage's next op
	rings := make([]ring, p)      // each stage's all-reduces
	tied := false
	clipAt := map[int]float64{} // when each stage reached its ClipNorm
	tl := &Timeline{
		Spans:        make([][]Span, p),
		Busy:         make([]float64, p),
		Bubble:       make([]float64, p),
		PeakInFlight: l.Compute().PeakInFlight(),
	}
	// advance runs stage st's ops until one waits for another stage, saying
	// whether it ran any. With shared, it stops at a computation instead,
	// giving its start and work (compute), for CoreGroups.share to run.
	advance := func(st int, shared bool) (start, work float64, compute, moved bool) {
	run:
		for ; next[st] < len(l.Ops[st]); next[st]++ {
			o := l.Ops[st][next[st]]
			switch {
			case o.Kind == Compute:
				d := c.duration(o.Action, v)
				if n := len(tl.Spans[st]); n > 0 {
					clock[st] = max(clock[st], tl.Spans[st][n-1].End+c.gap(st))
				}
				if shared {
					return clock[st], d, true, moved
				}
				tl.Spans[st] = append(tl.Spans[st], Span{Action: o.Action, Start: clock[st], End: clock[st] + d})
				tl.Busy[st] += d
				clock[st] += d
			case o.isSend():
				ln := link{from: st, to: o.Peer, down: t.Downstream(o)}
				// A local hand-off waits for no room: it is no link.
				if depth > 0 && o.Peer != st && queued[ln]-taken[ln] >= 2*depth {
					break run // the link is full until the other side receives
				}
				m := t.message(o)
				sent[m], seq[m] = clock[st], queued[ln]
				queued[ln]++
			case o.isRecv():
				m := t.message(o)
				at, ok := sent[m]
				if !ok {
					break run
				}
				ln := link{from: o.Peer, to: st, down: t.Downstream(o)}
				taken[ln] = max(taken[ln], seq[m]+1)
				if o.Peer != st {
					at += c.Transfer
				}
				clock[st] = max(clock[st], at)
			case o.Kind == ReduceGrad && c.AllReduce != nil && !c.ReduceAtStepEnd:
				// Only the chunk's last pass's send lies between them.
				spans := tl.Spans[st]
				rings[st].reduceAfter(c, st, o.Action.Chunk, spans[len(spans)-1], clock[st])
			case o.Kind == SyncTied:
				if c.AllReduce != nil {
					// The exchange sums reduced gradients.
					clock[st], tied = max(clock[st], rings[st].free), true
				}
				if o.Peer < 0 {
					break
				}
				// Each side sends its half, then waits for the other's.
				mine := message{grad: true, microBatch: -1 - o.Index, from: -1 - st}
				if _, ok := sent[mine]; !ok {
					sent[mine] = clock[st]
				}
				at, ok := sent[message{grad: true, microBatch: -1 - o.Index, from: -1 - o.Peer}]
				if !ok {
					break run
				}
				clock[st] = max(clock[st], at+c.Transfer)
			case o.Kind == ClipNorm:
				if c.AllReduce != nil {
					clock[st] = max(clock[st], rings[st].free) // the norm is of reduced gradients
				}
				if _, ok := clipAt[st]; !ok {
					clipAt[st] = clock[st]
				}
				if len(clipAt) < p {
					break run // the norm needs every stage's part
				}
				// The parts travel down the pipeline and the total back up.
				end := 0.0
				for _, at := range clipAt {
					end = max(end, at)
				}
				clock[st] = max(clock[st], end+2*float64(p-1)*c.Transfer)
			}
			moved = true
		}
		return 0, 0, false, moved
	}
	if c.Cores.shared() && depth == 0 {
		c.Cores.share(p, func(st int) (float64, float64, bool, bool) {
			return advance(st, true)
		}, func(st int, start, end, busy float64) {
			o := l.Ops[st][next[st]]
			tl.Spans[st] = append(tl.Spans[st], Span{Action: o.Action, Start: start, End: end})
			tl.Busy[st] += busy
			clock[st] = end
			next[st]++
		})
	}
	for moved := !c.Cores.shared() || depth > 0; moved; {
		moved = false
		for st := range p {
			if _, _, _, m := advance(st, false); m {
				moved = true
			}
		}
	}
	var waits []string
	for st := range p {
		if n := next[st]; n < len(l.Ops[st]) {
			waits = append(waits, fmt.Sprintf("stage %d waits at %v", st, l.Ops[st][n]))
		}
	}
	if len(waits) > 0 {
		return nil, fmt.Errorf("deadlock: %s", strings.Join(waits, "; "))
	}
	if c.AllReduce == nil {
		tl.finish(clock, nil)
		return tl, nil
	}
	if c.ReduceAtStepEnd {
		for st := range p {
			rings[st].reduceAtEnd(c, st, clock[st])
		}
	}
	r := &reduced{rings: rings, bare: latest(clock)}
	if tied {
		// The waits moved the exchanges, and with them the stages' ends:
		// the step without all-reduces needs a play of its own.
		c.AllReduce = nil
		bare, err := l.playDepth(c, depth)
		if err != nil {
			return nil, err
		}
		r.bare = bare.Makespan
	}
	tl.finish(clock, r)
	return tl, nil
}
