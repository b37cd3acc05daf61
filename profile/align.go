package profile

import "time"

// AlignThreshold is the largest clock offset Align leaves alone. Stages on one
// host share a clock, and there the estimate is only the links' delay
// asymmetry (tens of microseconds): shifting by it would add error, not
// remove it. Offsets between hosts run to milliseconds or seconds.
const AlignThreshold = time.Millisecond

// message is one tensor sent from one stage to another: an activation (a
// forward's output, into the next model stage's forward) or a gradient (a full
// backward's or input-gradient pass's output, into the previous model stage's
// backward). send and recv index events[stage][i]; recv is {-1, -1} when the
// receiver's event is not in the log.
type message struct {
	grad bool
	// link indexes the run's links: s for the link from stage s to s+1, and
	// p-1 for the ring from the last stage to the first (chunks > 1). It is the
	// activation sender's stage either way.
	link       int
	from, to   int // stages
	send, recv [2]int
}

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

// numLinks is how many links a run with p stages and v chunks has: one per
// pair of neighbours, plus the ring when chunks > 1.
func numLinks(p, v int) int {
	if v > 1 {
		return p
	}
	return max(p-1, 0)
}

// messages pairs every send in the logs with its receive. A forward on model
// stage k = chunk*p + stage (not the last) sends to model stage k+1's forward
// of the same micro-batch and step; a backward or input-gradient pass on model
// stage k > 0 sends to model stage k-1's backward or input-gradient pass.
func messages(events [][]Event) []message {
	p, v := topology(events)
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
	last := p*v - 1
	var out []message
	for s, stage := range events {
		for i, e := range stage {
			k := e.Chunk*p + s
			var m message
			switch {
			case e.Kind == Forward && k < last:
				m = message{link: s, from: s, to: (k + 1) % p}
				k++
			case (e.Kind == Backward || e.Kind == Input) && k > 0:
				m = message{grad: true, link: (k - 1) % p, from: s, to: (k - 1) % p}
				k--
			default:
				continue
			}
			m.send, m.recv = [2]int{s, i}, [2]int{-1, -1}
			if r, ok := idx[key{m.to, e.Step, e.MB, k / p, m.grad}]; ok {
				m.recv = r
			}
			out = append(out, m)
		}
	}
	return out
}

// ClockLink is what the messages between stage From and From+1 say about
// their clocks. A message's apparent delay, the receiver's start minus the
// sender's end, each on its own host's clock, is the true delay plus the
// receiver's clock offset minus the sender's. The smallest apparent delay
// each way is the nearest to a pure transfer (the receiver was already
// waiting and the message was not held up), and half their difference is the
// offset between the clocks when the two directions' fastest transfers take
// equally long (NTP's rule).
type ClockLink struct {
	From, To       int           // To = From + 1
	DownPairs      int           // activations From -> To with both ends logged
	UpPairs        int           // gradients To -> From with both ends logged
	MinDown, MinUp time.Duration // smallest apparent delay each way, raw clocks
	Offset         time.Duration // To's clock minus From's: (MinDown - MinUp) / 2; 0 without pairs both ways
	OffsetKnown    bool          // whether there were pairs both ways
	// Uncertainty bounds Offset's error, half the difference of the two ways'
	// true fastest delays, when neither is negative: (MinDown + MinUp) / 2.
	Uncertainty time.Duration
}

// Alignment is the estimate of each stage's clock relative to stage 0's.
type Alignment struct {
	// Offsets[s] is how far stage s's clock runs ahead of stage 0's: subtract
	// it from stage s's times to read them on stage 0's clock. Offsets are
	// chained along the neighbour links from stage 0 (with chunks the ring
	// gives a redundant path, which is not used).
	Offsets []time.Duration
	Links   []ClockLink // one per neighbour link s -> s+1
	// Shifted says whether the events were moved to stage 0's clock: only when
	// some |offset| reaches AlignThreshold.
	Shifted bool
}

// MaxOffset returns the largest |offset|.
func (a *Alignment) MaxOffset() time.Duration {
	var m time.Duration
	for _, o := range a.Offsets {
		m = max(m, o, -o)
	}
	return m
}

// Align estimates each stage's clock offset from stage 0's (see ClockLink)
// and returns the events on stage 0's clock: a shifted copy when the largest
// |offset| is at least AlignThreshold, events itself otherwise (callers must
// not modify it).
func Align(events [][]Event) (Alignment, [][]Event) {
	p := len(events)
	a := Alignment{Offsets: make([]time.Duration, p)}
	if p > 1 {
		a.Links = make([]ClockLink, p-1)
	}
	for s := range a.Links {
		a.Links[s] = ClockLink{From: s, To: s + 1}
	}
	for _, m := range messages(events) {
		if m.recv[0] < 0 || m.from == m.to || m.link >= p-1 { // unlogged, local, or the ring
			continue
		}
		send, recv := &events[m.send[0]][m.send[1]], &events[m.recv[0]][m.recv[1]]
		d := time.Duration(recv.StartNS - send.EndNS)
		l := &a.Links[m.link]
		if m.grad {
			if l.UpPairs == 0 || d < l.MinUp {
				l.MinUp = d
			}
			l.UpPairs++
		} else {
			if l.DownPairs == 0 || d < l.MinDown {
				l.MinDown = d
			}
			l.DownPairs++
		}
	}
	for s := range a.Links {
		l := &a.Links[s]
		if l.OffsetKnown = l.DownPairs > 0 && l.UpPairs > 0; l.OffsetKnown {
			l.Offset = (l.MinDown - l.MinUp) / 2
			l.Uncertainty = (l.MinDown + l.MinUp) / 2
		}
		a.Offsets[s+1] = a.Offsets[s] + l.Offset
	}
	if a.MaxOffset() < AlignThreshold {
		return a, events
	}
	a.Shifted = true
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
