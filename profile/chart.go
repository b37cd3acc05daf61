package profile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/timeline"
)

// DefaultChartSteps is how many steps Chart and WriteTrace show when asked for
// none: enough to see the pipeline fill and drain, and the steady state
// between one step's drain and the next one's fill.
const DefaultChartSteps = 3

// ChartOptions tune Chart (and, Clocks and Placement only, WriteTrace).
type ChartOptions struct {
	// Waits draws each action's wait for its input (wait_ns before start_ns)
	// as a WAIT span.
	Waits bool
	// ArrowSteps is how many of the shown steps, from the first, get an arrow
	// from each send to its receive: 0 means 1, and a negative number none.
	// Arrows over every step of a long chart hide the boxes.
	ArrowSteps int
	// Clocks are the clocks the stages recorded (RunInfo.Clocks), for Align:
	// stages that share one are never shifted apart.
	Clocks []Clock
	// Placement is where the run placed its chunks (RunPlacement), which
	// decides which action sends to which: Loop unless set.
	Placement schedule.Placement
}

// chartOptions merges opts: the last one's ArrowSteps, non-nil Clocks and
// non-Loop Placement.
func chartOptions(opts []ChartOptions) ChartOptions {
	var opt ChartOptions
	for _, o := range opts {
		opt.Waits = opt.Waits || o.Waits
		opt.ArrowSteps = o.ArrowSteps
		if o.Clocks != nil {
			opt.Clocks = o.Clocks
		}
		if o.Placement != schedule.Loop {
			opt.Placement = o.Placement
		}
	}
	return opt
}

// ShownSteps returns the steps Chart and WriteTrace show, numbered as the
// training log numbers them (from 1): steps from firstStep (the run's first
// when firstStep < 1), DefaultChartSteps of them when steps < 1, cut at the
// run's last step. It is an error for firstStep to lie outside the steps the
// logs hold, and for logs without events.
func ShownSteps(events [][]Event, firstStep, steps int) (first, last int, err error) {
	lo, hi, n := StepRange(events)
	if n == 0 {
		return 0, 0, errors.New("profile: no events")
	}
	if steps < 1 {
		steps = DefaultChartSteps
	}
	if first = firstStep; first < 1 {
		first = lo
	}
	if first < lo || first > hi {
		return 0, 0, fmt.Errorf("profile: step %d is outside the run: its logs hold steps %d to %d", first, lo, hi)
	}
	return first, min(hi, first+steps-1), nil
}

// shownSteps aligns the clocks and picks the steps to show (ShownSteps). in
// reports whether an event's step (its index, Event.Step) is shown, and t0 is
// the earliest start among the shown actions (the earliest wait's start, with
// waits).
func shownSteps(events [][]Event, clocks []Clock, pl schedule.Placement, firstStep, steps int, waits bool) (clock Alignment, aligned [][]Event, first, last int, in func(*Event) bool, t0 int64, err error) {
	if first, last, err = ShownSteps(events, firstStep, steps); err != nil {
		return clock, nil, 0, 0, nil, 0, err
	}
	clock, aligned = AlignPlaced(events, clocks, pl)
	in = func(e *Event) bool { return e.StepNumber() >= first && e.StepNumber() <= last }
	t0 = math.MaxInt64
	for _, stage := range aligned {
		for i := range stage {
			if e := &stage[i]; in(e) {
				t0 = min(t0, e.StartNS)
				if waits && e.Kind != AllReduce { // its wait comes at its end
					t0 = min(t0, e.StartNS-e.WaitNS)
				}
			}
		}
	}
	if t0 == math.MaxInt64 { // no action logged in the shown steps
		t0 = 0
	}
	return clock, aligned, first, last, in, t0, nil
}

// chartKind maps an event kind to the timeline's.
func chartKind(k string) timeline.Kind {
	switch k {
	case Input:
		return timeline.InputGrad
	case Weight:
		return timeline.WeightGrad
	case Recompute:
		return timeline.Recompute
	case Optimizer:
		return timeline.Optimizer
	}
	return timeline.Kind(k) // F and B are spelled alike
}

