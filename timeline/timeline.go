// Package timeline draws pictures of a pipeline: one row per stage, one box
// per action over time. The schedule simulator uses it for predicted
// timelines and the profiler for measured ones; the package itself knows
// nothing about where the spans come from.
//
// Two renderings share one model (Chart): SVG, a self-contained image a
// person opens in a browser (hover a box for its details), and Text, a
// character grid for terminals, logs and golden tests.
//
// Times are plain float64 in any unit (Chart.Unit names it). If every span
// starts at or after zero and the first one starts early enough, the axis
// starts at 0 so that a leading bubble shows; otherwise it starts at the
// earliest span. Callers with absolute timestamps (wall clock) should subtract
// the run's start first so that the axis labels stay short.
package timeline

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// Kind is the kind of work in a box; each kind is drawn in its own colour.
// Kinds outside the constants below are allowed and get a colour of their own.
type Kind string

const (
	Forward    Kind = "F"    // forward
	Backward   Kind = "B"    // full backward (input and weight gradients)
	InputGrad  Kind = "I"    // input-gradient half of a split backward
	WeightGrad Kind = "W"    // weight-gradient half of a split backward
	Recompute  Kind = "RF"   // forward run again before its backward (activation recomputation)
	Optimizer  Kind = "OPT"  // optimizer step
	Wait       Kind = "WAIT" // explicit waiting (optional)
	Send       Kind = "SEND" // sending activations or gradients (optional)
	// AllReduce is a collective that runs beside the row's work (a stage's
	// gradient all-reduce among data-parallel replicas): drawn in a thin lane
	// of its own under the row, so it may overlap the row's boxes.
	AllReduce Kind = "AR"
)

// beside reports whether spans of kind k run beside a row's other work and
// are drawn in a lane of their own under it (besideKinds, in that order).
func beside(k Kind) bool { return k == AllReduce }

var besideKinds = []Kind{AllReduce}

// besideName names the lane under a row for spans of kind k: "all-reduce".
func besideName(k Kind) string {
	if k == AllReduce {
		return "all-reduce"
	}
	return string(k)
}

// Span is one box: a piece of work on one row between Start and End.
type Span struct {
	Start, End float64 // any unit (seconds, ms or simulator units); End >= Start
	Kind       Kind
	MicroBatch int
	Chunk      int    // virtual stage; chunk > 0 is drawn lighter and hatched so interleaving is visible
	Step       int    // training step of a measured run, numbered from 1 as the training log does; 0 for simulations
	Label      string // optional override of the box text (default "F3", "B3", "f3" for chunk > 0, ...)
	Detail     string // optional text added to the tooltip, e.g. "exposed 4.1 ms"
}

// Row is one lane of the chart, usually one pipeline stage.
type Row struct {
	Name  string // "stage 0"
	Spans []Span
	Note  string // shown at the row's right end, e.g. "bubble 27.3%"
}

// Chart is a whole picture.
type Chart struct {
	Title  string
	Unit   string // "ms", "s", "units"
	Rows   []Row
	Arrows []Arrow // optional flow arrows (a send from one box's end to another row's box start)
}

// Arrow is a flow from time FromTime on row FromRow to time ToTime on row
// ToRow, typically a send from the end of one box to the start of the box it
// feeds.
type Arrow struct {
	FromRow  int
	FromTime float64
	ToRow    int
	ToTime   float64
}

// kindStyle is how one kind is drawn.
type kindStyle struct {
	fill   string // solid colour for chunk 0
	letter rune   // character in Text
	desc   string // legend text
}

// known kinds in legend order.
var knownKinds = []Kind{Forward, Backward, InputGrad, WeightGrad, Recompute, Optimizer, AllReduce, Send, Wait}

var styles = map[Kind]kindStyle{
	Forward:    {"#3b78c2", 'F', "forward"},
	Backward:   {"#3a9a5b", 'B', "backward"},
	InputGrad:  {"#d9731f", 'I', "input-grad backward"},
	WeightGrad: {"#8a63c0", 'W', "weight-grad backward"},
	Recompute:  {"#86b3e3", 'R', "recomputed forward"},
	Optimizer:  {"#cf4b48", 'O', "optimizer"},
	AllReduce:  {"#b8860b", 'A', "all-reduce (lane under its row)"},
	Send:       {"#2aa6a6", 'S', "sending"},
	Wait:       {"#b9bfc8", '-', "waiting"},
}

// extraFills colour kinds the package does not know, picked by a hash of the
// kind's name so that a kind keeps its colour from chart to chart.
var extraFills = []string{"#8c6d4f", "#d66a9c", "#6b7a1f", "#5f6b7a", "#b58900", "#1f6f8b"}

func styleOf(k Kind) kindStyle {
	if s, ok := styles[k]; ok {
		return s
	}
	var h uint32 = 2166136261
	for i := 0; i < len(k); i++ {
		h = (h ^ uint32(k[i])) * 16777619
	}
	letter := '?'
	for _, r := range string(k) {
		letter = unicode.ToUpper(r)
		break
	}
	desc := string(k)
	if desc == "" {
		desc = "(no kind)"
	}
	return kindStyle{extraFills[h%uint32(len(extraFills))], letter, desc}
}

