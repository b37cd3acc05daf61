package profile

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/timeline"
)

// chartRun is 1f1b on 3 stages with 4 micro-batches for 5 steps, activations
// taking 0.2 ms and gradients 0.3 ms, with clocks as given.
func chartRun(t *testing.T, clock []int64) (RunInfo, [][]Event) {
	s := build(t, "1f1b", 3, 4, 1)
	c := play{sched: s, steps: 5, opt: ms, gap: ms, act: 100, grad: 200, clock: clock,
		delay: func(_ int, grad bool, _, _, _ int) int64 {
			if grad {
				return 300_000
			}
			return 200_000
		}}
	return runInfo(s, 5), c.events(t)
}

// mustChart is Chart, failing the test on an error.
func mustChart(t *testing.T, events [][]Event, firstStep, steps int, opts ...ChartOptions) *timeline.Chart {
	t.Helper()
	c, err := Chart(events, firstStep, steps, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestChart(t *testing.T) {
	_, events := chartRun(t, nil)
	c := mustChart(t, events, 2, 2, ChartOptions{Waits: true})
	if len(c.Rows) != 3 || c.Unit != "ms" || !strings.Contains(c.Title, "steps 2-3") {
		t.Fatalf("chart %q, %d rows", c.Title, len(c.Rows))
	}
	first := math.Inf(1)
	for s, row := range c.Rows {
		if row.Name != fmt.Sprintf("stage %d", s) || !strings.Contains(row.Note, "bubble") {
			t.Errorf("row %d: name %q note %q", s, row.Name, row.Note)
		}
		var actions, waits, opts int
		for _, sp := range row.Spans {
			first = min(first, sp.Start)
			if sp.Step < 2 || sp.Step > 3 {
				t.Errorf("row %d: span of step %d", s, sp.Step)
			}
			switch sp.Kind {
			case timeline.Wait:
				waits++
			case timeline.Optimizer:
				opts++
				actions++
			default:
				actions++
			}
		}
		// 4 forwards, 4 backwards and the optimizer, twice.
		if actions != 18 || opts != 2 || (s > 0 && waits == 0) {
			t.Errorf("row %d: %d actions, %d optimizer steps, %d waits", s, actions, opts, waits)
		}
	}
	if first != 0 {
		t.Errorf("first span at %v ms, want 0", first)
	}
	// Arrows for the first shown step: 2 links, 4 messages each way.
	if len(c.Arrows) != 16 {
		t.Errorf("%d arrows, want 16", len(c.Arrows))
	}
	for _, a := range c.Arrows {
		if d := a.ToTime - a.FromTime; (a.ToRow == a.FromRow+1 && d < 0.2-1e-9) || (a.ToRow == a.FromRow-1 && d < 0.3-1e-9) {
			t.Errorf("arrow %+v faster than the transfer", a)
		}
	}
	if c := mustChart(t, events, 2, 2, ChartOptions{ArrowSteps: 2}); len(c.Arrows) != 32 {
		t.Errorf("%d arrows over two steps, want 32", len(c.Arrows))
	}
	if c := mustChart(t, events, 2, 2, ChartOptions{ArrowSteps: -1}); len(c.Arrows) != 0 {
		t.Errorf("%d arrows, want none", len(c.Arrows))
	}
	var text, svg strings.Builder
	if err := c.Text(&text, 0, 100); err != nil {
		t.Fatal(err)
	}
	if err := c.SVG(&svg); err != nil {
		t.Fatal(err)
	}

	// Defaults: from the first step, DefaultChartSteps steps.
	d := mustChart(t, events, 0, 0)
	if !strings.Contains(d.Title, "steps 1-3") {
		t.Errorf("default chart %q", d.Title)
	}

	// Skewed clocks draw the same picture once aligned, but for the error of
	// the estimate: half the delays' asymmetry (0.05 ms) per link.
	_, skewed := chartRun(t, []int64{0, 5_000_000_000, -70_000_000})
	cs := mustChart(t, skewed, 2, 2, ChartOptions{Waits: true})
	if !strings.Contains(cs.Title, "clocks aligned") {
		t.Errorf("title %q does not mention the alignment", cs.Title)
	}
	for s, row := range cs.Rows {
		for i, sp := range row.Spans {
			want := c.Rows[s].Spans[i]
			if math.Abs(sp.Start-want.Start) > 0.1+1e-9 || math.Abs(sp.End-want.End) > 0.1+1e-9 {
				t.Errorf("stage %d span %d: %+v, want %+v", s, i, sp, want)
			}
			sp.Start, sp.End = want.Start, want.End
			if sp != want {
				t.Errorf("stage %d span %d: %+v, want %+v", s, i, sp, want)
			}
		}
	}
	if len(cs.Arrows) != len(c.Arrows) {
		t.Errorf("%d arrows, want %d", len(cs.Arrows), len(c.Arrows))
	}

	// With symmetric delays the estimate is exact, and so is the picture.
	run := play{sched: build(t, "1f1b", 3, 4, 1), steps: 3, opt: ms, act: 1, grad: 1,
		delay: func(int, bool, int, int, int) int64 { return 250_000 }}
	plain := mustChart(t, run.events(t), 0, 0)
	run.clock = []int64{0, 5_000_000_000, -70_000_000}
	shifted := mustChart(t, run.events(t), 0, 0)
	shifted.Title = plain.Title
	if !reflect.DeepEqual(shifted, plain) {
		t.Error("skewed clocks give another chart")
	}
}

func TestChartInterleaved(t *testing.T) {
	s := build(t, "interleaved", 2, 2, 2)
	events := play{sched: s, steps: 1, act: 1, grad: 1}.events(t)
	var text strings.Builder
	if err := mustChart(t, events, 0, 1).Text(&text, 0.5, 0); err != nil {
		t.Fatal(err)
	}
	// Lower-case letters for chunk 1; the ring's arrows run from stage 1 up to stage 0.
	if !strings.Contains(text.String(), "f") || !strings.Contains(text.String(), "b") {
		t.Errorf("no chunk-1 actions:\n%s", text.String())
	}
}

// traceFile is what WriteTrace writes.
type traceFile struct {
	TraceEvents []struct {
		Name string         `json:"name"`
		Cat  string         `json:"cat"`
		Ph   string         `json:"ph"`
		Ts   float64        `json:"ts"`
		Dur  *float64       `json:"dur"`
		Pid  int            `json:"pid"`
		Tid  int            `json:"tid"`
		ID   int            `json:"id"`
		BP   string         `json:"bp"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
	DisplayTimeUnit string `json:"displayTimeUnit"`
}

func TestWriteTrace(t *testing.T) {
	_, events := chartRun(t, []int64{0, -3_000_000_000, 12_000_000})
	var b strings.Builder
	if err := WriteTrace(&b, events, 2, 2); err != nil {
		t.Fatal(err)
	}
	var tf traceFile
	if err := json.Unmarshal([]byte(b.String()), &tf); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if tf.DisplayTimeUnit != "ms" {
		t.Errorf("displayTimeUnit %q", tf.DisplayTimeUnit)
	}
	type slice struct{ ts, end float64 }
	slices := map[int][]slice{}
	threads := map[int]string{}
	names := map[string]bool{}
	type flow struct {
		name, cat string
		tid       int
		ts        float64
		bp        string
	}
	starts, finishes := map[int]flow{}, map[int]flow{}
	xs := 0
	for _, e := range tf.TraceEvents {
		switch e.Ph {
		case "M":
			if e.Name == "thread_name" {
				threads[e.Tid] = e.Args["name"].(string)
			}
		case "X":
			xs++
			names[e.Name] = true
			if e.Dur == nil || *e.Dur <= 0 {
				t.Errorf("X event %s without a duration", e.Name)
				continue
			}
			slices[e.Tid] = append(slices[e.Tid], slice{e.Ts, e.Ts + *e.Dur})
			if e.Name != "OPT" {
				for _, k := range []string{"step", "micro_batch", "chunk", "bytes_sent", "wait_us"} {
					if _, ok := e.Args[k]; !ok {
						t.Errorf("X event %s without %s: %v", e.Name, k, e.Args)
					}
				}
				if s := e.Args["step"].(float64); s < 2 || s > 3 {
					t.Errorf("X event of step %v", s)
				}
			}
		case "s":
			starts[e.ID] = flow{e.Name, e.Cat, e.Tid, e.Ts, e.BP}
		case "f":
			finishes[e.ID] = flow{e.Name, e.Cat, e.Tid, e.Ts, e.BP}
		}
	}
	// Two steps of 3 stages, each step 4 F, 4 B and one OPT.
	if xs != 2*3*9 {
		t.Errorf("%d X events, want %d", xs, 2*3*9)
	}
	for s := range 3 {
		if threads[s] != fmt.Sprintf("stage %d", s) {
			t.Errorf("thread %d named %q", s, threads[s])
		}
	}
	for _, n := range []string{"F0", "F3", "B0", "B3", "OPT"} {
		if !names[n] {
			t.Errorf("no slice named %s", n)
		}
	}
	// 2 steps, 2 links, 4 messages each way.
	if len(starts) != 32 || len(finishes) != 32 {
		t.Errorf("%d flow starts and %d finishes, want 32", len(starts), len(finishes))
	}
	within := func(tid int, ts float64, atStart bool) bool {
		for _, sl := range slices[tid] {
			if atStart && ts == sl.ts || !atStart && ts >= sl.ts && ts <= sl.end && sl.end-ts < 0.01 {
				return true
			}
		}
		return false
	}
	for id, s := range starts {
		f, ok := finishes[id]
		switch {
		case !ok:
			t.Errorf("flow %d has no finish", id)
		case f.name != s.name || f.cat != s.cat || f.bp != "e" || f.ts < s.ts:
			t.Errorf("flow %d: start %+v finish %+v", id, s, f)
		case !within(s.tid, s.ts, false) || !within(f.tid, f.ts, true):
			t.Errorf("flow %d: start %+v not at a slice's end or finish %+v not at one's start", id, s, f)
		case s.name == "activation" && f.tid != s.tid+1, s.name == "gradient" && f.tid != s.tid-1:
			t.Errorf("flow %d goes from stage %d to %d", id, s.tid, f.tid)
		}
	}

	// Chunk 1's slices are lower-case.
	s := build(t, "interleaved", 2, 2, 2)
	b.Reset()
	if err := WriteTrace(&b, play{sched: s, steps: 1}.events(t), 0, 1); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"name":"f1"`) || !strings.Contains(b.String(), `"name":"b0"`) {
		t.Errorf("no chunk-1 slices:\n%s", b.String())
	}
}

func TestWriteHTML(t *testing.T) {
	info, events := chartRun(t, nil)
	info.Schedule = "<mine & yours>"
	info.ScheduleCSV = "0F0\n" // does not fit the run: the report says why
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := mustChart(t, events, 0, 0)
	c.Title = `steps <0-2> & "more"`
	var b strings.Builder
	if err := WriteHTML(&b, c, r); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"<!DOCTYPE html>", "<svg", "</svg>", "<pre>", "steps &lt;0-2&gt; &amp; &#34;more&#34;",
		"schedule &lt;mine &amp; yours&gt;", "bottleneck: stage"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"<0-2>", "<mine", "<script", "<?xml", "<link", "src=", "@import"} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds %q", bad)
		}
	}
	if strings.Count(page, "<svg") != 1 {
		t.Error("want exactly one <svg>")
	}
}