// Chart draws steps firstStep to firstStep+steps-1 of a measured run, chosen
// and numbered as ShownSteps says (as the training log numbers them): one row
// per stage, one span per action, optimizer steps included, and a stage's
// all-reduces (runs with replicas) in a lane under its row, in ms from the
// first shown action, with the clocks aligned (Align). Each row's note gives
// the stage's busy time and bubble over the shown steps' pipeline windows,
// measured as Analyse does. Arrows run from each send to its receive in the
// first ChartOptions.ArrowSteps shown steps. It is an error for firstStep to
// lie outside the run.
func Chart(events [][]Event, firstStep, steps int, opts ...ChartOptions) (*timeline.Chart, error) {
	opt := chartOptions(opts)
	clock, aligned, first, last, in, t0, err := shownSteps(events, opt.Clocks, opt.Placement, firstStep, steps, opt.Waits)
	if err != nil {
		return nil, err
	}
	ms := func(ns int64) float64 { return float64(ns-t0) / 1e6 }

	title := fmt.Sprintf("measured run, steps %d-%d", first, last)
	if first == last {
		title = fmt.Sprintf("measured run, step %d", first)
	}
	if clock.Shifted {
		title += fmt.Sprintf(" (clocks aligned to stage 0's, largest offset %.3f ms)", float64(clock.MaxOffset())/1e6)
	}
	c := &timeline.Chart{Title: title, Unit: "ms", Rows: make([]timeline.Row, len(aligned))}

	// The shown steps' pipeline windows, as Analyse measures them.
	type span struct{ start, end int64 }
	windows := map[int]span{}
	for _, stage := range aligned {
		for i := range stage {
			e := &stage[i]
			if !in(e) || !compute(e.Kind) {
				continue
			}
			w, ok := windows[e.Step]
			if !ok {
				w = span{e.StartNS, e.EndNS}
			}
			windows[e.Step] = span{min(w.start, e.StartNS), max(w.end, e.EndNS)}
		}
	}
	var window int64
	for _, w := range windows {
		window += w.end - w.start
	}

	for s, stage := range aligned {
		row := timeline.Row{Name: fmt.Sprintf("stage %d", s)}
		var busy int64
		for i := range stage {
			e := &stage[i]
			if !in(e) {
				continue
			}
			if e.Kind == AllReduce {
				// Its wait_ns is the stage blocked on it before the
				// optimizer step, not a wait before it began.
				row.Spans = append(row.Spans, timeline.Span{Start: ms(e.StartNS), End: ms(e.EndNS),
					Kind: timeline.AllReduce, Chunk: e.Chunk, Step: e.StepNumber(),
					Detail: fmt.Sprintf("exposed %.3f ms, %.2f MiB sent", float64(e.WaitNS)/1e6, float64(e.BytesSent)/(1<<20))})
				continue
			}
			if opt.Waits && e.WaitNS > 0 {
				row.Spans = append(row.Spans, timeline.Span{Start: ms(e.StartNS - e.WaitNS), End: ms(e.StartNS),
					Kind: timeline.Wait, MicroBatch: e.MB, Chunk: e.Chunk, Step: e.StepNumber()})
			}
			row.Spans = append(row.Spans, timeline.Span{Start: ms(e.StartNS), End: ms(e.EndNS),
				Kind: chartKind(e.Kind), MicroBatch: e.MB, Chunk: e.Chunk, Step: e.StepNumber()})
			if compute(e.Kind) {
				busy += e.EndNS - e.StartNS
			}
		}
		if window > 0 {
			row.Note = fmt.Sprintf("busy %.1f ms, bubble %.1f%%", float64(busy)/1e6, 100*float64(window-busy)/float64(window))
		}
		c.Rows[s] = row
	}

	arrowSteps := opt.ArrowSteps
	if arrowSteps == 0 {
		arrowSteps = 1
	}
	for _, m := range messages(aligned, opt.Placement) {
		send := &aligned[m.send[0]][m.send[1]]
		if m.recv[0] < 0 || !in(send) || send.StepNumber()-first >= arrowSteps {
			continue
		}
		recv := &aligned[m.recv[0]][m.recv[1]]
		c.Arrows = append(c.Arrows, timeline.Arrow{FromRow: m.from, FromTime: ms(send.EndNS), ToRow: m.to, ToTime: ms(recv.StartNS)})
	}
	return c, nil
}

