package profile

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

// jittered returns a delay function: base down or up, plus a jitter of up to
// spread that is 0 in step 0, whose first messages each way find their
// receiver waiting, so the fastest pair each way is a pure transfer.
func jittered(down, up, spread int64) func(step int, grad bool, from, to, mb int) int64 {
	return func(step int, grad bool, from, to, mb int) int64 {
		j := int64((step*7+mb*3+from)%5) * spread / 4
		if step == 0 {
			j = 0
		}
		if grad {
			return up + j
		}
		return down + j
	}
}

func TestAlignRecoversOffsets(t *testing.T) {
	s := build(t, "1f1b", 4, 8, 1)
	truth := []int64{0, 0, 3_700_000_000, -1_200_000_000} // stage 2 +3.7 s, stage 3 -1.2 s
	run := play{sched: s, steps: 5, opt: ms, gap: 5 * ms, act: 1 << 16, grad: 1 << 16,
		// Equal fastest delays both ways (200 us), different jitter: down up
		// to 300 us more, up to 100 us more.
		delay: func(step int, grad bool, from, to, mb int) int64 {
			if grad {
				return jittered(0, 200_000, 100_000)(step, grad, from, to, mb)
			}
			return jittered(200_000, 0, 300_000)(step, grad, from, to, mb)
		}}
	plain := run.events(t)
	run.clock = truth
	skewed := run.events(t)

	a, aligned := Align(skewed, nil)
	if !a.Shifted {
		t.Fatal("offsets of seconds not shifted")
	}
	for st, want := range truth {
		if got := a.Offsets[st]; got != time.Duration(want) {
			t.Errorf("stage %d offset %v, want %v", st, got, time.Duration(want))
		}
	}
	if !reflect.DeepEqual(aligned, plain) {
		t.Error("aligned events differ from the unshifted run's")
	}
	for _, l := range a.Links {
		if !l.OffsetKnown || l.DownPairs != 5*8 || l.UpPairs != 5*8 || l.Uncertainty != 200*time.Microsecond {
			t.Errorf("link %+v: want pairs both ways and uncertainty 200us", l)
		}
	}

	// The unshifted logs' offsets are 0, and nothing moves.
	ap, same := Align(plain, nil)
	if ap.Shifted || ap.MaxOffset() != 0 || &same[0][0] != &plain[0][0] {
		t.Errorf("unshifted logs: %+v", ap)
	}

	// Same report but for the clocks.
	info := runInfo(s, 5)
	rp, err := Analyse(info, plain, 1)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Analyse(info, skewed, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Clock.Shifted || rp.Clock.Shifted {
		t.Fatalf("shifted %v and %v, want true and false", rs.Clock.Shifted, rp.Clock.Shifted)
	}
	var bp, bs strings.Builder
	rp.Write(&bp, Options{Steps: true})
	rs.Write(&bs, Options{Steps: true})
	if !strings.Contains(bs.String(), "+3700.000") || !strings.Contains(bs.String(), "-1200.000") ||
		!strings.Contains(bs.String(), "clocks: shifted to stage 0's (largest offset 3700.000 ms") {
		t.Errorf("offsets not reported:\n%s", bs.String())
	}
	rs.Clock = rp.Clock
	if !reflect.DeepEqual(rs, rp) {
		t.Errorf("reports differ:\n%+v\n%+v", rs, rp)
	}
	bs.Reset()
	rs.Write(&bs, Options{Steps: true})
	if bs.String() != bp.String() {
		t.Errorf("shifted run's report:\n%s\nunshifted:\n%s", bs.String(), bp.String())
	}
}

func TestAlignAsymmetricDelays(t *testing.T) {
	s := build(t, "1f1b", 4, 8, 1)
	truth := []int64{0, 0, 3_700_000_000, -1_200_000_000}
	const down, up = 200_000, 250_000 // the fastest gradient takes 50 us longer
	run := play{sched: s, steps: 5, opt: ms, gap: 5 * ms, act: 1 << 16, grad: 1 << 16, delay: jittered(down, up, 120_000)}
	plain := run.events(t)
	run.clock = truth
	skewed := run.events(t)

	a, _ := Align(skewed, nil)
	// Each link's estimate is off by half the asymmetry, and the errors add
	// up along the chain.
	for st, want := range truth {
		got := int64(a.Offsets[st])
		if bound := int64(st) * (up - down) / 2; max(got-want, want-got) > bound {
			t.Errorf("stage %d offset %v, want %v within %v", st, time.Duration(got), time.Duration(want), time.Duration(bound))
		}
	}
	// On one clock no message arrives before it is sent: nothing moves,
	// though NTP's rule would see half the asymmetry on each link.
	if ap, _ := Align(plain, nil); ap.Shifted || ap.MaxOffset() != 0 || ap.Links[2].Estimate != -(up-down)/2 {
		t.Errorf("same-host logs: %+v, want estimates of half the asymmetry, not applied", ap)
	}

	info := runInfo(s, 5)
	rp, _ := Analyse(info, plain, 1)
	rs, _ := Analyse(info, skewed, 1)
	// Windows shift by at most the largest pairwise error (75 us) per step.
	tol := time.Duration(rs.StepsAnalysed) * 3 * (up - down) / 2
	if d := rs.Window - rp.Window; d > tol || -d > tol {
		t.Errorf("window %v vs %v, want within %v", rs.Window, rp.Window, tol)
	}
	for i := range rp.Stages {
		p, q := rp.Stages[i], rs.Stages[i]
		// The prediction uses the measured link delays, which move with the
		// alignment error like the bubble does.
		if p.Busy != q.Busy || p.Wait != q.Wait || p.BytesSent != q.BytesSent || abs(p.PredictedBubble-q.PredictedBubble) > 0.005 ||
			abs(p.Bubble-q.Bubble) > 0.005 {
			t.Errorf("stage %d: %+v vs %+v", i, q, p)
		}
	}
	for i := range rp.Links {
		for _, d := range []time.Duration{rs.Links[i].Down.MeanDelay - rp.Links[i].Down.MeanDelay, rs.Links[i].Up.MeanDelay - rp.Links[i].Up.MeanDelay} {
			if d > 100*time.Microsecond || -d > 100*time.Microsecond {
				t.Errorf("link %d delays %+v vs %+v", i, rs.Links[i], rp.Links[i])
			}
		}
	}
}

func abs(x float64) float64 { return max(x, -x) }

func TestAlignWithoutPairs(t *testing.T) {
	// Two stages that only ever send forward: no gradients to pair with.
	events := [][]Event{
		{ev(0, 0, "F", 0, 0, 1, 0, 1, 1)},
		{ev(1, 0, "F", 0, 5001, 5002, 1, 0, 1)},
	}
	a, out := Align(events, nil)
	if a.Shifted || a.Links[0].OffsetKnown || a.Offsets[1] != 0 || &out[0][0] != &events[0][0] {
		t.Errorf("%+v", a)
	}
	r, err := Analyse(RunInfo{Schedule: "gpipe", MicroBatches: 1}, events, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.Write(&b)
	if !strings.Contains(b.String(), "no messages both ways between stages 0 and 1") {
		t.Errorf("missing warning:\n%s", b.String())
	}
}

// TestAlignOneClockYield: stages on one host, whose receivers start while the
// sender still yields in Send, before its action is stamped as ended (the
// yield is in send_ns). Against the actions' ends the gradients seem to
// arrive 3 ms early and the activations 0.2 ms, which NTP's rule read as
// offsets of 1.4 ms a link with a negative error bound; against the start of
// Send every message arrives after it was sent, so nothing moves.
func TestAlignOneClockYield(t *testing.T) {
	s := build(t, "1f1b", 3, 8, 1)
	run := play{sched: s, steps: 4, opt: ms, gap: ms, act: 1, grad: 1,
		cost: func(_, _ int, k schedule.Kind) int64 {
			if k == schedule.Backward {
				return 4 * ms
			}
			return ms
		},
		sendNS: func(_, _ int, k schedule.Kind) int64 {
			if k == schedule.Backward {
				return 3_500_000
			}
			return 500_000
		},
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return -3 * ms
			}
			return -200_000
		}}
	events := run.events(t)
	a, out := Align(events, nil)
	if a.Shifted || a.MaxOffset() != 0 || &out[0][0] != &events[0][0] {
		t.Errorf("one clock shifted: %+v", a)
	}
	for _, l := range a.Links {
		if l.Violation != 0 || l.Conflict || l.Uncertainty < 0 || l.MinDown != 300*time.Microsecond || l.MinUp != 500*time.Microsecond {
			t.Errorf("link %+v: want no violation, delays of 0.3 and 0.5 ms from the start of Send", l)
		}
	}
	r, err := Analyse(runInfo(s, 4), events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.Write(&b)
	if !strings.Contains(b.String(), "clocks: not shifted: no message arrived more than 1.000 ms before it was sent") {
		t.Errorf("report:\n%s", b.String())
	}
}

// TestAlignOneClockOutlier: one message in 64 each way that seems to arrive
// 1.9 ms before it was sent, its sender descheduled for 2 ms between Send
// returning and stamping the action's end, is set aside as noise, not taken
// for a clock offset.
func TestAlignOneClockOutlier(t *testing.T) {
	s := build(t, "1f1b", 2, 8, 1)
	run := play{sched: s, steps: 8, opt: ms, gap: ms, act: 1, grad: 1,
		delay: func(int, bool, int, int, int) int64 { return 100_000 }}
	late := func(events [][]Event) [][]Event {
		for i, e := range events[1] {
			if e.Step == 3 && e.Kind == Backward && e.MB == 2 {
				events[1][i].EndNS += 2 * ms
			}
		}
		return events
	}
	a, _ := Align(late(run.events(t)), nil)
	l := a.Links[0]
	if a.Shifted || a.MaxOffset() != 0 || l.UpPairs != 64 || l.MinUp != 100*time.Microsecond || l.Violation != 0 {
		t.Errorf("one outlier shifted the clocks: %+v", a)
	}

	// Every message early by more than the threshold is a clock offset.
	run.clock = []int64{0, -5 * ms}
	a, _ = Align(late(run.events(t)), nil)
	if l := a.Links[0]; !a.Shifted || l.Offset != -5*time.Millisecond || l.Violation != 4900*time.Microsecond {
		t.Errorf("clock 5 ms behind: %+v", a)
	}
}

// TestAlignErrorNeverNegative: hosts 3.7 s apart whose logs have no send_ns
// for a yield during which receivers started (activations taken 0.3 ms
// before the sender's end). No one offset fits every message; the shift is
// still made, and the error is reported as an estimate, never negative.
func TestAlignErrorNeverNegative(t *testing.T) {
	s := build(t, "1f1b", 2, 4, 1)
	run := play{sched: s, steps: 5, opt: ms, gap: ms, act: 1, grad: 1, clock: []int64{0, 3_700_000_000},
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return 100_000
			}
			return -300_000
		}}
	events := run.events(t)
	a, _ := Align(events, nil)
	l := a.Links[0]
	if !a.Shifted || !l.Conflict || l.Uncertainty != 100*time.Microsecond || a.Errors[1] != 100*time.Microsecond ||
		l.Offset != 3_700_000_000-200_000 {
		t.Errorf("%+v: want a shift of 3.7 s - 0.2 ms, a conflict of 0.2 ms", a)
	}
	r, err := Analyse(runInfo(s, 5), events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.Write(&b)
	for _, want := range []string{"clocks: shifted to stage 0's (largest offset 3699.800 ms, error about 0.100 ms)",
		"clocks: no one offset fits every message between stages 0 and 1 (they disagree by 0.200 ms)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "error at most -") || strings.Contains(b.String(), "±-") {
		t.Errorf("negative error bound:\n%s", b.String())
	}
}
