package profile

import (
	"slices"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

// AlignThreshold is how long before its send a message may appear to arrive,
// on the logged clocks, without Align shifting a clock. Stages on one host
// share a clock, and there every message is received after its send began; a
// message that seems to arrive earlier does so by timing noise (a stage
// descheduled between Send returning and its action's end being stamped
// makes send_ns end early: up to a millisecond was seen with four stages on
// two cores). Offsets between hosts that are not synchronised run to
// milliseconds or seconds.
const AlignThreshold = time.Millisecond

// noiseShare is the share of each direction's messages over a link whose
// apparent delays Align sets aside as timing noise before taking the
// smallest: 1 in 50 (none below 50 messages).
const noiseShare = 50

// message is one tensor sent from one stage to another: an activation (a
// forward's output, into the next model stage's forward) or a gradient (a full
// backward's or input-gradient pass's output, into the previous model stage's
// backward). send and recv index events[stage][i]; recv is {-1, -1} when the
// receiver's event is not in the log.
type message struct {
	grad bool
	// link indexes the run's links: s for the link stage s dials, to s+1, and
	// p-1 for the ring from the last stage to the first (Loop placement with
	// chunks > 1). Under Loop placement it is the activation sender's stage;
	// under V the upper of the two stages, whichever way the tensor goes.
	link       int
	from, to   int // stages; equal for a hand-off between a stage's chunks
	send, recv [2]int
}

// down reports whether m crosses its link from the dialing end (From) to the
// listening one (To): always an activation under Loop placement; under V
// chunk 0's activations and chunk 1's gradients.
func (m message) down() bool { return m.from == m.link }

// topology returns the number of stages and chunks per stage of a run's logs:
// the chunks are one more than the largest chunk logged.
func topology(events [][]Event) (p, v int) {
	v = 1
	for _, stage := range events {
		for _, e := range stage {
			v = max(v, e.Chunk+1)
		}
	}
	return len(events), v
}

// placed is the run's topology: its logs' stages and chunks, and the
// placement the run says it used.
func placed(events [][]Event, pl schedule.Placement) schedule.Topology {
	p, v := topology(events)
	return schedule.Topology{Stages: p, Chunks: v, Placement: pl}
}

// RunPlacement returns where a run placed its chunks: the placement run.json
// names, else the built-in schedule's (Loop for runs logged before the field
// existed, and for a name it does not know).
func RunPlacement(info RunInfo) schedule.Placement {
	if pl, err := schedule.ParsePlacement(info.Placement); err == nil && info.Placement != "" {
		return pl
	}
	pl, _ := schedule.PlacementOf(info.Schedule)
	return pl
}

// numLinks is how many links a run of topology t has: one per pair of
// neighbours, plus the ring when the chunks wrap round it.
func numLinks(t schedule.Topology) int {
	if t.Ring(false) {
		return t.Stages
	}
	return max(t.Stages-1, 0)
}

// messages pairs every send in the logs with its receive under placement pl.
// A forward on model stage k (not the last) sends to model stage k+1's
// forward of the same micro-batch and step; a backward or input-gradient pass
// on model stage k > 0 sends to model stage k-1's backward or input-gradient
// pass. Hand-offs between a stage's chunks (the turn of a V) are included,
// with from == to.
func messages(events [][]Event, pl schedule.Placement) []message {
	top := placed(events, pl)
	type key struct {
		stage, step, mb, chunk int
		back                   bool
	}
	idx := map[key][2]int{}
	for s, stage := range events {
		for i, e := range stage {
			switch e.Kind {
			case Forward:
				idx[key{s, e.Step, e.MB, e.Chunk, false}] = [2]int{s, i}
			case Backward, Input:
				idx[key{s, e.Step, e.MB, e.Chunk, true}] = [2]int{s, i}
			}
		}
	}
	last := top.ModelStages() - 1
	var out []message
	for s, stage := range events {
		for i, e := range stage {
			k := top.ModelStage(s, e.Chunk)
			var m message
			switch {
			case e.Kind == Forward && k < last:
				m = message{from: s}
				k++
			case (e.Kind == Backward || e.Kind == Input) && k > 0:
				m = message{grad: true, from: s}
				k--
			default:
				continue
			}
			to, chunk := top.Locate(k)
			m.to = to
			switch {
			case pl == schedule.V:
				m.link = min(m.from, m.to)
			case m.grad:
				m.link = m.to
			default:
				m.link = m.from
			}
			m.send, m.recv = [2]int{s, i}, [2]int{-1, -1}
			if r, ok := idx[key{m.to, e.Step, e.MB, chunk, m.grad}]; ok {
				m.recv = r
			}
			out = append(out, m)
		}
	}
	return out
}

// ClockLink is what the messages between stage From and From+1 say about
// their clocks. A message's apparent delay is the receiver's start minus the
// start of the sender's Send (end_ns - send_ns), each on its own host's
// clock: the true delay, never negative, plus the receiver's clock offset
// minus the sender's. So the offset To - From lies in [-MinUp, MinDown], and
// stages on one clock (offset 0) show no negative apparent delay.
//
// Align leaves a link's clocks alone unless its messages demand a shift: a
// (noise aside) negative apparent delay longer than AlignThreshold. Then it
// takes the middle of that range, (MinDown - MinUp) / 2, which is NTP's rule:
// exact when the two ways' fastest transfers take equally long. A link whose
// stages recorded one clock (Clock.Shares) is never shifted, whatever its
// messages say: SharedClock is set, and its offset is 0 exactly.
type ClockLink struct {
	From, To  int // To = From + 1
	DownPairs int // tensors From -> To with both ends logged: activations (under a V, also chunk 1's gradients)
	UpPairs   int // tensors To -> From with both ends logged: gradients (under a V, also chunk 1's activations)
	// MinDown and MinUp are the smallest apparent delay each way on the
	// logged clocks, after setting aside the earliest 1 in 50 of each way's
	// messages (none below 50) as timing noise.
	MinDown, MinUp time.Duration
	OffsetKnown    bool // whether there were pairs both ways
	// Estimate is To's clock minus From's by NTP's rule, (MinDown - MinUp) / 2;
	// 0 without pairs both ways.
	Estimate time.Duration
	// Violation is how long before their send the link's messages appear to
	// arrive on the logged clocks: max(0, -MinDown, -MinUp).
	Violation time.Duration
	// SharedClock says whether From and To recorded one clock (Clock.Shares).
	SharedClock bool
	// Shifted says whether To's clock is shifted from From's: the stages do
	// not share a clock, Violation exceeds AlignThreshold and there were pairs
	// both ways.
	Shifted bool
	// Offset is the offset applied: Estimate when Shifted, else 0 (the stages
	// are taken to share a clock).
	Offset time.Duration
	// Uncertainty bounds |Offset - the true offset|, never negative: for a
	// shifted link half the width of [-MinUp, MinDown], (MinDown + MinUp) / 2;
	// for one left alone the farther end of that range from 0 (0 when the
	// stages do share a clock, but the logs cannot tell); 0 for a SharedClock
	// link. When the range is empty (Conflict: MinDown + MinUp < 0) no
	// constant offset agrees with every message, and Uncertainty is half the
	// disagreement; Conflict is never set on a SharedClock link, whose offset
	// is known.
	Uncertainty time.Duration
	Conflict    bool
}

// Alignment is the estimate of each stage's clock relative to stage 0's.
type Alignment struct {
	// Offsets[s] is how far stage s's clock runs ahead of stage 0's, as
	// applied: subtract it from stage s's times to read them on stage 0's
	// clock. Offsets are chained along the neighbour links from stage 0 (with
	// chunks the ring gives a redundant path, which is not used); a stage that
	// shares a clock with an earlier one (Clock.Shares) takes that stage's
	// offset.
	Offsets []time.Duration
	// Errors[s] bounds the error of Offsets[s]: the sum of the links'
	// Uncertainty along the chain from stage 0 (the earlier stage's error, for
	// a stage that shares its clock).
	Errors []time.Duration
	Links  []ClockLink // one per neighbour link s -> s+1
	// Shifted says whether the events were moved to stage 0's clock: whether
	// any link was shifted.
	Shifted bool
	// Clocks are the clocks the stages recorded, as given to Align (nil when
	// none did).
	Clocks []Clock
	// estimated[s] says whether a link with Conflict lies on the chain that
	// gave Offsets[s], so that Errors[s] is an estimate rather than a bound.
	estimated []bool
}

// MaxOffset returns the largest |offset| applied.
func (a *Alignment) MaxOffset() time.Duration {
	var m time.Duration
	for _, o := range a.Offsets {
		m = max(m, o, -o)
	}
	return m
}

// MaxError returns the largest of Errors, and whether a link on the chain to
// that stage had messages that no constant offset agrees with (Conflict), so
// that the figure is an estimate rather than a bound.
func (a *Alignment) MaxError() (d time.Duration, conflict bool) {
	for s, e := range a.Errors {
		est := s < len(a.estimated) && a.estimated[s]
		if e > d || e == d && est {
			d, conflict = e, est
		}
	}
	return d, conflict
}

// fastest sorts ds and returns the smallest after setting aside the earliest
// 1 in noiseShare.
func fastest(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/noiseShare]
}

