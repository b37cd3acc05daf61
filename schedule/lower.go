package schedule

import (
	"fmt"
	"slices"
	"strings"
)

// A lowered schedule is a compute-only Schedule with its communication made
// explicit, as torch.distributed.pipelining lowers a compute schedule with
// passes (_add_send_recv, _add_reduce_grad) into the action list its runtime
// executes one by one. Each kind of traffic is added by its own pass, so new
// traffic (a data-parallel all-reduce, another placement of chunks) is a new
// pass and a new op, not an edit to every consumer. Lowering is pure: the
// same schedule always lowers to the same ops.

// OpKind says what one op of a lowered schedule does.
type OpKind uint8

const (
	Compute    OpKind = iota // run Action
	RecvAct                  // receive the input of Action (a forward) from Peer
	SendAct                  // send the output of Action (a forward) to Peer
	RecvGrad                 // receive the output gradient Action (B or I) needs from Peer
	SendGrad                 // send the input gradient Action (B or I) computed to Peer
	ReduceGrad               // the stage's gradients of Action.Chunk are final for the step: reduce them across replicas
	SyncTied                 // sum tied weight Index's two gradients, exchanging this stage's with Peer's (-1: both are here)
	ClipNorm                 // agree with every stage on the step's global gradient norm and clip the stage's gradients by it
	numOpKinds
)

