package profile

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

const (
	bootA = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
	bootB = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
)

// clocksOf gives stage s the clock (boot ids[s], hosts[s]).
func clocksOf(ids, hosts []string) []Clock {
	out := make([]Clock, len(ids))
	for s := range ids {
		out[s] = Clock{Host: hosts[s], BootID: ids[s]}
	}
	return out
}

func report(t *testing.T, info RunInfo, events [][]Event) (*Report, string) {
	t.Helper()
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	return r, b.String()
}

// earlyActivations is 4 stages on one clock whose activations seem to arrive
// 2 ms before they were sent (their senders descheduled after Send, every
// time) while gradients take 0.1 ms: on the messages alone that is a clock
// offset of -1.05 ms a link.
func earlyActivations(t *testing.T) play {
	return play{sched: build(t, "1f1b", 4, 8, 1), steps: 4, opt: ms, gap: ms, act: 1, grad: 1,
		cost: func(int, int, schedule.Kind) int64 { return 3 * ms },
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return 100_000
			}
			return -2 * ms
		}}
}

// TestAlignSharedClockNeverShifted: stages that recorded one boot id share a
// clock; their link is never shifted, whatever the messages say, its error is
// 0, and the report says why.
func TestAlignSharedClockNeverShifted(t *testing.T) {
	run := earlyActivations(t)
	events := run.events(t)
	if a, _ := Align(events, nil); !a.Shifted || a.Links[0].Offset != -1050*time.Microsecond {
		t.Fatalf("without clock records the messages must demand a shift of -1.05 ms a link: %+v", a)
	}

	clocks := clocksOf([]string{bootA, bootA, bootA, bootA}, []string{"gpu1", "gpu1", "gpu1", "gpu1"})
	a, out := Align(events, clocks)
	if a.Shifted || a.MaxOffset() != 0 || &out[0][0] != &events[0][0] {
		t.Errorf("one boot id shifted: %+v", a)
	}
	for _, l := range a.Links {
		if !l.SharedClock || l.Shifted || l.Offset != 0 || l.Uncertainty != 0 || l.Conflict ||
			l.Violation != 2*time.Millisecond || l.Estimate != -1050*time.Microsecond {
			t.Errorf("link %+v: want a shared clock, not shifted, error 0, the messages' evidence kept", l)
		}
	}
	if d, _ := a.MaxError(); d != 0 {
		t.Errorf("error bound %v on one clock, want 0", d)
	}
	info := runInfo(run.sched, run.steps)
	info.Clocks = clocks
	r, text := report(t, info, events)
	if r.Clock.Shifted {
		t.Error("report shifted")
	}
	want := "clocks: not shifted: stages 0-3 share one clock (boot id 1a2b3c4d…, host gpu1)\n"
	if !strings.Contains(text, want) || strings.Count(text, "clocks:") != 1 {
		t.Errorf("report lacks %q alone:\n%s", want, text)
	}

	// Containers on one kernel: one boot id under several host names.
	info.Clocks = clocksOf([]string{bootA, bootA, bootA, bootA}, []string{"c0", "c1", "c1", ""})
	if _, text = report(t, info, events); !strings.Contains(text, "clocks: not shifted: stages 0-3 share one clock (boot id 1a2b3c4d…, hosts c0, c1)\n") {
		t.Errorf("containers:\n%s", text)
	}
}

