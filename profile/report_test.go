package profile

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// replay turns one simulated step per step into events, step after step with
// gap ms between them: the run the simulator predicts, as stages would log it.
func replay(t *testing.T, s *schedule.Schedule, c schedule.Costs, steps int, gap float64) [][]Event {
	t.Helper()
	tl, err := schedule.Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[schedule.Kind]string{schedule.Forward: Forward, schedule.Backward: Backward, schedule.Input: Input, schedule.Weight: Weight}
	ns := func(x float64) int64 { return int64(math.Round(x * 1e6)) }
	out := make([][]Event, s.Stages)
	for step := range steps {
		base := wall0 + int64(step)*ns(tl.Makespan+gap)
		for st, spans := range tl.Spans {
			// A simulated stage idles for its hand-off after an action, then
			// waiting for the next one's input, as a runtime records it.
			free := 0.0
			for i, sp := range spans {
				a := sp.Action
				if i > 0 && c.Gap != nil {
					free += c.Gap[st]
				}
				out[st] = append(out[st], Event{Stage: st, Step: step, Kind: kinds[a.Kind], MB: a.MicroBatch, Chunk: a.Chunk,
					StartNS: base + ns(sp.Start), EndNS: base + ns(sp.End), WaitNS: max(0, ns(sp.Start)-ns(free))})
				free = sp.End
			}
		}
	}
	return out
}

func TestMeasuredBubbleMatchesSimulator(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p, m, v int
	}{{"gpipe", 4, 8, 1}, {"1f1b", 4, 8, 1}, {"1f1b", 3, 2, 1}, {"interleaved", 4, 8, 2}, {"zb-h1", 4, 8, 1}} {
		s := build(t, tc.name, tc.p, tc.m, tc.v)
		info := runInfo(s, 4)
		check := func(how string, events [][]Event) {
			r, err := Analyse(info, events, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Predicted == nil {
				t.Fatalf("%s %s: no prediction: %v", tc.name, how, r.PredictErr)
			}
			for i, sr := range r.Stages {
				if !near(sr.Bubble, sr.PredictedBubble) {
					t.Errorf("%s %s stage %d: measured bubble %v, predicted %v", tc.name, how, i, sr.Bubble, sr.PredictedBubble)
				}
			}
			if !near(r.MeanBubble, r.PredictedBubble) {
				t.Errorf("%s %s: mean bubble %v, predicted %v", tc.name, how, r.MeanBubble, r.PredictedBubble)
			}
			// Uniform costs F = B/2 = I = W: the closed form holds too.
			if tc.name != "zb-h1" || tc.m >= tc.p {
				if !near(r.PredictedBubble, info.TheoreticalBubble) {
					t.Errorf("%s %s: predicted %v, theory %v", tc.name, how, r.PredictedBubble, info.TheoreticalBubble)
				}
			}
		}
		check("replayed", replay(t, s, schedule.UniformCosts(tc.p, 1, 2, 0), 4, 3))
		// The playing runtime model gives the same, with bytes, waits and optimizer steps.
		cost := func(_, _ int, k schedule.Kind) int64 {
			d := ms
			if k == schedule.Backward {
				d = 2 * ms
			}
			return d / int64(tc.v)
		}
		check("played", play{sched: s, steps: 4, cost: cost, opt: ms / 2, gap: 3 * ms, act: 10, grad: 10}.events(t))
	}
}

// stragglerRun is 1f1b on 4 stages with 8 micro-batches for 12 steps, stage
// 1 the slowest (F 1.2 ms, B 2.4 ms, others 1 and 2 ms). Step 7 (index 6 in
// the logs) runs 3x slower throughout; in step 10 stage 3 is 1.5x slower,
// which makes it the slowest stage but the step no straggler. Stage 0's
// forwards each block 0.1 ms in Send; stage 2's backwards 0.05 ms.
func stragglerRun(t *testing.T) (RunInfo, [][]Event, play) {
	s := build(t, "1f1b", 4, 8, 1)
	c := play{sched: s, steps: 12, opt: 300_000, gap: 2 * ms, act: 1 << 18, grad: 1 << 18,
		cost: func(step, stage int, k schedule.Kind) int64 {
			d := ms
			if k == schedule.Backward {
				d = 2 * ms
			}
			if stage == 1 {
				d = d * 6 / 5
			}
			if step == 6 {
				d *= 3
			}
			if step == 9 && stage == 3 {
				d = d * 3 / 2
			}
			return d
		},
		sendNS: func(_, stage int, k schedule.Kind) int64 {
			switch {
			case stage == 0 && k == schedule.Forward:
				return 100_000
			case stage == 2 && k == schedule.Backward:
				return 50_000
			}
			return 0
		}}
	return runInfo(s, 12), c.events(t), c
}