// The schedule's own chart and the replayed run's agree on every action's time.
func TestChartOfReplayedSchedule(t *testing.T) {
	s := build(t, "zb-h1", 3, 4, 1)
	tl, _ := schedule.Simulate(s, schedule.UniformCosts(3, 1, 2, 0))
	c := mustChart(t, replay(t, s, schedule.UniformCosts(3, 1, 2, 0), 1, 0), 0, 1)
	for st, spans := range tl.Spans {
		if len(c.Rows[st].Spans) != len(spans) {
			t.Fatalf("stage %d: %d spans, want %d", st, len(c.Rows[st].Spans), len(spans))
		}
		for i, sp := range spans {
			got := c.Rows[st].Spans[i]
			if !near(got.Start, sp.Start) || !near(got.End, sp.End) || got.MicroBatch != sp.Action.MicroBatch ||
				string(got.Kind) != sp.Action.Kind.String() && !(got.Kind == timeline.InputGrad && sp.Action.Kind == schedule.Input) {
				t.Errorf("stage %d span %d: %+v, want %+v", st, i, got, sp)
			}
		}
	}
}

// TestStepNumbering: the report, the chart and the trace number steps as the
// training log does (from 1; the logs hold the index from 0), so asking any
// of them for step 7 of stragglerRun gives the same step: the straggler, 3x
// slower than the others.
func TestStepNumbering(t *testing.T) {
	info, events, _ := stragglerRun(t)
	r, err := Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st := r.Stragglers(); len(st) != 1 || st[0].Step != 7 {
		t.Fatalf("stragglers %+v, want step 7", st)
	}
	// Stage 0's first forward takes 1 ms, 3 ms in the slow step.
	c := mustChart(t, events, 7, 1)
	f := c.Rows[0].Spans[0]
	if c.Title != "measured run, step 7" || f.Step != 7 || !near(f.End-f.Start, 3) {
		t.Errorf("chart of step 7: %q, first span %+v; want the 3 ms forward of step 7", c.Title, f)
	}
	var b strings.Builder
	if err := WriteTrace(&b, events, 7, 1); err != nil {
		t.Fatal(err)
	}
	var tf struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Tid  int            `json:"tid"`
			Dur  float64        `json:"dur"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
		OtherData map[string]any `json:"otherData"`
	}
	if err := json.Unmarshal([]byte(b.String()), &tf); err != nil {
		t.Fatal(err)
	}
	if tf.OtherData["first_step"] != 7.0 || tf.OtherData["last_step"] != 7.0 {
		t.Errorf("otherData %v, want steps 7 to 7", tf.OtherData)
	}
	for _, e := range tf.TraceEvents {
		if e.Name == "F0" && e.Tid == 0 && (e.Args["step"] != 7.0 || e.Dur != 3000) {
			t.Errorf("trace's F0 on stage 0: %+v, want step 7 taking 3000 us", e)
		}
	}
}

// TestChartRange: a first step outside the logged steps is an error that
// names them, and nothing is drawn or written; a range running past the last
// step is cut there, and the title says so.
func TestChartRange(t *testing.T) {
	_, events := chartRun(t, nil) // steps 1 to 5
	for _, first := range []int{6, 100} {
		c, err := Chart(events, first, 3)
		want := fmt.Sprintf("step %d is outside the run: its logs hold steps 1 to 5", first)
		if c != nil || err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Chart from step %d: %v, %v; want %q", first, c, err, want)
		}
		var b strings.Builder
		if err := WriteTrace(&b, events, first, 3); err == nil || !strings.Contains(err.Error(), want) || b.Len() != 0 {
			t.Errorf("WriteTrace from step %d: %v, %d bytes written", first, err, b.Len())
		}
	}
	if c := mustChart(t, events, 4, 3); c.Title != "measured run, steps 4-5" {
		t.Errorf("title %q, want steps 4-5", c.Title)
	}
	if first, last, err := ShownSteps(events, 0, 0); first != 1 || last != DefaultChartSteps || err != nil {
		t.Errorf("default steps %d to %d (%v)", first, last, err)
	}
}
