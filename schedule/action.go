// Package schedule holds pipeline-parallel schedules as pure data, plus a
// simulator that plays them.
//
// A schedule is, per stage, the ordered list of actions (forward or backward
// of one micro-batch) that stage executes in one training step, in the style
// of torch.distributed.pipelining's schedules: printable, parsable, and
// checkable. Like etcd's raft package, everything here is pure and
// deterministic: no I/O, no goroutines, no clocks. That lets the trainer, the
// CLI and the tests share one definition of what a schedule means, and lets a
// user-written schedule be rejected (with the offending action named) before
// any GPU time is spent on it.
//
// Model: p stages, m micro-batches. Forward of micro-batch i on stage s reads
// its input from stage s-1 (stage 0 reads data) and sends to s+1 (the last
// stage computes the loss). Backward of i on stage s reads the gradient from
// s+1 (the last stage reads its own loss) and sends to s-1 (stage 0 sends
// nothing); it also needs forward of i on the same stage, whose activations it
// consumes. Sends never block.
package schedule

import (
	"fmt"
	"strconv"
)

// Kind is the kind of work an action does.
type Kind uint8

const (
	Forward  Kind = iota // printed "F"
	Backward             // printed "B"
)

// String returns "F" or "B" (or "Kind(n)" for an invalid value, so that a
// corrupt action still prints recognisably in error messages).
func (k Kind) String() string {
	switch k {
	case Forward:
		return "F"
	case Backward:
		return "B"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Action is one unit of work a stage executes. Chunk is reserved for
// interleaved schedules (several model chunks per stage) and is 0 for now;
// Check rejects other values.
type Action struct {
	Stage      int
	Kind       Kind
	MicroBatch int
	Chunk      int
}

// String renders the action compactly, stage then kind then micro-batch:
// "2F0" is stage 2, forward, micro-batch 0. A non-zero Chunk is appended as
// "c<chunk>" ("2F0c1") so that String stays injective and ParseAction can
// invert it; today's schedules never print it.
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
		return Action{}, fmt.Errorf("parse action %q: %s (want <stage><F|B><micro-batch>, e.g. \"2F0\")", s, why)
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

// RecvFrom returns the stage this action takes its input from, or -1 when the
// input is local: data for a forward on stage 0, the loss for a backward on
// the last stage.
func (a Action) RecvFrom(stages int) int {
	if a.Kind == Forward {
		if a.Stage == 0 {
			return -1
		}
		return a.Stage - 1
	}
	if a.Stage == stages-1 {
		return -1
	}
	return a.Stage + 1
}

// SendTo returns the stage this action sends its output to, or -1 when none:
// a forward on the last stage feeds the local loss, a backward on stage 0 has
// no one upstream.
func (a Action) SendTo(stages int) int {
	if a.Kind == Forward {
		if a.Stage == stages-1 {
			return -1
		}
		return a.Stage + 1
	}
	if a.Stage == 0 {
		return -1
	}
	return a.Stage - 1
}
