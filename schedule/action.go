// Package schedule holds pipeline-parallel schedules as pure data, plus a
// simulator that plays them.
//
// A schedule is, per stage, the ordered list of actions (forward or backward
// of one micro-batch) that stage executes in one training step, in the style
// of torch.distributed.pipelining's schedules: printable, parsable, and
// checkable. Like etcd's raft package, everything here is pure and
// deterministic: no I/O beyond the reader or writer a caller hands in, no
// goroutines, no clocks. That lets the trainer, the CLI and the tests share one
// definition of what a schedule means, and lets a user-written schedule be
// rejected (with the offending action named) before any GPU time is spent on
// it.
//
// Model: p stages (devices, one process each), m micro-batches, and v chunks
// (virtual stages) per device. The model is cut into p*v model stages, and
// the schedule's Placement says which device holds which: under Loop, model
// stage k = chunk*p + stage lives on device k%p as chunk k/p (Megatron-LM's
// interleaved placement: device d holds model stages d, d+p, d+2p, ...);
// under V, device d holds model stages d and 2p-1-d (ZB-V's). With v = 1 a
// chunk is the whole stage and model stage k is device k. Topology answers
// every question of placement: which model stage a chunk holds, and which
// device a tensor comes from or goes to.
//
// Forward of micro-batch i at model stage k reads its input from model stage
// k-1 (model stage 0 reads data) and sends to k+1 (the last model stage
// computes the loss); so under Loop the last device's chunk c feeds the first
// device's chunk c+1, and under V the last device's chunk 0 feeds its own
// chunk 1. The backward either runs whole (Backward, "B") or split in two:
// Input ("I") computes the gradient with respect to the stage input, which is
// what the previous model stage waits for, and Weight ("W") computes the
// weight gradients from what Input left behind and sends nothing. A backward
// or input-gradient pass at model stage k reads the gradient from k+1 (the
// last model stage reads its own loss), needs the same device's forward of
// that micro-batch, and sends to k-1; a weight pass needs only the same
// device's input-gradient pass. Sends never block.
//
// Such a schedule holds compute only. Lower adds its communication, one pass
// per kind of traffic (sends and receives, gradient reductions), into a
// Lowered schedule of Ops that checks, simulates, prints and parses the same
// way (lower.go, lowered_check.go).
package schedule

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is the kind of work an action does.
type Kind uint8

const (
	Forward   Kind = iota // printed "F"
	Backward              // printed "B": the full backward (input and weight gradients)
	Input                 // printed "I": gradient with respect to the stage input only
	Weight                // printed "W": weight gradients only, after Input
	Recompute             // printed "RF": the forward run again from the stashed input, right before B or I
	numKinds
)

// String returns "F", "B", "I" or "W" (or "Kind(n)" for an invalid value, so
// that a corrupt action still prints recognisably in error messages).
func (k Kind) String() string {
	switch k {
	case Forward:
		return "F"
	case Backward:
		return "B"
	case Input:
		return "I"
	case Weight:
		return "W"
	case Recompute:
		return "RF"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// communicates reports whether an action of kind k receives or sends a
// tensor: forwards and backwards do; weight passes and recomputations work
// on what the stage already holds.
func (k Kind) communicates() bool { return k == Forward || k == Backward || k == Input }

// Action is one unit of work a stage executes: Kind of MicroBatch on the
// stage's chunk Chunk (always 0 unless the schedule has several chunks per
// stage).
type Action struct {
	Stage      int
	Kind       Kind
	MicroBatch int
	Chunk      int
}

// String renders the action compactly, stage then kind then micro-batch:
// "2F0" is stage 2, forward, micro-batch 0. A non-zero Chunk is appended as
// "c<chunk>" ("2F0c1") so that String stays injective and ParseAction can
// invert it.
func (a Action) String() string {
	s := strconv.Itoa(a.Stage) + a.Kind.String() + strconv.Itoa(a.MicroBatch)
	if a.Chunk != 0 {
		s += "c" + strconv.Itoa(a.Chunk)
	}
	return s
}

// ParseAction is the inverse of Action.String. It is strict (no spaces, no
// signs, upper-case kind) so that a typo in a hand-written schedule is an
// error rather than a silently different action.
func ParseAction(s string) (Action, error) {
	fail := func(why string) (Action, error) {
		return Action{}, fmt.Errorf("parse action %q: %s (want <stage><F|B|I|W|RF><micro-batch>[c<chunk>], e.g. \"2F0\")", s, why)
	}
	rest := s
	stage, rest, ok := leadingInt(rest)
	if !ok {
		return fail("missing or invalid stage number")
	}
	if rest == "" {
		return fail("missing kind")
	}
	var a Action
	a.Stage = stage
	switch rest[0] {
	case 'F':
		a.Kind = Forward
	case 'B':
		a.Kind = Backward
	case 'I':
		a.Kind = Input
	case 'W':
		a.Kind = Weight
	case 'R':
		if !strings.HasPrefix(rest, "RF") {
			return fail("unknown kind \"R\" (recomputation is \"RF\")")
		}
		a.Kind, rest = Recompute, rest[1:]
	default:
		return fail(fmt.Sprintf("unknown kind %q", rest[0]))
	}
	a.MicroBatch, rest, ok = leadingInt(rest[1:])
	if !ok {
		return fail("missing or invalid micro-batch number")
	}
	if len(rest) > 0 && rest[0] == 'c' {
		a.Chunk, rest, ok = leadingInt(rest[1:])
		if !ok {
			return fail("missing or invalid chunk number")
		}
	}
	if rest != "" {
		return fail(fmt.Sprintf("unexpected %q after the action", rest))
	}
	return a, nil
}

// leadingInt splits the leading run of ASCII digits off s and converts it.
// ok is false when there are no digits or the number overflows an int.
func leadingInt(s string) (n int, rest string, ok bool) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, s, false
	}
	n, err := strconv.Atoi(s[:i])
	if err != nil {
		return 0, s, false
	}
	return n, s[i:], true
}

// ModelStage returns the model stage the action runs under Loop placement,
// Chunk * stages + Stage; Topology.ModelStageOf takes any placement.
func (a Action) ModelStage(stages int) int { return a.Chunk*stages + a.Stage }

// RecvFrom is Topology.RecvFrom under Loop placement: with several chunks the
// previous model stage of chunk c on stage 0 is the last stage's chunk c-1
// (round the ring).
func (a Action) RecvFrom(stages, chunks int) int {
	return Topology{Stages: stages, Chunks: chunks}.RecvFrom(a)
}

// SendTo is Topology.SendTo under Loop placement.
func (a Action) SendTo(stages, chunks int) int {
	return Topology{Stages: stages, Chunks: chunks}.SendTo(a)
}