// Align estimates each stage's clock offset from stage 0's (see ClockLink)
// and returns the events on stage 0's clock: a shifted copy when some link's
// messages demand a shift, events itself otherwise (callers must not modify
// it). clocks[s] is the clock stage s recorded (ReadClocks); stages beyond
// clocks, nil included, have none, and their links are judged by their
// messages alone.
func Align(events [][]Event, clocks []Clock) (Alignment, [][]Event) {
	return AlignPlaced(events, clocks, schedule.Loop)
}

// AlignPlaced is Align for a run whose chunks sit as pl says (RunPlacement),
// which decides which events send to which.
func AlignPlaced(events [][]Event, clocks []Clock, pl schedule.Placement) (Alignment, [][]Event) {
	p := len(events)
	a := Alignment{Offsets: make([]time.Duration, p), Errors: make([]time.Duration, p), Clocks: clocks,
		estimated: make([]bool, p)}
	if p > 1 {
		a.Links = make([]ClockLink, p-1)
	}
	down, up := make([][]time.Duration, len(a.Links)), make([][]time.Duration, len(a.Links))
	for _, m := range messages(events, pl) {
		if m.recv[0] < 0 || m.from == m.to || m.link >= p-1 { // unlogged, local, or the ring
			continue
		}
		send, recv := &events[m.send[0]][m.send[1]], &events[m.recv[0]][m.recv[1]]
		d := time.Duration(recv.StartNS - (send.EndNS - send.SendNS))
		if m.down() {
			down[m.link] = append(down[m.link], d)
		} else {
			up[m.link] = append(up[m.link], d)
		}
	}
	for s := range a.Links {
		l := &a.Links[s]
		*l = ClockLink{From: s, To: s + 1, DownPairs: len(down[s]), UpPairs: len(up[s])}
		if l.DownPairs > 0 {
			l.MinDown = fastest(down[s])
			l.Violation = max(l.Violation, -l.MinDown)
		}
		if l.UpPairs > 0 {
			l.MinUp = fastest(up[s])
			l.Violation = max(l.Violation, -l.MinUp)
		}
		if l.OffsetKnown = l.DownPairs > 0 && l.UpPairs > 0; l.OffsetKnown {
			l.Estimate = (l.MinDown - l.MinUp) / 2
		}
		l.SharedClock = clockAt(clocks, s).Shares(clockAt(clocks, s+1))
		if l.OffsetKnown && !l.SharedClock {
			width := l.MinDown + l.MinUp
			l.Conflict = width < 0
			l.Shifted = l.Violation > AlignThreshold
			switch {
			case l.Conflict:
				l.Uncertainty = -width / 2
			case l.Shifted:
				l.Uncertainty = width / 2
			default:
				l.Uncertainty = max(l.MinDown, l.MinUp)
			}
			if l.Shifted {
				l.Offset = l.Estimate
			}
		}
		a.Shifted = a.Shifted || l.Shifted
		a.Offsets[s+1] = a.Offsets[s] + l.Offset
		a.Errors[s+1] = a.Errors[s] + l.Uncertainty
		a.estimated[s+1] = a.estimated[s] || l.Conflict
		for t := 0; t <= s; t++ {
			if clockAt(clocks, t).Shares(clockAt(clocks, s+1)) {
				a.Offsets[s+1], a.Errors[s+1], a.estimated[s+1] = a.Offsets[t], a.Errors[t], a.estimated[t]
				break
			}
		}
	}
	if !a.Shifted {
		return a, events
	}
	out := make([][]Event, p)
	for s, stage := range events {
		out[s] = make([]Event, len(stage))
		off := int64(a.Offsets[s])
		for i, e := range stage {
			e.StartNS -= off
			e.EndNS -= off
			out[s][i] = e
		}
	}
	return a, out
}