func (k OpKind) String() string {
	switch k {
	case Compute:
		return "compute"
	case RecvAct:
		return "recv activation"
	case SendAct:
		return "send activation"
	case RecvGrad:
		return "recv gradient"
	case SendGrad:
		return "send gradient"
	case ReduceGrad:
		return "reduce gradients"
	case SyncTied:
		return "sum tied gradients"
	case ClipNorm:
		return "clip gradient norm"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one step of a lowered schedule. Action is the compute action the op
// runs or carries the tensor of (for ReduceGrad only its Stage and Chunk
// count, for SyncTied only its Stage); Peer is the stage at the other end of
// a send, receive or exchange, -1 otherwise; Index is SyncTied's tied weight.
type Op struct {
	Kind   OpKind
	Action Action
	Peer   int
	Index  int
}

// String renders an op in the grid's vocabulary: a compute op as its action
// ("2F0c1"); a receive as the action that needs it and "<" its sender
// ("2F0<1": stage 2 receives micro-batch 0's activation from stage 1,
// "2B0<3": its output gradient from stage 3); a send as the action that made
// it and ">" its receiver ("2F0>3", "2B0>1"); a reduction as "2R" (chunk 0)
// or "2Rc1"; a tied weight's exchange as "0T0~3" (weight 0, with stage 3) or
// "0T0" (both halves on stage 0); a gradient clipping as "2N". ParseOp
// inverts it.
func (o Op) String() string {
	switch o.Kind {
	case Compute:
		return o.Action.String()
	case RecvAct, RecvGrad:
		return fmt.Sprintf("%v<%d", o.Action, o.Peer)
	case SendAct, SendGrad:
		return fmt.Sprintf("%v>%d", o.Action, o.Peer)
	case ReduceGrad:
		if o.Action.Chunk != 0 {
			return fmt.Sprintf("%dRc%d", o.Action.Stage, o.Action.Chunk)
		}
		return fmt.Sprintf("%dR", o.Action.Stage)
	case SyncTied:
		if o.Peer < 0 {
			return fmt.Sprintf("%dT%d", o.Action.Stage, o.Index)
		}
		return fmt.Sprintf("%dT%d~%d", o.Action.Stage, o.Index, o.Peer)
	case ClipNorm:
		return fmt.Sprintf("%dN", o.Action.Stage)
	}
	return fmt.Sprintf("%v?%v", o.Action, o.Kind)
}

// ParseOp is the inverse of Op.String.
func ParseOp(s string) (Op, error) {
	if stage, rest, ok := leadingInt(s); ok && rest == "N" {
		return Op{Kind: ClipNorm, Action: Action{Stage: stage}, Peer: -1}, nil
	}
	if stage, rest, ok := leadingInt(s); ok && strings.HasPrefix(rest, "T") {
		index, tail, ok := leadingInt(rest[1:])
		if !ok {
			return Op{}, fmt.Errorf("parse op %q: want <stage>T<weight>[~<stage>]", s)
		}
		o := Op{Kind: SyncTied, Action: Action{Stage: stage}, Peer: -1, Index: index}
		if tail != "" {
			peer, end, ok := leadingInt(strings.TrimPrefix(tail, "~"))
			if !strings.HasPrefix(tail, "~") || !ok || end != "" {
				return Op{}, fmt.Errorf("parse op %q: want <stage>T<weight>[~<stage>]", s)
			}
			o.Peer = peer
		}
		return o, nil
	}
	if i := strings.IndexAny(s, "<>"); i >= 0 {
		a, err := ParseAction(s[:i])
		if err != nil {
			return Op{}, fmt.Errorf("parse op %q: %w", s, err)
		}
		peer, rest, ok := leadingInt(s[i+1:])
		if !ok || rest != "" {
			return Op{}, fmt.Errorf("parse op %q: want a stage number after %q", s, s[i])
		}
		o := Op{Action: a, Peer: peer}
		switch {
		case a.Kind == Forward && s[i] == '<':
			o.Kind = RecvAct
		case a.Kind == Forward:
			o.Kind = SendAct
		case (a.Kind == Backward || a.Kind == Input) && s[i] == '<':
			o.Kind = RecvGrad
		case a.Kind == Backward || a.Kind == Input:
			o.Kind = SendGrad
		default:
			return Op{}, fmt.Errorf("parse op %q: a %v pass sends and receives nothing", s, a.Kind)
		}
		return o, nil
	}
	if stage, rest, ok := leadingInt(s); ok && strings.HasPrefix(rest, "R") && !strings.HasPrefix(rest, "RF") {
		o := Op{Kind: ReduceGrad, Action: Action{Stage: stage}, Peer: -1}
		if rest = rest[1:]; rest != "" {
			c, tail, ok := leadingInt(strings.TrimPrefix(rest, "c"))
			if !strings.HasPrefix(rest, "c") || !ok || tail != "" {
				return Op{}, fmt.Errorf("parse op %q: want <stage>R or <stage>Rc<chunk>", s)
			}
			o.Action.Chunk = c
		}
		return o, nil
	}
	a, err := ParseAction(s)
	if err != nil {
		return Op{}, err
	}
	return Op{Kind: Compute, Action: a, Peer: -1}, nil
}

// Tag is Topology.Tag under Loop placement: the chunk of the upstream model
// stage of the boundary the op's tensor crosses.
func (o Op) Tag(stages int) int { return Topology{Stages: stages}.Tag(o) }

// TiedTag is the chunk tag a SyncTied op's gradient carries on the ring link
// between the last stage and stage 0: after the chunks-1 activation tags
// that link carries, one per tied weight.
func (o Op) TiedTag(chunks int) int { return chunks - 1 + o.Index }

// Lowered is a schedule with its communication: Ops[s] is everything stage s
// does in one training step, in order.
type Lowered struct {
	Name         string
	Stages       int
	MicroBatches int
	Chunks       int
	Placement    Placement
	Ops          [][]Op
}

// Pass adds one kind of traffic to a lowered schedule.
type Pass func(*Lowered)

// Lower checks a compute-only schedule and lowers it with the given passes,
// by default AddSendRecv then AddReduceGrad.
func Lower(s *Schedule, passes ...Pass) (*Lowered, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	if len(passes) == 0 {
		passes = []Pass{AddSendRecv, AddReduceGrad}
	}
	l := &Lowered{Name: s.Name, Stages: s.Stages, MicroBatches: s.MicroBatches, Chunks: s.Chunks, Placement: s.Placement, Ops: make([][]Op, s.Stages)}
	for st, list := range s.Actions {
		for _, a := range list {
			l.Ops[st] = append(l.Ops[st], Op{Kind: Compute, Action: a, Peer: -1})
		}
	}
	for _, pass := range passes {
		pass(l)
	}
	return l, nil
}

// AddSendRecv puts each compute op's receive right before it and its send
// right after it: a forward receives its input from the previous model
// stage's device (none on model stage 0, which reads data) and sends its
// output to the next (none on the last, which computes the loss); a full or
// input-gradient backward receives its output gradient from the next model
// stage's device (none on the last) and sends its input gradient to the
// previous one (none on model stage 0); a weight pass neither sends nor
// receives. Where two neighbouring model stages are chunks of one stage (the
// turn of a V) the send and the receive name that stage itself: a local
// hand-off, which costs no transfer.
func AddSendRecv(l *Lowered) {
	t := l.Topology()
	for st, ops := range l.Ops {
		var out []Op
		for _, o := range ops {
			if o.Kind != Compute {
				out = append(out, o)
				continue
			}
			a := o.Action
			recv, send := RecvAct, SendAct
			if a.Kind == Backward || a.Kind == Input {
				recv, send = RecvGrad, SendGrad
			}
			if a.Kind.communicates() {
				if from := t.RecvFrom(a); from >= 0 {
					out = append(out, Op{Kind: recv, Action: a, Peer: from})
				}
			}
			out = append(out, o)
			if a.Kind.communicates() {
				if to := t.SendTo(a); to >= 0 {
					out = append(out, Op{Kind: send, Action: a, Peer: to})
				}
			}
		}
		l.Ops[st] = out
	}
}

// AddReduceGrad puts, for each chunk of each stage, a ReduceGrad right after
// the op that completes the chunk's last gradient of the step (its last full
// backward or weight pass, and after that op's send): from there on the
// chunk's gradients may be reduced across data-parallel replicas while the
// stage computes on.
func AddReduceGrad(l *Lowered) {
	for st, ops := range l.Ops {
		last := make([]int, l.Chunks) // per chunk, the position of the last gradient-completing op
		for i := range last {
			last[i] = -1
		}
		for i, o := range ops {
			if o.Kind == Compute && (o.Action.Kind == Backward || o.Action.Kind == Weight) {
				last[o.Action.Chunk] = i
			} else if o.Kind == SendGrad && last[o.Action.Chunk] == i-1 && ops[i-1].Action == o.Action {
				last[o.Action.Chunk] = i
			}
		}
		var out []Op
		for i, o := range ops {
			out = append(out, o)
			for c, at := range last {
				if at == i {
					out = append(out, Op{Kind: ReduceGrad, Action: Action{Stage: st, Chunk: c}, Peer: -1})
				}
			}
		}
		l.Ops[st] = out
	}
}

// AddTiedSync returns the pass for a model with n tied weights, each held
// twice, by its first model stage and its last: it ends the lists of the
// stages holding them (stage 0 and the last stage under Loop placement) with
// one SyncTied per weight, which exchanges the two halves' gradients over the
// ring link and sums them, so both copies take the same step. When one stage
// holds both (a one-stage schedule, or stage 0 under V) the sum is local. A
// list that already has a weight's op keeps it.
func AddTiedSync(n int) Pass {
	return func(l *Lowered) {
		first, last := l.Topology().TiedStages()
		for _, st := range []int{first, last} {
			peer := first + last - st
			if first == last {
				peer = -1
			}
			for i := range n {
				has := false
				for _, o := range l.Ops[st] {
					has = has || o.Kind == SyncTied && o.Index == i
				}
				if !has {
					l.Ops[st] = append(l.Ops[st], Op{Kind: SyncTied, Action: Action{Stage: st}, Peer: peer, Index: i})
				}
			}
			if first == last {
				break
			}
		}
	}
}

// AddClipNorm is the pass for a run that clips its gradients by their global
// norm (train.clip_grad_norm): it ends every stage's list with a ClipNorm,
// after its reductions and tied weights' exchanges, so that the norm is
// taken over the gradients the optimizer will apply. The stages agree on
// the norm along the pipeline: each adds its part and passes the sum to the
// next stage, and the last passes the total back. A list that has the op
// keeps it.
func AddClipNorm(l *Lowered) {
	for st, ops := range l.Ops {
		if !slices.ContainsFunc(ops, func(o Op) bool { return o.Kind == ClipNorm }) {
			l.Ops[st] = append(ops, Op{Kind: ClipNorm, Action: Action{Stage: st}, Peer: -1})
		}
	}
}

// Compute returns the compute-only schedule inside a lowered one.
func (l *Lowered) Compute() *Schedule {
	s := &Schedule{Name: l.Name, Stages: l.Stages, MicroBatches: l.MicroBatches, Chunks: l.Chunks, Placement: l.Placement, Actions: make([][]Action, len(l.Ops))}
	for st, ops := range l.Ops {
		for _, o := range ops {
			if o.Kind == Compute {
				s.Actions[st] = append(s.Actions[st], o.Action)
			}
		}
	}
	return s
}

// Grid prints a lowered schedule one stage per line, as Schedule.Grid prints
// a compute-only one: "stage 0: 0F0 0F0>1 0F1 0F1>1 0B0<1 0B0 0R", after
// its placement line when the placement is not Loop.
func (l *Lowered) Grid() string {
	var b strings.Builder
	b.WriteString(placementLine(l.Placement))
	for st, ops := range l.Ops {
		b.WriteString(stageLabel(st, len(l.Ops)))
		for _, o := range ops {
			b.WriteString(" " + o.String())
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ParseLoweredGrid reads what Lowered.Grid prints; the sizes are those of its
// compute ops. The result is not checked: call Check.
func ParseLoweredGrid(text string) (*Lowered, error) {
	rows, pl, err := gridRows(text, ParseOp)
	if err != nil {
		return nil, err
	}
	l := &Lowered{Stages: len(rows), Chunks: 1, Placement: pl, Ops: rows}
	for _, ops := range rows {
		for _, o := range ops {
			if o.Kind == Compute {
				l.MicroBatches = max(l.MicroBatches, o.Action.MicroBatch+1)
			}
			l.Chunks = max(l.Chunks, o.Action.Chunk+1)
		}
	}
	return l, nil
}

// LowerEvaluation is an evaluation pass lowered under Loop placement; see
// Topology.LowerEvaluation.
func LowerEvaluation(stages, microBatches, chunks int) *Lowered {
	return Topology{Stages: stages, Chunks: chunks}.LowerEvaluation(microBatches)
}

// LowerEvaluation is an evaluation pass lowered: each micro-batch's forward
// through every chunk of every stage, micro-batch by micro-batch, with the
// receives and sends AddSendRecv gives forwards. Having no backward it is
// not a training schedule, so Check does not apply; it plays in the
// simulator's order without deadlock (the tests check).
func (t Topology) LowerEvaluation(microBatches int) *Lowered {
	l := &Lowered{Name: "evaluation", Stages: t.Stages, MicroBatches: microBatches, Chunks: t.Chunks, Placement: t.Placement, Ops: make([][]Op, t.Stages)}
	for st := range t.Stages {
		for k := range microBatches {
			for c := range t.Chunks {
				l.Ops[st] = append(l.Ops[st], Op{Kind: Compute, Action: Action{Stage: st, Kind: Forward, MicroBatch: k, Chunk: c}, Peer: -1})
			}
		}
	}
	AddSendRecv(l)
	return l
}