// traceEvent is one entry of a Chrome trace ("Trace Event Format").
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   int            `json:"id,omitempty"`
	BP   string         `json:"bp,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

// traceName names an action's slice: "F3", "B3", "I3", "W3", lower-case for a
// chunk > 0 ("f3"), "OPT" for the optimizer, "AR" for an all-reduce ("ar"
// for a chunk > 0).
func traceName(e *Event) string {
	switch {
	case e.Kind == Optimizer:
		return "OPT"
	case e.Kind == AllReduce && e.Chunk > 0:
		return "ar"
	case e.Kind == AllReduce:
		return "AR"
	}
	name := fmt.Sprintf("%s%d", e.Kind, e.MB)
	if e.Chunk > 0 {
		name = strings.ToLower(name)
	}
	return name
}

// WriteTrace writes steps firstStep to firstStep+steps-1 of a measured run
// (chosen and numbered as for Chart) as Chrome trace-event JSON in the JSON
// Object Format, for chrome://tracing or https://ui.perfetto.dev: one process
// for the run, one thread per stage ("stage 0", ...), one complete event
// ("ph":"X") per action with its step (numbered as the training log numbers
// it), micro-batch, chunk, bytes sent, wait and blocked-send time as args, and
// a flow ("ph":"s" at the sender's slice end, "ph":"f" with "bp":"e" at the
// receiver's slice start) from each send to its receive. A run with
// data-parallel replicas has its all-reduces on a thread of their own under
// each stage's ("stage 0 all-reduce"), one slice ("AR") per chunk and step
// with its bytes sent and exposed time as args, since they overlap the
// stage's actions. Times are
// microseconds from the first shown action, clocks aligned (Align, with the
// stages' recorded clocks when opts give them; the rest of opts is Chart's). It
// is an error for firstStep to lie outside the run; nothing is written then.
func WriteTrace(w io.Writer, events [][]Event, firstStep, steps int, opts ...ChartOptions) error {
	opt := chartOptions(opts)
	clock, aligned, first, last, in, t0, err := shownSteps(events, opt.Clocks, opt.Placement, firstStep, steps, false)
	if err != nil {
		return err
	}
	us := func(ns int64) float64 { return float64(ns-t0) / 1e3 }

	// All-reduces overlap their stage's actions, and a thread's slices must
	// nest: they get a thread of their own per stage, "stage s all-reduce"
	// (thread p+s), sorted under the stage's.
	p := len(aligned)
	reduces := false
	for _, stage := range aligned {
		for i := range stage {
			reduces = reduces || stage[i].Kind == AllReduce
		}
	}
	var out []traceEvent
	out = append(out, traceEvent{Name: "process_name", Ph: "M", Args: map[string]any{"name": "pipetrain run"}})
	for s := range aligned {
		index := s
		if reduces {
			index = 2 * s
		}
		out = append(out,
			traceEvent{Name: "thread_name", Ph: "M", Tid: s, Args: map[string]any{"name": fmt.Sprintf("stage %d", s)}},
			traceEvent{Name: "thread_sort_index", Ph: "M", Tid: s, Args: map[string]any{"sort_index": index}})
		if reduces {
			out = append(out,
				traceEvent{Name: "thread_name", Ph: "M", Tid: p + s, Args: map[string]any{"name": fmt.Sprintf("stage %d all-reduce", s)}},
				traceEvent{Name: "thread_sort_index", Ph: "M", Tid: p + s, Args: map[string]any{"sort_index": 2*s + 1}})
		}
	}
	for s, stage := range aligned {
		for i := range stage {
			e := &stage[i]
			if !in(e) {
				continue
			}
			dur := us(e.EndNS) - us(e.StartNS)
			args := map[string]any{"step": e.StepNumber()}
			tid := s
			switch e.Kind {
			case Optimizer:
			case AllReduce:
				tid = p + s
				args["chunk"], args["bytes_sent"], args["exposed_us"] = e.Chunk, e.BytesSent, float64(e.WaitNS)/1e3
			default:
				args["micro_batch"], args["chunk"], args["bytes_sent"] = e.MB, e.Chunk, e.BytesSent
				args["wait_us"], args["send_wait_us"], args["stashed"] = float64(e.WaitNS)/1e3, float64(e.SendNS)/1e3, e.Stashed
			}
			out = append(out, traceEvent{Name: traceName(e), Cat: e.Kind, Ph: "X", Ts: us(e.StartNS), Dur: &dur, Tid: tid, Args: args})
		}
	}
	id := 0
	for _, m := range messages(aligned, opt.Placement) {
		send := &aligned[m.send[0]][m.send[1]]
		if m.recv[0] < 0 || !in(send) {
			continue
		}
		recv := &aligned[m.recv[0]][m.recv[1]]
		id++
		name := "activation"
		if m.grad {
			name = "gradient"
		}
		// The start binds to the slice enclosing its time: one ns before the
		// sender's end keeps it inside.
		ts := max(us(send.EndNS-1), us(send.StartNS))
		out = append(out,
			traceEvent{Name: name, Cat: "transfer", Ph: "s", Ts: ts, Tid: m.from, ID: id},
			traceEvent{Name: name, Cat: "transfer", Ph: "f", BP: "e", Ts: us(recv.StartNS), Tid: m.to, ID: id})
	}

	offsets := make([]float64, len(clock.Offsets))
	for i, o := range clock.Offsets {
		offsets[i] = float64(o) / 1e6
	}
	other, err := json.Marshal(map[string]any{"first_step": first, "last_step": last, "t0_unix_ns": t0,
		"clock_offsets_ms": offsets, "clocks_shifted": clock.Shifted})
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(w)
	bw.WriteString(`{"traceEvents":[`)
	for i, e := range out {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if i > 0 {
			bw.WriteString(",")
		}
		bw.WriteString("\n")
		bw.Write(b)
	}
	fmt.Fprintf(bw, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":%s}\n", other)
	return bw.Flush()
}

// WriteHTML writes a self-contained HTML page, with no scripts and no
// external resources, that shows c (as SVG) above r's text report (r may be
// nil), so that a person can open a run's picture from disk with no server.
func WriteHTML(w io.Writer, c *timeline.Chart, r *Report) error {
	// The chart draws its own title; the page's names the run.
	title := "pipetrain run"
	if r != nil {
		title = fmt.Sprintf("pipetrain run: schedule %s, %s, %s", r.Info.Schedule, words.Count(len(r.Stages), "stage"), words.Count(r.Info.MicroBatches, "micro-batch"))
	} else if c != nil && c.Title != "" {
		title = c.Title
	}
	var svg bytes.Buffer
	if c != nil {
		if err := c.SVG(&svg); err != nil {
			return err
		}
	}
	// The XML declaration has no place inside an HTML document.
	body := svg.Bytes()
	if bytes.HasPrefix(body, []byte("<?xml")) {
		if i := bytes.Index(body, []byte("?>")); i >= 0 {
			body = bytes.TrimLeft(body[i+2:], "\r\n")
		}
	}
	var report strings.Builder
	if r != nil {
		if err := r.Write(&report); err != nil {
			return err
		}
	}

	bw := bufio.NewWriter(w)
	esc := html.EscapeString
	fmt.Fprintf(bw, `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>%s</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px; color: #1f2937; }
h1 { font-size: 18px; font-weight: 600; }
.chart { overflow-x: auto; }
pre { font: 12px/1.4 ui-monospace, Menlo, Consolas, monospace; background: #f6f8fa; padding: 12px; overflow-x: auto; }
</style>
</head>
<body>
<h1>%s</h1>
`, esc(title), esc(title))
	if len(body) > 0 {
		bw.WriteString(`<div class="chart">` + "\n")
		bw.Write(body)
		bw.WriteString("</div>\n")
	}
	if r != nil {
		fmt.Fprintf(bw, "<pre>%s</pre>\n", esc(report.String()))
	}
	bw.WriteString("</body>\n</html>\n")
	return bw.Flush()
}
