package schedule

import (
	"fmt"
	"strings"
)

// Placement says which model stage each chunk of each stage holds. It is part
// of a schedule, not of its action lists: the same lists mean different
// traffic under different placements, so everything that turns a (stage,
// chunk) into a model stage or a neighbour asks the schedule's Topology.
type Placement uint8

const (
	// Loop places model stage chunk*p + stage on stage: the chunks wrap
	// round the stages (Megatron-LM's interleaved placement), so with
	// several chunks the last stage feeds stage 0 over a ring link. With one
	// chunk it is the plain pipeline.
	Loop Placement = iota
	// V places chunk c of stage s on model stage c*p + s for even c and
	// c*p + p-1-s for odd c: the forward runs down the stages on chunk 0,
	// turns on the last stage (model stages p-1 and p are its two chunks, a
	// local hand-off) and comes back up on chunk 1, so that with two chunks
	// stage 0 holds the first and the last model stage and no ring is needed
	// (ZB-V's placement). More chunks keep zig-zagging.
	V
	numPlacements
)

// String returns the name Load and the configs read: "loop" or "v".
func (pl Placement) String() string {
	switch pl {
	case Loop:
		return "loop"
	case V:
		return "v"
	}
	return fmt.Sprintf("Placement(%d)", uint8(pl))
}

// Placements lists the placement names, in a stable order.
func Placements() []string {
	out := make([]string, numPlacements)
	for i := range out {
		out[i] = Placement(i).String()
	}
	return out
}

// ParsePlacement is the inverse of Placement.String.
func ParsePlacement(s string) (Placement, error) {
	for i := range numPlacements {
		if Placement(i).String() == s {
			return Placement(i), nil
		}
	}
	return Loop, fmt.Errorf("unknown placement %q (known: %s)", s, strings.Join(Placements(), ", "))
}

// Topology is what a schedule's traffic depends on besides its lists: the
// number of stages, the chunks per stage and where the chunks sit.
type Topology struct {
	Stages, Chunks int
	Placement      Placement
}

// Topology returns the schedule's stages, chunks and placement.
func (s *Schedule) Topology() Topology {
	return Topology{Stages: s.Stages, Chunks: s.Chunks, Placement: s.Placement}
}

// Topology returns the lowered schedule's stages, chunks and placement.
func (l *Lowered) Topology() Topology {
	return Topology{Stages: l.Stages, Chunks: l.Chunks, Placement: l.Placement}
}

// ModelStages is the number of pieces the model is cut into.
func (t Topology) ModelStages() int { return t.Stages * t.Chunks }

// ModelStage returns the model stage that chunk `chunk` of stage `stage` holds.
func (t Topology) ModelStage(stage, chunk int) int {
	if t.Placement == V && chunk%2 == 1 {
		return chunk*t.Stages + t.Stages - 1 - stage
	}
	return chunk*t.Stages + stage
}

// Locate returns the stage and chunk that hold model stage k, the inverse of
// ModelStage.
func (t Topology) Locate(k int) (stage, chunk int) {
	stage, chunk = k%t.Stages, k/t.Stages
	if t.Placement == V && chunk%2 == 1 {
		stage = t.Stages - 1 - stage
	}
	return stage, chunk
}

// ModelStageOf returns the model stage a runs on.
func (t Topology) ModelStageOf(a Action) int { return t.ModelStage(a.Stage, a.Chunk) }

// on returns the action of kind k and a's micro-batch at model stage ms.
func (t Topology) on(a Action, k Kind, ms int) Action {
	st, c := t.Locate(ms)
	return Action{Stage: st, Kind: k, MicroBatch: a.MicroBatch, Chunk: c}
}

// RecvFrom returns the stage this action takes its input from, or -1 when
// the input is data (a forward on model stage 0), the loss (a backward or
// input-gradient pass on the last model stage) or the same device's
// input-gradient pass (a weight pass). The result is a.Stage itself when the
// neighbouring model stage is another chunk of the same stage: one stage
// with several chunks, or the turn of a V. That is a local hand-off, which
// needs no link.
func (t Topology) RecvFrom(a Action) int {
	ms := t.ModelStageOf(a)
	switch a.Kind {
	case Forward:
		if ms == 0 {
			return -1
		}
		st, _ := t.Locate(ms - 1)
		return st
	case Backward, Input:
		if ms == t.ModelStages()-1 {
			return -1
		}
		st, _ := t.Locate(ms + 1)
		return st
	}
	return -1
}

// SendTo returns the stage this action sends its output to, or -1 when none:
// a forward on the last model stage feeds the local loss, a backward or
// input-gradient pass on model stage 0 has no one upstream, and a weight pass
// never sends. As for RecvFrom, a.Stage itself means a local hand-off.
func (t Topology) SendTo(a Action) int {
	ms := t.ModelStageOf(a)
	switch a.Kind {
	case Forward:
		if ms == t.ModelStages()-1 {
			return -1
		}
		st, _ := t.Locate(ms + 1)
		return st
	case Backward, Input:
		if ms == 0 {
			return -1
		}
		st, _ := t.Locate(ms - 1)
		return st
	}
	return -1
}

// Tag is the chunk a send or receive's tensor is tagged with on the wire:
// the chunk of the upstream model stage of the boundary it crosses, so that
// the two ends agree whichever of them names it. It is -1 for other ops.
func (t Topology) Tag(o Op) int {
	ms := t.ModelStageOf(o.Action)
	switch o.Kind {
	case RecvAct, SendGrad:
		_, c := t.Locate(ms - 1)
		return c
	case SendAct, RecvGrad:
		return o.Action.Chunk
	}
	return -1
}

// Downstream reports whether a send's or receive's message travels from the
// end of its link that dials (the upstream stage, whose next stage the other
// is) to the end that listens. The link's upstream end sends every message
// as an activation and its downstream end as a gradient, whatever it
// carries: under Loop placement activations always travel downstream and
// gradients up (the ring's last stage dials stage 0), but under V chunk 1's
// activations travel from stage s+1 up to s, beside chunk 0's gradients.
func (t Topology) Downstream(o Op) bool {
	grad := o.Kind == SendGrad || o.Kind == RecvGrad
	if t.Placement != V {
		return !grad
	}
	from, to := o.Action.Stage, o.Peer
	if o.isRecv() {
		from, to = o.Peer, o.Action.Stage
	}
	return to == from+1
}

// Ring reports whether the last stage also links to stage 0: under Loop
// placement with several chunks the last stage feeds stage 0's next chunk
// that way, and the halves of weights tied between the first and the last
// model stage (tied) are summed over it when two stages hold them. The V's
// two chunks need no ring: stage 0 holds both ends of the model.
func (t Topology) Ring(tied bool) bool {
	if t.Stages < 2 {
		return false
	}
	first, last := t.TiedStages()
	return t.Placement == Loop && t.Chunks > 1 || tied && first != last
}

// TiedStages returns the stages holding the first and the last model stage:
// the two halves of a weight tied between them, summed over the ring when
// the two differ.
func (t Topology) TiedStages() (first, last int) {
	first, _ = t.Locate(0)
	last, _ = t.Locate(t.ModelStages() - 1)
	return first, last
}

// LossStage returns the stage that holds the last model stage: the one that
// draws the targets and computes the loss.
func (t Topology) LossStage() int {
	_, last := t.TiedStages()
	return last
}
