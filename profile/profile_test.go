package profile

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

const ms = int64(time.Millisecond)

// ev is an event timed in whole milliseconds.
func ev(stage, step int, kind string, mb int, start, end, wait int64, sent int64, stashed int) Event {
	return Event{Stage: stage, Step: step, Kind: kind, MB: mb, StartNS: start * ms, EndNS: end * ms,
		WaitNS: wait * ms, BytesSent: sent, Stashed: stashed}
}

// gpipeRun is 2 stages, 2 micro-batches, every F and B 1 ms.
//
// Step 0 is a slow warm-up: stage 1's first input arrives 4 ms late.
//
//	stage 0: F0 0-1  F1 1-2                  B0 9-10 B1 10-11 OPT 11-12
//	stage 1:               F0 5-6 F1 6-7 B0 7-8 B1 8-9  OPT 9-10
//
// window 11 ms, busy 4 ms per stage.
//
// Step 1 is the steady state, starting at 100 ms:
//
//	stage 0: F0 100-101 F1 101-102           B0 104-105 B1 105-106 OPT 106-107
//	stage 1:            F0 101-102 F1 102-103 B0 103-104 B1 104-105 OPT 105-106
//
// window 6 ms, busy 4 ms, idle 2 ms: bubble 1/3 = (p-1)/(m+p-1).
func gpipeRun() (RunInfo, [][]Event) {
	info := RunInfo{Schedule: "gpipe", Stages: 2, MicroBatches: 2, Steps: 2, TheoreticalBubble: 1.0 / 3}
	const act = 1 << 20 // one micro-batch's activations or gradients: 1 MiB
	return info, [][]Event{
		{
			ev(0, 0, "F", 0, 0, 1, 0, act, 1),
			ev(0, 0, "F", 1, 1, 2, 0, act, 2),
			ev(0, 0, "B", 0, 9, 10, 7, 0, 1),
			ev(0, 0, "B", 1, 10, 11, 0, 0, 0),
			ev(0, 0, "OPT", 0, 11, 12, 0, 0, 0),
			ev(0, 1, "F", 0, 100, 101, 0, act, 1),
			ev(0, 1, "F", 1, 101, 102, 0, act, 2),
			ev(0, 1, "B", 0, 104, 105, 2, 0, 1),
			ev(0, 1, "B", 1, 105, 106, 0, 0, 0),
			ev(0, 1, "OPT", 0, 106, 107, 0, 0, 0),
		},
		{
			ev(1, 0, "F", 0, 5, 6, 5, 0, 1),
			ev(1, 0, "F", 1, 6, 7, 0, 0, 2),
			ev(1, 0, "B", 0, 7, 8, 0, act, 1),
			ev(1, 0, "B", 1, 8, 9, 0, act, 0),
			ev(1, 0, "OPT", 0, 9, 10, 0, 0, 0),
			ev(1, 1, "F", 0, 101, 102, 1, 0, 1),
			ev(1, 1, "F", 1, 102, 103, 0, 0, 2),
			ev(1, 1, "B", 0, 103, 104, 0, act, 1),
			ev(1, 1, "B", 1, 104, 105, 0, act, 0),
			ev(1, 1, "OPT", 0, 105, 106, 0, 0, 0),
		},
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestAnalyseSkipsWarmup(t *testing.T) {
	info, events := gpipeRun()
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.StepsAnalysed != 1 || r.Window != 6*time.Millisecond {
		t.Fatalf("steps %d window %v, want 1 and 6ms", r.StepsAnalysed, r.Window)
	}
	want := []StageReport{
		{Stage: 0, Steps: 1, Forward: 2 * time.Millisecond, Backward: 2 * time.Millisecond, Optimizer: time.Millisecond,
			Wait: 2 * time.Millisecond, Busy: 4 * time.Millisecond, Idle: 2 * time.Millisecond, Bubble: 1.0 / 3,
			PeakStashed: 2, BytesSent: 2 << 20},
		{Stage: 1, Steps: 1, Forward: 2 * time.Millisecond, Backward: 2 * time.Millisecond, Optimizer: time.Millisecond,
			Wait: time.Millisecond, Busy: 4 * time.Millisecond, Idle: 2 * time.Millisecond, Bubble: 1.0 / 3,
			PeakStashed: 2, BytesSent: 2 << 20},
	}
	for i := range want {
		// The simulated gpipe step with these costs has the same bubble;
		// 2 MiB were sent in the 6 ms window.
		want[i].PredictedBubble, want[i].Throughput = 1.0/3, float64(2<<20)/0.006
		got := r.Stages[i]
		if !near(got.Bubble, want[i].Bubble) || !near(got.PredictedBubble, want[i].PredictedBubble) ||
			math.Abs(got.Throughput-want[i].Throughput) > 1e-6 {
			t.Errorf("stage %d bubble %v predicted %v throughput %v, want %v %v %v", i, got.Bubble, got.PredictedBubble,
				got.Throughput, want[i].Bubble, want[i].PredictedBubble, want[i].Throughput)
		}
		if !near(got.TheoryBubble, 1.0/3) {
			t.Errorf("stage %d theory %v, want 1/3", i, got.TheoryBubble)
		}
		if !near(got.SteadyBubble, 1.0/3) {
			t.Errorf("stage %d at mean costs %v, want 1/3", i, got.SteadyBubble)
		}
		got.Bubble, got.PredictedBubble, got.SteadyBubble, got.Throughput, got.TheoryBubble = want[i].Bubble, want[i].PredictedBubble, 0, want[i].Throughput, 0
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("stage %d:\n got %+v\nwant %+v", i, got, want[i])
		}
	}
	if !near(r.MeanBubble, 1.0/3) || !near(r.MeanBubble, info.TheoreticalBubble) {
		t.Errorf("mean bubble %v, want 1/3", r.MeanBubble)
	}
	if r.Bottleneck != 0 { // a tie goes to the lowest stage
		t.Errorf("bottleneck %d, want 0", r.Bottleneck)
	}
}

func TestAnalyseAllSteps(t *testing.T) {
	info, events := gpipeRun()
	// skip 0 analyses both steps.
	for _, skip := range []int{0} {
		r, err := Analyse(info, events, skip)
		if err != nil {
			t.Fatal(err)
		}
		// Window 11+6 = 17 ms, busy 8 ms, idle 9 ms per stage.
		if r.StepsAnalysed != 2 || r.Window != 17*time.Millisecond {
			t.Fatalf("skip %d: steps %d window %v, want 2 and 17ms", skip, r.StepsAnalysed, r.Window)
		}
		for _, s := range r.Stages {
			if s.Steps != 2 || s.Busy != 8*time.Millisecond || s.Idle != 9*time.Millisecond || !near(s.Bubble, 9.0/17) {
				t.Errorf("skip %d stage %d: %+v", skip, s.Stage, s)
			}
		}
		if w := r.Stages[0].Wait; w != 9*time.Millisecond {
			t.Errorf("stage 0 wait %v, want 9ms", w)
		}
		if !near(r.MeanBubble, 9.0/17) {
			t.Errorf("mean bubble %v, want 9/17", r.MeanBubble)
		}
	}
}

func TestAnalyseBottleneck(t *testing.T) {
	// Stage 1's backward takes 2 ms:
	//	stage 0: F0 0-1 F1 1-2           B0 5-6     B1 7-8
	//	stage 1:        F0 1-2 F1 2-3 B0 3-5 B1 5-7
	// window 8; stage 0 busy 4 (bubble 1/2), stage 1 busy 6 (bubble 1/4).
	info := RunInfo{Schedule: "gpipe", Stages: 2, MicroBatches: 2, Steps: 1, TheoreticalBubble: 1.0 / 3}
	events := [][]Event{
		{ev(0, 0, "F", 0, 0, 1, 0, 0, 1), ev(0, 0, "F", 1, 1, 2, 0, 0, 2), ev(0, 0, "B", 0, 5, 6, 3, 0, 1), ev(0, 0, "B", 1, 7, 8, 1, 0, 0)},
		{ev(1, 0, "F", 0, 1, 2, 1, 0, 1), ev(1, 0, "F", 1, 2, 3, 0, 0, 2), ev(1, 0, "B", 0, 3, 5, 0, 0, 1), ev(1, 0, "B", 1, 5, 7, 0, 0, 0)},
	}
	r, err := Analyse(info, events, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Window != 8*time.Millisecond || !near(r.Stages[0].Bubble, 0.5) || !near(r.Stages[1].Bubble, 0.25) {
		t.Errorf("window %v bubbles %v %v, want 8ms 0.5 0.25", r.Window, r.Stages[0].Bubble, r.Stages[1].Bubble)
	}
	if !near(r.MeanBubble, 0.375) || r.Bottleneck != 1 {
		t.Errorf("mean %v bottleneck %d, want 0.375 and 1", r.MeanBubble, r.Bottleneck)
	}
}

// TestAnalyseSkipBeyondRun: skipping every step the logs hold, or more, or a
// negative number, is an error naming the steps there are, not a report of
// all of them.
func TestAnalyseSkipBeyondRun(t *testing.T) {
	info, events := gpipeRun()
	for _, skip := range []int{2, 5, 100, -1} {
		r, err := Analyse(info, events, skip)
		if err == nil || !strings.Contains(err.Error(), "the logs hold 2 (steps 1 to 2)") {
			t.Errorf("skip %d: report %v, error %v", skip, r != nil, err)
		}
	}
}

func TestAnalyseErrors(t *testing.T) {
	info, events := gpipeRun()
	if _, err := Analyse(info, events[:1], 0); err == nil {
		t.Error("stage count mismatch: no error")
	}
	if _, err := Analyse(RunInfo{}, [][]Event{nil, nil}, 0); err == nil {
		t.Error("no events: no error")
	}
}

func TestWrite(t *testing.T) {
	info, events := gpipeRun()
	// The stages' reads of their data (inputs on stage 0, targets on stage
	// 1): the skipped first step's do not count.
	events[0][0].DataNS, events[0][0].DataWaitNS = 9e6, 9e6
	events[0][5].DataNS = 0.7e6
	events[0][6].DataNS, events[0][6].DataWaitNS = 0.5e6, 0.3e6
	events[1][5].DataNS, events[1][5].DataWaitNS = 0.1e6, 0.1e6
	events[1][6].DataNS, events[1][6].DataWaitNS = 0.1e6, 0.1e6
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	const want = "" +
		"stage  F ms  B ms  W ms  opt ms  wait ms  send wait ms  busy ms  idle ms\n" +
		"    0   2.0   2.0   0.0     1.0      2.0           0.0      4.0      2.0\n" +
		"    1   2.0   2.0   0.0     1.0      1.0           0.0      4.0      2.0\n" +
		"stage  bubble %  sim %  theory %  data ms  peak stash  MiB sent  MiB/s of window  clock offset ms\n" +
		"    0      33.3   33.3      33.3      1.2           2      2.00            333.3           +0.000\n" +
		"    1      33.3   33.3      33.3      0.2           2      2.00            333.3           +0.000\n" +
		"  link  act MiB  msgs  delay ms  grad MiB  msgs  delay ms\n" +
		"0 -> 1     2.00     2     0.000      2.00     2     0.000\n" +
		"mean bubble 33.3% vs simulated 33.3% vs theory 33.3%\n" +
		"(schedule gpipe, 2 stages, 2 micro-batches, 1 step analysed (step 2), window 6.0 ms)\n" +
		"data: stage 0 read for 1.2 ms, its forwards waited 0.3 ms of it; stage 1 read for 0.2 ms, its forwards waited 0.2 ms of it\n" +
		"clocks: not shifted: no message arrived more than 1.000 ms before it was sent, as on one clock\n" +
		"steps: median window 6.0 ms, MAD 0.0 ms\n" +
		"stragglers (window > median + 3 MAD and >= 1.5x median): none\n" +
		"bottleneck: stage 0 (busy 4.0 ms)\n"
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// writeRun writes a run directory holding info and events.
func writeRun(t *testing.T, info RunInfo, events [][]Event) string {
	t.Helper()
	dir := t.TempDir()
	b, _ := json.Marshal(info)
	if err := os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	for i, stage := range events {
		var lines []byte
		for _, e := range stage {
			l, _ := json.Marshal(e)
			lines = append(append(lines, l...), '\n')
		}
		if err := os.WriteFile(EventsFile(dir, i), lines, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadRun(t *testing.T) {
	info, events := gpipeRun()
	dir := writeRun(t, info, events)
	gotInfo, gotEvents, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotInfo, info) || !reflect.DeepEqual(gotEvents, events) {
		t.Errorf("round trip differs:\n%+v\n%+v", gotInfo, gotEvents)
	}
}

func TestReadRunFormat(t *testing.T) {
	// The documented file formats, verbatim, with a blank line.
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	os.WriteFile(filepath.Join(dir, "run.json"),
		[]byte(`{"schedule":"1f1b","stages":1,"micro_batches":8,"steps":200,"theoretical_bubble":0.2727}`), 0o644)
	os.WriteFile(EventsFile(dir, 0), []byte("\n"+
		`{"stage":0,"step":0,"kind":"F","mb":2,"start_ns":1700000000000,"end_ns":1700000050000,"wait_ns":1200,"bytes_sent":65536,"stashed":3}`+"\n"+
		`{"stage":0,"step":0,"kind":"B","mb":2,"chunk":1,"start_ns":1700000060000,"end_ns":1700000090000,"wait_ns":0,"bytes_sent":4096,"stashed":2,"send_ns":700}`+"\n"), 0o644)
	info, events, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	wantInfo := RunInfo{Schedule: "1f1b", Stages: 1, MicroBatches: 8, Steps: 200, TheoreticalBubble: 0.2727}
	wantEvent := Event{Stage: 0, Step: 0, Kind: "F", MB: 2, StartNS: 1700000000000, EndNS: 1700000050000,
		WaitNS: 1200, BytesSent: 65536, Stashed: 3}
	wantNew := Event{Stage: 0, Step: 0, Kind: "B", MB: 2, Chunk: 1, StartNS: 1700000060000, EndNS: 1700000090000,
		BytesSent: 4096, Stashed: 2, SendNS: 700}
	if !reflect.DeepEqual(info, wantInfo) || len(events) != 1 || len(events[0]) != 2 || events[0][0] != wantEvent || events[0][1] != wantNew {
		t.Errorf("got %+v %+v", info, events)
	}

	// A custom schedule's run.json carries the schedule.
	os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"schedule":"custom","stages":1,"micro_batches":1,"steps":2,`+
		`"theoretical_bubble":0,"schedule_csv":"0F0,0B0\n"}`), 0o644)
	if info, _, err = ReadRun(dir); err != nil || info.ScheduleCSV != "0F0,0B0\n" {
		t.Errorf("schedule_csv: %+v, %v", info, err)
	}
}

func TestReadRunErrors(t *testing.T) {
	info, events := gpipeRun()

	dir := writeRun(t, info, events)
	path := EventsFile(dir, 1)
	b, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(b), "\n")
	bad := lines[0] + "\n" + `{"stage":1,"step":` + "\n" + strings.Join(lines[1:], "")
	os.WriteFile(path, []byte(bad), 0o644)
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Errorf("malformed line: err = %v, want one naming %s:3", err, path)
	}

	dir = writeRun(t, info, events)
	path = EventsFile(dir, 0)
	os.WriteFile(path, []byte(`{"stage":0,"step":0,"kind":"X"}`+"\n"), 0o644)
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), path+":1: unknown kind") {
		t.Errorf("bad kind: err = %v", err)
	}

	dir = writeRun(t, info, events)
	os.Remove(EventsFile(dir, 1))
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), "no events for stage 1") {
		t.Errorf("missing stage file: err = %v", err)
	}

	dir = t.TempDir()
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), "run.json") {
		t.Errorf("missing run.json: err = %v", err)
	}
}

func TestMeanCosts(t *testing.T) {
	ev := func(step int, kind string, d int64) Event {
		return Event{Step: step, Kind: kind, StartNS: 1000, EndNS: 1000 + d}
	}
	events := [][]Event{
		{ev(0, Forward, 100), ev(1, Forward, 10), ev(1, Forward, 20), ev(1, Backward, 40)},
		{ev(0, Forward, 100), ev(1, Forward, 30), ev(1, Input, 20), ev(1, Weight, 10), ev(1, Optimizer, 5)},
	}
	got := MeanCosts(events, 1)
	want := []ActionCosts{{F: 15, B: 40}, {F: 30, B: 30, I: 20, W: 10}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if all := MeanCosts(events[:1], 5); all[0].F != (100+10+20)/3 {
		t.Errorf("skip beyond the run must analyse every step: %+v", all[0])
	}
}

// TestMeanCostsPerChunk: a stage of two chunks gets each chunk's own means
// beside the stage's, and the simulator's costs take them chunk by chunk,
// unscaled; a stage of one chunk gets none.
func TestMeanCostsPerChunk(t *testing.T) {
	ev := func(kind string, chunk int, d int64) Event {
		return Event{Step: 1, Kind: kind, Chunk: chunk, StartNS: 1000, EndNS: 1000 + d}
	}
	events := [][]Event{
		{ev(Forward, 0, 10e6), ev(Forward, 1, 30e6), ev(Input, 0, 20e6), ev(Weight, 0, 10e6), ev(Backward, 1, 50e6)},
		{ev(Forward, 0, 4e6), ev(Forward, 1, 6e6), ev(Backward, 0, 8e6), ev(Backward, 1, 12e6)},
	}
	got := MeanCosts(events, 0)
	if !reflect.DeepEqual(got[0].Chunks, []ActionCosts{{F: 10e6, B: 30e6, I: 20e6, W: 10e6}, {F: 30e6, B: 50e6}}) {
		t.Fatalf("stage 0's chunks: %+v", got[0].Chunks)
	}
	c := ScheduleCosts(got, 2, 0.5)
	want := [][]schedule.ChunkCost{{{F: 10, B: 30, I: 20, W: 10}, {F: 30, B: 50, I: 25, W: 25}}, {{F: 4, B: 8, I: 4, W: 4}, {F: 6, B: 12, I: 6, W: 6}}}
	if !reflect.DeepEqual(c.Chunks, want) {
		t.Errorf("per-chunk costs %+v, want %+v", c.Chunks, want)
	}
	if one := MeanCosts([][]Event{{ev(Forward, 0, 1)}}, 0); one[0].Chunks != nil {
		t.Errorf("one chunk: %+v", one[0])
	}
	if c := ScheduleCosts(MeanCosts([][]Event{{ev(Forward, 0, 1)}}, 0), 1, 0); c.Chunks != nil {
		t.Errorf("one chunk: per-chunk costs %+v", c.Chunks)
	}
}

func TestMeanTransferWeighsTimedMessages(t *testing.T) {
	r := &Report{Links: []LinkReport{
		{Down: LinkTraffic{Timed: 3, MeanDelay: time.Millisecond}, Up: LinkTraffic{Timed: 1, MeanDelay: 5 * time.Millisecond}},
		{Down: LinkTraffic{Timed: 0, MeanDelay: 0}},
	}}
	if d, ok := r.MeanTransfer(); !ok || d != 2*time.Millisecond {
		t.Errorf("MeanTransfer = %v, %v; want 2ms", d, ok)
	}
	if _, ok := (&Report{}).MeanTransfer(); ok {
		t.Error("a report without timed messages gave a transfer time")
	}
}