func TestStepsAndStragglers(t *testing.T) {
	info, events, c := stragglerRun(t)
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A steady step is the simulated one with the base costs.
	base := schedule.Costs{F: []float64{1, 1.2, 1, 1}, B: []float64{2, 2.4, 2, 2}}
	tl, err := schedule.Simulate(c.sched, base)
	if err != nil {
		t.Fatal(err)
	}
	steady := time.Duration(math.Round(tl.Makespan * 1e6))
	var simBubble float64
	for _, b := range tl.Bubble {
		simBubble += b / 4
	}
	if len(r.Steps) != 11 || r.MedianStep != steady || r.StepMAD != 0 {
		t.Fatalf("%d steps, median %v MAD %v, want 11, %v, 0", len(r.Steps), r.MedianStep, r.StepMAD, steady)
	}
	for _, st := range r.Steps {
		switch st.Step { // as the training log numbers them: from 1
		case 7:
			if st.Window != 3*steady || !st.Straggler || st.Slowest != 1 || st.SlowestBusy != 3*8*3600*time.Microsecond {
				t.Errorf("step 7: %+v, want a straggler 3x the median, stage 1 slowest", st)
			}
		case 10:
			if st.Straggler || st.Slowest != 3 || st.SlowestBusy != 8*4500*time.Microsecond || st.Window <= steady {
				t.Errorf("step 10: %+v, want stage 3 slowest, no straggler", st)
			}
		default:
			if st.Window != steady || st.Straggler || st.Slowest != 1 || !near(st.Bubble, simBubble) {
				t.Errorf("step %d: %+v, want window %v, bubble %v, stage 1 slowest", st.Step, st, steady, simBubble)
			}
		}
	}
	if got := r.Stragglers(); len(got) != 1 || got[0].Step != 7 || r.Steps[0].Step != 2 || r.Steps[10].Step != 12 {
		t.Errorf("stragglers %+v, steps %d to %d; want step 7 of steps 2 to 12", got, r.Steps[0].Step, r.Steps[10].Step)
	}

	// Blocked sends: 8 forwards a step on stage 0, 8 backwards on stage 2,
	// over 11 steps.
	want := []time.Duration{11 * 8 * 100 * time.Microsecond, 0, 11 * 8 * 50 * time.Microsecond, 0}
	for i, w := range want {
		if got := r.Stages[i].SendBlocked; got != w {
			t.Errorf("stage %d blocked in Send %v, want %v", i, got, w)
		}
	}

	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	line := "  step 7: window " + fmtMS(3*steady) + " ms, +" + fmtMS(2*steady) + " ms (3.00x median), slowest stage 1 (busy 86.4 ms)\n"
	if !strings.Contains(b.String(), "median): 1\n") || !strings.Contains(b.String(), line) {
		t.Errorf("stragglers not listed as\n%s\nin\n%s", line, b.String())
	}
	if strings.Contains(b.String(), "start ms") {
		t.Errorf("per-step table without Options.Steps:\n%s", b.String())
	}
}