// layer orders kinds when they overlap: compute covers sends, sends cover
// waits (in Text), and waits are drawn first (in SVG).
func layer(k Kind) int {
	switch k {
	case Wait:
		return 1
	case Send:
		return 2
	}
	return 3
}

// besidePresent lists the kinds of r's spans drawn in lanes of their own
// under it, in besideKinds' order.
func (r *Row) besidePresent() []Kind {
	var out []Kind
	for _, k := range besideKinds {
		for _, s := range r.Spans {
			if s.Kind == k {
				out = append(out, k)
				break
			}
		}
	}
	return out
}

// kindsPresent lists the kinds used in the chart, known ones first in a fixed
// order, then the others sorted; hatched reports whether any span has
// chunk > 0.
func (c *Chart) kindsPresent() (kinds []Kind, hatched bool) {
	seen := map[Kind]bool{}
	for _, r := range c.Rows {
		for _, s := range r.Spans {
			seen[s.Kind] = true
			if s.Chunk > 0 {
				hatched = true
			}
		}
	}
	for _, k := range knownKinds {
		if seen[k] {
			kinds = append(kinds, k)
			delete(seen, k)
		}
	}
	var rest []Kind
	for k := range seen {
		rest = append(rest, k)
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	return append(kinds, rest...), hatched
}

// bounds validates the chart and returns the time range [t0, t1] to draw,
// with t1 > t0.
func (c *Chart) bounds() (t0, t1 float64, err error) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, r := range c.Rows {
		for j, s := range r.Spans {
			if math.IsNaN(s.Start) || math.IsInf(s.Start, 0) || math.IsNaN(s.End) || math.IsInf(s.End, 0) {
				return 0, 0, fmt.Errorf("timeline: row %d (%q) span %d: non-finite time [%v, %v]", i, r.Name, j, s.Start, s.End)
			}
			if s.End < s.Start {
				return 0, 0, fmt.Errorf("timeline: row %d (%q) span %d: end %v before start %v", i, r.Name, j, s.End, s.Start)
			}
			lo = math.Min(lo, s.Start)
			hi = math.Max(hi, s.End)
		}
	}
	for i, a := range c.Arrows {
		if a.FromRow < 0 || a.FromRow >= len(c.Rows) || a.ToRow < 0 || a.ToRow >= len(c.Rows) {
			return 0, 0, fmt.Errorf("timeline: arrow %d: rows %d -> %d out of range [0, %d)", i, a.FromRow, a.ToRow, len(c.Rows))
		}
		for _, t := range []float64{a.FromTime, a.ToTime} {
			if math.IsNaN(t) || math.IsInf(t, 0) {
				return 0, 0, fmt.Errorf("timeline: arrow %d: non-finite time %v", i, t)
			}
			lo = math.Min(lo, t)
			hi = math.Max(hi, t)
		}
	}
	if math.IsInf(lo, 1) { // nothing to draw
		return 0, 1, nil
	}
	if lo >= 0 && lo <= hi-lo {
		lo = 0
	}
	if hi <= lo {
		hi = lo + 1
		if lo != 0 {
			hi = lo + math.Abs(lo)*1e-6 + 1e-9
		}
	}
	return lo, hi, nil
}

// defaultLabel is the text of a box when Span.Label is empty: the kind's
// letter and the micro-batch ("F3"), lowercase for chunk > 0 ("f3").
func defaultLabel(s Span) string {
	var l string
	switch s.Kind {
	case Wait:
		return ""
	case Optimizer:
		l = "OPT"
	case AllReduce:
		l = "AR"
	case Send:
		l = "S" + strconv.Itoa(s.MicroBatch)
	default:
		l = string(s.Kind) + strconv.Itoa(s.MicroBatch)
	}
	if s.Chunk > 0 {
		l = strings.ToLower(l)
	}
	return l
}

// niceStep returns the smallest number of the form {1, 2, 5} x 10^k that is
// >= x (x > 0).
func niceStep(x float64) float64 {
	if !(x > 0) || math.IsInf(x, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v := m * p; v >= x*(1-1e-12) {
			return v
		}
	}
	return 10 * p
}

// decimals returns how many decimals print x (a tick step) exactly.
func decimals(x float64) int {
	x = math.Abs(x)
	for d := 0; d < 12; d++ {
		v := x * math.Pow(10, float64(d))
		if math.Abs(v-math.Round(v)) <= 1e-6*math.Max(v, 1) {
			return d
		}
	}
	return 12
}

// formatNum prints v with d decimals, avoiding "-0".
func formatNum(v float64, d int) string {
	s := strconv.FormatFloat(v, 'f', d, 64)
	if strings.TrimLeft(s, "-0.") == "" {
		s = strings.TrimPrefix(s, "-")
	}
	return s
}