// TestAlignDifferentBootIDsShifted: two hosts of two stages each, the second
// 3.7 s ahead. The link between the hosts is shifted as the messages say; the
// links within a host are not, and add nothing to the error.
func TestAlignDifferentBootIDsShifted(t *testing.T) {
	s := build(t, "1f1b", 4, 8, 1)
	truth := []int64{0, 0, 3_700_000_000, 3_700_000_000}
	run := play{sched: s, steps: 5, opt: ms, gap: 5 * ms, act: 1 << 16, grad: 1 << 16, delay: jittered(200_000, 200_000, 100_000)}
	plain := run.events(t)
	run.clock = truth
	skewed := run.events(t)
	clocks := clocksOf([]string{bootA, bootA, bootB, bootB}, []string{"gpu1", "gpu1", "gpu2", "gpu2"})

	bare, _ := Align(skewed, nil)
	a, aligned := Align(skewed, clocks)
	if !a.Shifted || !reflect.DeepEqual(aligned, plain) {
		t.Fatalf("not shifted to the true clocks: %+v", a)
	}
	for st, want := range truth {
		if a.Offsets[st] != time.Duration(want) {
			t.Errorf("stage %d offset %v, want %v", st, a.Offsets[st], time.Duration(want))
		}
	}
	if l := a.Links[1]; l.SharedClock || !l.Shifted || l.Uncertainty != 200*time.Microsecond {
		t.Errorf("link between the hosts: %+v", l)
	}
	for _, i := range []int{0, 2} {
		if l := a.Links[i]; !l.SharedClock || l.Shifted || l.Uncertainty != 0 {
			t.Errorf("link within a host: %+v", l)
		}
	}
	// Without the records the links within a host are left alone too, but
	// each adds its whole range to the error.
	if !reflect.DeepEqual(bare.Offsets, a.Offsets) || bare.Errors[3] != 600*time.Microsecond || a.Errors[3] != 200*time.Microsecond {
		t.Errorf("errors %v with the records, %v without; offsets %v, %v", a.Errors, bare.Errors, a.Offsets, bare.Offsets)
	}

	info := runInfo(s, 5)
	info.Clocks = clocks
	_, text := report(t, info, skewed)
	for _, want := range []string{
		"clocks: shifted to stage 0's (largest offset 3700.000 ms, error at most 0.200 ms)\n" +
			"clocks: stages 0-1 share one clock (boot id 1a2b3c4d…, host gpu1); stages 2-3 share one clock (boot id 9f8e7d6c…, host gpu2)\n" +
			"clocks: stage 2 vs 1: +3700.000 ms ±0.200 ms (as logged, messages arrived up to 3699.800 ms early)\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks\n%s\n%s", want, text)
		}
	}

	// NTP-synchronised hosts: different boot ids, no offset to see.
	info.Clocks = clocks
	_, text = report(t, info, plain)
	if !strings.Contains(text, "clocks: not shifted: no message between stages not known to share a clock arrived more than 1.000 ms before it was sent\n"+
		"clocks: stages 0-1 share one clock (boot id 1a2b3c4d…, host gpu1); stages 2-3 share one clock (boot id 9f8e7d6c…, host gpu2)\n") {
		t.Errorf("synchronised hosts:\n%s", text)
	}
}

// TestAlignSharedClockAcrossTheChain: stages 0 and 2 on one host, 1 and 3 on
// another 3.7 s ahead, with the fastest gradient 50 us slower than the fastest
// activation, so that each link's estimate is 25 us off. Stage 2 takes stage
// 0's clock as it is, not two links' estimates, and stage 3 stage 1's.
func TestAlignSharedClockAcrossTheChain(t *testing.T) {
	s := build(t, "1f1b", 4, 8, 1)
	run := play{sched: s, steps: 5, opt: ms, gap: 5 * ms, act: 1, grad: 1, delay: jittered(200_000, 250_000, 100_000),
		clock: []int64{0, 3_700_000_000, 0, 3_700_000_000}}
	events := run.events(t)
	clocks := clocksOf([]string{bootA, bootB, bootA, bootB}, []string{"a", "b", "a", "b"})
	bare, _ := Align(events, nil)
	if bare.Offsets[2] == 0 {
		t.Fatalf("the chain of estimates puts stage 2 on stage 0's clock exactly: %v", bare.Offsets)
	}
	a, _ := Align(events, clocks)
	if a.Offsets[2] != 0 || a.Errors[2] != 0 || a.Offsets[3] != a.Offsets[1] || a.Errors[3] != a.Errors[1] {
		t.Errorf("offsets %v errors %v: want stage 2 on stage 0's clock and 3 on 1's", a.Offsets, a.Errors)
	}
	info := runInfo(s, 5)
	info.Clocks = clocks
	if _, text := report(t, info, events); !strings.Contains(text, "clocks: stages 0, 2 share one clock (boot id 1a2b3c4d…, host a); stages 1, 3 share one clock (boot id 9f8e7d6c…, host b)\n") {
		t.Errorf("report:\n%s", text)
	}
}