func TestLinks(t *testing.T) {
	// 3 stages, 4 micro-batches; activations take 0.3 ms, gradients 0.5 ms.
	s := build(t, "1f1b", 3, 4, 1)
	c := play{sched: s, steps: 3, opt: ms, gap: ms, act: 1000, grad: 3000,
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return 500_000
			}
			return 300_000
		}}
	r, err := Analyse(runInfo(s, 3), c.events(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Clock.Shifted || r.Clock.Offsets[2] != 0 || r.Clock.Links[1].Estimate != -100*time.Microsecond {
		t.Errorf("clock %+v: want estimates of half the asymmetry, not applied", r.Clock)
	}
	if len(r.Links) != 2 {
		t.Fatalf("%d links, want 2", len(r.Links))
	}
	for i, l := range r.Links {
		// 2 steps analysed, 4 messages each way per step.
		if l.From != i || l.To != i+1 || l.Ring ||
			l.Down.Messages != 8 || l.Down.Bytes != 8000 || l.Down.Timed == 0 || l.Down.MeanDelay != 300*time.Microsecond ||
			l.Up.Messages != 8 || l.Up.Bytes != 24000 || l.Up.Timed == 0 || l.Up.MeanDelay != 500*time.Microsecond {
			t.Errorf("link %d: %+v", i, l)
		}
	}
}

// TestLinksDelayNeverNegative: a tensor taken by its receiver before the
// sender's action ended (delivered while Send yielded) adds no delay, so the
// mean the simulator is given stays a valid transfer time.
func TestLinksDelayNeverNegative(t *testing.T) {
	s := build(t, "1f1b", 2, 4, 1)
	c := play{sched: s, steps: 3, opt: ms, gap: ms, act: 1000, grad: 3000,
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return 400_000
			}
			return -200_000
		}}
	r, err := Analyse(runInfo(s, 3), c.events(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	l := r.Links[0]
	if l.Down.Timed == 0 || l.Down.MeanDelay != 0 || l.Up.Timed == 0 || l.Up.MeanDelay <= 0 {
		t.Errorf("link %+v: want activations at zero delay, gradients positive", l)
	}
	if d, ok := r.MeanTransfer(); !ok || d < 0 {
		t.Errorf("mean transfer %v (ok %v)", d, ok)
	}
}

func TestLinksInterleaved(t *testing.T) {
	// Model stages 0..3 on stages 0, 1, 0, 1: link 0 -> 1 carries 0->1 and
	// 2->3, the ring 1 -> 0 carries 1->2.
	s := build(t, "interleaved", 2, 4, 2)
	c := play{sched: s, steps: 2, opt: ms, act: 10, grad: 20, delay: func(int, bool, int, int, int) int64 { return 100_000 }}
	r, err := Analyse(runInfo(s, 2), c.events(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []LinkReport{
		{From: 0, To: 1, Down: LinkTraffic{Messages: 16, Bytes: 160}, Up: LinkTraffic{Messages: 16, Bytes: 320}},
		{From: 1, To: 0, Ring: true, Down: LinkTraffic{Messages: 8, Bytes: 80}, Up: LinkTraffic{Messages: 8, Bytes: 160}},
	}
	if len(r.Links) != len(want) {
		t.Fatalf("links %+v", r.Links)
	}
	for i, l := range r.Links {
		if l.Down.Timed == 0 || l.Up.Timed == 0 || l.Down.MeanDelay != 100*time.Microsecond || l.Up.MeanDelay != 100*time.Microsecond {
			t.Errorf("link %d delays %+v", i, l)
		}
		l.Down.Timed, l.Up.Timed, l.Down.MeanDelay, l.Up.MeanDelay = 0, 0, 0, 0
		if l != want[i] {
			t.Errorf("link %d: %+v, want %+v", i, l, want[i])
		}
	}
}

func TestPredictCustomSchedule(t *testing.T) {
	r, info, events := analyseCustom(t, schedule.UniformCosts(3, 1, 2, 0))
	if r.Predicted == nil || !near(r.PredictedBubble, 2.0/6) || !near(r.MeanBubble, r.PredictedBubble) {
		t.Errorf("predicted %v (%v), measured %v, want 1/3", r.PredictedBubble, r.PredictErr, r.MeanBubble)
	}

	info.ScheduleCSV = ""
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.Write(&b)
	if r.Predicted != nil || r.PredictErr == nil || !strings.Contains(b.String(), "vs simulated - vs") ||
		!strings.Contains(b.String(), `simulation: custom schedule without "schedule_csv"`) {
		t.Errorf("custom schedule without csv: %v\n%s", r.PredictErr, b.String())
	}
}

// goldenRun is stragglerRun on four hosts: stage 1's clock 2.5 s behind,
// stage 3's 40 ms ahead, with transfers of 0.2-0.35 ms.
func goldenRun(t *testing.T) (RunInfo, [][]Event) {
	info, _, c := stragglerRun(t)
	c.clock = []int64{0, -2_500_000_000, 0, 40_000_000}
	c.delay = jittered(200_000, 200_000, 150_000)
	return info, c.events(t)
}

// TestHandOffIsPredicted: a run whose stages spend a hand-off between
// actions (idle, but not waiting for an input) has that hand-off measured
// from its events, and the prediction, which charges it, equals the
// measured bubble; without it the prediction would be below.
func TestHandOffIsPredicted(t *testing.T) {
	s := build(t, "zb-v", 2, 4, 2)
	c := schedule.UniformCosts(2, 1, 2, 0)
	c.Gap = []float64{0.25, 0.5}
	events := replay(t, s, c, 3, 5)
	means := MeanCosts(events, 0)
	for st, want := range []time.Duration{250 * time.Microsecond, 500 * time.Microsecond} {
		if d := means[st].Gap - want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("stage %d: hand-off %v, want %v", st, means[st].Gap, want)
		}
	}
	r, err := Analyse(runInfo(s, 3), events, 1)
	if err != nil || r.Predicted == nil {
		t.Fatalf("%v %v", err, r.PredictErr)
	}
	for st, sr := range r.Stages {
		if math.Abs(sr.Bubble-sr.PredictedBubble) > 1e-4 {
			t.Errorf("stage %d: measured bubble %v, predicted %v", st, sr.Bubble, sr.PredictedBubble)
		}
	}
	c.Gap = nil
	bare, err := schedule.Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	if bare.Bubble[1] >= r.Stages[1].PredictedBubble {
		t.Errorf("without hand-offs the simulator predicts %v, with %v", bare.Bubble[1], r.Stages[1].PredictedBubble)
	}
}

// TestSpreadIsPredicted: a run whose actions vary about their means shows
// more bubble than its schedule played at those means, as each hand-off
// waits for the slower of two actions; the prediction, which replays the
// schedule with each step's own action times, follows the measured bubble,
// and the steady one, at the means, stays below it and is reported beside.
func TestSpreadIsPredicted(t *testing.T) {
	for _, name := range []string{"1f1b", "zb-h1"} {
		s := build(t, name, 2, 8, 1)
		rng := rand.New(rand.NewPCG(11, 13))
		factors := []float64{0.5, 1, 1.5}
		events := play{sched: s, steps: 80, opt: ms, gap: ms, act: 10, grad: 10,
			spread: func(int, int, int, schedule.Kind) float64 { return factors[rng.IntN(len(factors))] },
		}.events(t)
		r, err := Analyse(runInfo(s, 8), events, 1)
		if err != nil || r.Predicted == nil {
			t.Fatalf("%s: %v %v", name, err, r.PredictErr)
		}
		if d := r.MeanBubble - r.PredictedBubble; math.Abs(d) > 0.01 {
			t.Errorf("%s: measured bubble %.3f, predicted %.3f", name, r.MeanBubble, r.PredictedBubble)
		}
		if d := r.MeanBubble - r.SteadyBubble; d < 0.03 {
			t.Errorf("%s: measured bubble %.3f, at mean costs %.3f: want the spread to show", name, r.MeanBubble, r.SteadyBubble)
		}
		var b strings.Builder
		if err := r.Write(&b, Options{}); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("(%.1f%% with every action at its mean)", 100*r.SteadyBubble); !strings.Contains(b.String(), want) {
			t.Errorf("%s: report lacks %q:\n%s", name, want, b.String())
		}
	}
}

func TestWriteGolden(t *testing.T) {
	info, events := goldenRun(t)
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Write(&b, Options{Steps: true}); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for i, l := range strings.Split(got, "\n") {
		if len(l) > 100 {
			t.Errorf("line %d is %d columns: %q", i+1, len(l), l)
		}
	}
	path := filepath.Join("testdata", "report.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("report differs from %s (go test -update rewrites it):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestTheoryCustomSchedule: a custom schedule has no closed form, so its
// theory is its order simulated with the closed forms' unit costs (the same
// figure a named schedule's closed form gives: 1f1b's (p-1)/(m+p-1) here),
// said to be simulated; without its CSV there is no theory, and the report
// says so rather than printing 0%.
func TestTheoryCustomSchedule(t *testing.T) {
	r, info, events := analyseCustom(t, schedule.Costs{F: []float64{1, 3, 1}, B: []float64{2, 6, 2}})
	if !r.TheorySimulated || r.TheoryErr != nil || !near(r.TheoryMean, 2.0/6) || len(r.Theory) != 3 {
		t.Fatalf("theory %v (mean %v, simulated %v, %v), want 1/3 on each stage", r.Theory, r.TheoryMean, r.TheorySimulated, r.TheoryErr)
	}
	for i, st := range r.Stages {
		if !near(st.TheoryBubble, 2.0/6) {
			t.Errorf("stage %d theory %v, want 1/3", i, st.TheoryBubble)
		}
	}
	var b strings.Builder
	r.Write(&b)
	for _, want := range []string{"vs theory 33.3%\n", "theory: a custom schedule has no closed form: its order simulated with equal stages, free transfers\n",
		"    1       7.7    7.7      33.3"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}

	// The same schedule by name: the closed form, not a simulation.
	named, err := Analyse(runInfo(build(t, "1f1b", 3, 4, 1), 3), events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if named.TheorySimulated || !near(named.TheoryMean, r.TheoryMean) {
		t.Errorf("1f1b theory %v (simulated %v), want the closed form %v", named.TheoryMean, named.TheorySimulated, r.TheoryMean)
	}

	info.ScheduleCSV = ""
	if r, err = Analyse(info, events, 1); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	r.Write(&b)
	if r.Theory != nil || r.TheoryErr == nil || !strings.Contains(b.String(), "vs theory -\n") ||
		!strings.Contains(b.String(), `theory: custom schedule without "schedule_csv" in run.json`) || strings.Contains(b.String(), "0.0%") {
		t.Errorf("custom schedule without csv: %v\n%s", r.TheoryErr, b.String())
	}
}

// analyseCustom replays 3 steps of a 3-stage, 4-micro-batch 1F1B with costs
// and analyses them as a run of schedule: custom, whose run.json holds it.
func analyseCustom(t *testing.T, costs schedule.Costs) (*Report, RunInfo, [][]Event) {
	t.Helper()
	s := build(t, "1f1b", 3, 4, 1)
	events := replay(t, s, costs, 3, 1)
	var csv strings.Builder
	if err := s.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	info := RunInfo{Schedule: "custom", Stages: 3, MicroBatches: 4, Steps: 3, ScheduleCSV: csv.String()}
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	return r, info, events
}

// TestMemoryBesidePrediction: the profile reports each stage's peak
// activation memory and live heap from the events, beside run.json's
// prediction, and leaves the table out for logs that recorded none.
func TestMemoryBesidePrediction(t *testing.T) {
	s := build(t, "1f1b", 2, 4, 1)
	info := runInfo(s, 3)
	events := play{sched: s, steps: 3}.events(t)
	_, out := report(t, info, events)
	if strings.Contains(out, "activations MiB") {
		t.Fatalf("a table of memory the logs never recorded:\n%s", out)
	}
	for st := range events {
		for i := range events[st] {
			events[st][i].StashBytes = int64(st+1) << 20 * int64(1+i%2)
			events[st][i].HeapBytes = 100 << 20
		}
	}
	info.PredictedStashBytes = []int64{4 << 20, 2 << 20}
	r, out := report(t, info, events)
	if r.Stages[0].PeakStashBytes != 2<<20 || r.Stages[1].PeakStashBytes != 4<<20 || r.Stages[1].PeakHeapBytes != 100<<20 {
		t.Errorf("peaks %+v", r.Stages)
	}
	for _, want := range []string{"activations MiB  predicted MiB  of predicted  heap MiB", "0  2.00  4.00  50%  100.00", "1  4.00  2.00  200%  100.00"} {
		if !strings.Contains(strings.Join(strings.Fields(out), "  "), strings.Join(strings.Fields(want), "  ")) {
			t.Errorf("profile lacks %q:\n%s", want, out)
		}
	}
}

// TestChunkCostsTable: a run of several chunks a stage gets a table of each
// chunk's mean passes per micro-batch (a chunk that split every backward
// shows no B); a run of one chunk a stage gets none.
func TestChunkCostsTable(t *testing.T) {
	s := build(t, "1f1b", 2, 4, 1)
	_, out := report(t, runInfo(s, 3), play{sched: s, steps: 3}.events(t))
	if strings.Contains(out, "chunk") {
		t.Fatalf("a chunk table for a run of one chunk a stage:\n%s", out)
	}

	s = build(t, "interleaved-zb", 2, 4, 2)
	events := play{sched: s, steps: 3}.events(t)
	// Chunk 1's passes take half as long as chunk 0's (F, I, W 1 ms each).
	for st := range events {
		for i, e := range events[st] {
			if e.Chunk == 1 && e.Kind != Optimizer {
				events[st][i].EndNS = e.StartNS + (e.EndNS-e.StartNS)/2
			}
		}
	}
	r, out := report(t, runInfo(s, 3), events)
	if len(r.Stages[1].Chunks) != 2 || r.Stages[1].Chunks[1].F != 500*time.Microsecond {
		t.Errorf("stage 1's chunks %+v, want chunk 1's F 0.5 ms", r.Stages[1].Chunks)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"stage chunk F ms/mb B ms/mb I ms/mb W ms/mb",
		"0 0 1.000 - 1.000 1.000", "0 1 0.500 - 0.500 0.500", "1 0 1.000 - 1.000 1.000", "1 1 0.500 - 0.500 0.500"} {
		if !strings.Contains(flat, want) {
			t.Errorf("profile lacks %q:\n%s", want, out)
		}
	}
}