// TestAlignMissingClockRecords: logs without clock records (older runs, or
// copied without them) are aligned from the messages as before; a stage
// without one is judged by its messages alone, beside stages that have one.
func TestAlignMissingClockRecords(t *testing.T) {
	run := earlyActivations(t)
	events := run.events(t)
	info := runInfo(run.sched, run.steps)
	dir := writeRun(t, info, events)
	gotInfo, got, err := ReadRun(dir)
	if err != nil || gotInfo.Clocks != nil {
		t.Fatalf("clocks %+v, %v; want none", gotInfo.Clocks, err)
	}
	a, _ := Align(got, gotInfo.Clocks)
	if !a.Shifted || a.Links[0].SharedClock || a.Offsets[3] != -3150*time.Microsecond {
		t.Errorf("no records: %+v, want the messages' shifts", a)
	}
	_, text := report(t, gotInfo, got)
	if !strings.Contains(text, "clocks: shifted to stage 0's (largest offset 3.150 ms") || strings.Contains(text, "share") {
		t.Errorf("no records:\n%s", text)
	}

	// Stages 0-2 recorded one clock, stage 3 none.
	info.Clocks = []Clock{{Host: "gpu1", BootID: bootA}, {Host: "gpu1", BootID: bootA}, {Host: "gpu1", BootID: bootA}, {}}
	a, _ = Align(events, info.Clocks)
	if !a.Shifted || a.Offsets[2] != 0 || a.Offsets[3] != -1050*time.Microsecond || !a.Links[2].Shifted {
		t.Errorf("stage 3 without a record: %+v", a)
	}
	_, text = report(t, info, events)
	if !strings.Contains(text, "clocks: stages 0-2 share one clock (boot id 1a2b3c4d…, host gpu1); clock of stage 3 unknown\n") {
		t.Errorf("stage 3 without a record:\n%s", text)
	}
}

// TestProfileReadsClockRecords: ReadRun reads the records the stages write
// beside their event logs, in the documented format, into RunInfo.Clocks; a
// malformed one is an error naming it.
func TestProfileReadsClockRecords(t *testing.T) {
	info, events := gpipeRun()
	dir := writeRun(t, info, events)
	os.WriteFile(ClockFile(dir, 0), []byte(`{"host":"gpu1","boot_id":"`+bootA+`"}`+"\n"), 0o644)
	os.WriteFile(ClockFile(dir, 1), []byte(`{"host":"gpu2","boot_id":"`+bootA+`","earlier":[{"host":"gpu2","boot_id":"`+bootB+`"}]}`), 0o644)
	got, _, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Clock{{Host: "gpu1", BootID: bootA}, {Host: "gpu2", BootID: bootA, Earlier: []Clock{{Host: "gpu2", BootID: bootB}}}}
	if !reflect.DeepEqual(got.Clocks, want) {
		t.Errorf("clocks %+v, want %+v", got.Clocks, want)
	}
	os.WriteFile(ClockFile(dir, 1), []byte(`{"host":`), 0o644)
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), ClockFile(dir, 1)) {
		t.Errorf("malformed record: err = %v", err)
	}
}

// TestAlignResumedClocks: a resumed stage's log holds the events of every
// process since the run began; two stages share a clock only when they did in
// every one of them, and not when one process recorded none.
func TestAlignResumedClocks(t *testing.T) {
	now := Clock{Host: "gpu1", BootID: bootA, Earlier: []Clock{{Host: "gpu1", BootID: bootB}}}
	same := now
	otherBefore := Clock{Host: "gpu1", BootID: bootA, Earlier: []Clock{{Host: "gpu2", BootID: bootA}}}
	unknownBefore := Clock{Host: "gpu1", BootID: bootA, Earlier: []Clock{{}}}
	fresh := Clock{Host: "gpu1", BootID: bootA}
	for _, tc := range []struct {
		a, b  Clock
		share bool
	}{
		{now, same, true},
		{now, otherBefore, false},
		{unknownBefore, unknownBefore, false},
		{now, fresh, false},
		{fresh, fresh, true},
		{Clock{Host: "mac"}, Clock{Host: "mac"}, false},
	} {
		if got := tc.a.Shares(&tc.b); got != tc.share {
			t.Errorf("%+v shares %+v: %v, want %v", tc.a, tc.b, got, tc.share)
		}
	}
	groups := clockGroups([]Clock{now, same})
	if len(groups) != 1 || groups[0].describe([]Clock{now, same}) != "stages 0-1 share one clock (boot id 1a2b3c4d…, host gpu1; shared one before the resume too)" {
		t.Errorf("groups %+v", groups)
	}
}
