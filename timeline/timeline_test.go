package timeline

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// small is a 2-row chart with chunk > 0 spans, idle gaps and notes.
func small() *Chart {
	return &Chart{
		Title: "demo",
		Unit:  "ms",
		Rows: []Row{
			{Name: "stage 0", Note: "bubble 25.0%", Spans: []Span{
				{Start: 0, End: 2, Kind: Forward, MicroBatch: 0},
				{Start: 2, End: 4, Kind: Forward, MicroBatch: 1},
				{Start: 4, End: 6, Kind: Forward, MicroBatch: 0, Chunk: 1},
				{Start: 10, End: 14, Kind: Backward, MicroBatch: 0},
				{Start: 16, End: 17, Kind: Optimizer},
			}},
			{Name: "stage 1", Note: "bubble 40.0%", Spans: []Span{
				{Start: 2, End: 4, Kind: Forward, MicroBatch: 0},
				{Start: 4, End: 6, Kind: Forward, MicroBatch: 1},
				{Start: 6, End: 10, Kind: Backward, MicroBatch: 0, Chunk: 1},
				{Start: 10, End: 12, Kind: InputGrad, MicroBatch: 0},
				{Start: 12, End: 14, Kind: WeightGrad, MicroBatch: 0},
				{Start: 16, End: 17, Kind: Optimizer},
			}},
		},
	}
}

func TestTextGolden(t *testing.T) {
	tests := []struct {
		name  string
		slot  float64
		width int
		want  string
	}{
		{"auto", 0, 20, `demo
         0         10
ms       +---------+------
stage 0  FFFFff....BBBB..O  bubble 25.0%
stage 1  ..FFFFbbbbIIWW..O  bubble 40.0%
key: F=forward, B=backward, I=input-grad backward, W=weight-grad backward, O=optimizer, lowercase=chunk>0, .=idle; 1 column = 1 ms
`},
		// Auto slot rounds up to 1-2-5: 17/8 = 2.125 -> 5; the midpoints
		// 2.5, 7.5, 12.5 and 17.5 decide (so the short OPT drops out).
		{"auto-coarse", 0, 8, `demo
         0
ms       +---
stage 0  F.B.  bubble 25.0%
stage 1  FbW.  bubble 40.0%
key: F=forward, B=backward, I=input-grad backward, W=weight-grad backward, O=optimizer, lowercase=chunk>0, .=idle; 1 column = 5 ms
`},
		// Explicit slot: each column shows the span at its midpoint (1, 3, 5, ...).
		{"slot2", 2, 0, `demo
         0
ms       +--------
stage 0  FFf..BB..  bubble 25.0%
stage 1  .FFbbIW..  bubble 40.0%
key: F=forward, B=backward, I=input-grad backward, W=weight-grad backward, O=optimizer, lowercase=chunk>0, .=idle; 1 column = 2 ms
`},
		{"half", 0.5, 0, `demo
         0         5         10        15
ms       +---------+---------+---------+---
stage 0  FFFFFFFFffff........BBBBBBBB....OO  bubble 25.0%
stage 1  ....FFFFFFFFbbbbbbbbIIIIWWWW....OO  bubble 40.0%
key: F=forward, B=backward, I=input-grad backward, W=weight-grad backward, O=optimizer, lowercase=chunk>0, .=idle; 1 column = 0.5 ms
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := small().Text(&b, tt.slot, tt.width); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestTextLayersAndOffsets(t *testing.T) {
	// Absolute timestamps far from zero: the axis starts near the first span;
	// compute beats SEND beats WAIT where they overlap; unknown kinds use
	// their first letter.
	c := &Chart{Unit: "s", Rows: []Row{{Name: "s0", Spans: []Span{
		{Start: 1000, End: 1004, Kind: Wait},
		{Start: 1002, End: 1006, Kind: Send},
		{Start: 1003, End: 1005, Kind: Forward},
		{Start: 1007, End: 1008, Kind: "recompute", Chunk: 2},
	}}}}
	var b strings.Builder
	if err := c.Text(&b, 1, 0); err != nil {
		t.Fatal(err)
	}
	want := `    1000
s   +-------
s0  --SFFS.r
key: F=forward, S=sending, -=waiting, R=recompute, lowercase=chunk>0, .=idle; 1 column = 1 s
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestTextErrors(t *testing.T) {
	bad := &Chart{Rows: []Row{{Spans: []Span{{Start: 2, End: 1, Kind: Forward}}}}}
	if err := bad.Text(io.Discard, 0, 0); err == nil {
		t.Error("end before start: no error")
	}
	if err := small().Text(io.Discard, 1e-9, 0); err == nil {
		t.Error("tiny slot: no error")
	}
	var b strings.Builder
	if err := (&Chart{}).Text(&b, 0, 0); err != nil {
		t.Errorf("empty chart: %v", err)
	}
}

// svgDoc is what the tests learn from decoding an SVG.
type svgDoc struct {
	width, height float64
	spans         int // <rect class="span">
	spanTitles    int // <title> directly inside a span rect
	legend        int // <rect class="legend">
	texts         []string
}

func parseSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	d := xml.NewDecoder(bytes.NewReader(data))
	var stack []string // element names with class, e.g. "rect.span"
	inText := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			name := tok.Name.Local
			for _, a := range tok.Attr {
				switch {
				case a.Name.Local == "class":
					name += "." + a.Value
				case name == "svg" && a.Name.Local == "width":
					doc.width, _ = strconv.ParseFloat(a.Value, 64)
				case name == "svg" && a.Name.Local == "height":
					doc.height, _ = strconv.ParseFloat(a.Value, 64)
				case a.Name.Local == "href":
					t.Errorf("SVG links to %q", a.Value)
				}
			}
			switch name {
			case "rect.span":
				doc.spans++
			case "rect.legend":
				doc.legend++
			case "title":
				if len(stack) > 0 && stack[len(stack)-1] == "rect.span" {
					doc.spanTitles++
				}
			case "script", "image", "foreignObject", "style":
				t.Errorf("SVG has <%s>", name)
			}
			if tok.Name.Local == "text" {
				inText = true
				doc.texts = append(doc.texts, "")
			}
			stack = append(stack, name)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
			inText = false
		case xml.CharData:
			if inText {
				doc.texts[len(doc.texts)-1] += string(tok)
			}
		}
	}
	return doc
}

func renderSVG(t *testing.T, c *Chart) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.SVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSVGStructure(t *testing.T) {
	c := small()
	c.Rows[0].Name = `stage <0> & "co"`
	c.Title = "a <b> & c"
	c.Arrows = []Arrow{{FromRow: 0, FromTime: 2, ToRow: 1, ToTime: 2}}
	out := renderSVG(t, c)
	doc := parseSVG(t, out)
	n := len(c.Rows[0].Spans) + len(c.Rows[1].Spans)
	if doc.spans != n {
		t.Errorf("%d span rects, want %d", doc.spans, n)
	}
	if doc.spanTitles != n {
		t.Errorf("%d span titles, want %d", doc.spanTitles, n)
	}
	// F, B, I, W, OPT and the hatch swatch for chunk > 0.
	if doc.legend != 6 {
		t.Errorf("%d legend swatches, want 6", doc.legend)
	}
	s := string(out)
	if strings.Contains(s, "stage <0>") || !strings.Contains(s, "stage &lt;0&gt; &amp; &#34;co&#34;") {
		t.Error("row name not escaped")
	}
	if strings.Contains(s, "a <b>") {
		t.Error("title not escaped")
	}
	for _, want := range []string{
		"stage 1 F mb 1 chunk 0: 4.0-6.0 ms",
		"stage 1 B mb 0 chunk 1: 6.0-10.0 ms",
		"bubble 25.0%", "bubble 40.0%", "time (ms)",
		`marker-end="url(#arrowhead)"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// Box labels when they fit: default labels, lowercase for chunk > 0.
	texts := strings.Join(doc.texts, "|")
	for _, want := range []string{"|F0|", "|f0|", "|b0|", "|W0|"} {
		if !strings.Contains("|"+texts+"|", want) {
			t.Errorf("box label %q missing from %q", want, texts)
		}
	}
	if doc.width < minSVGWidth || doc.width > MaxSVGWidth {
		t.Errorf("width %v outside [%d, %d]", doc.width, minSVGWidth, MaxSVGWidth)
	}
}

func TestSVGControlCharacters(t *testing.T) {
	c := &Chart{Rows: []Row{{Name: "bad\x00\x1bname\n<&>", Note: "\x07", Spans: []Span{{Start: 0, End: 1, Kind: "x\x01<y>", Label: "l\x02&"}}}}}
	out := renderSVG(t, c)
	parseSVG(t, out)
	if !bytes.Contains(out, []byte("&lt;&amp;&gt;")) {
		t.Error("name not escaped")
	}
}

func TestSVGManySpansWidthCap(t *testing.T) {
	c := &Chart{Title: "10k", Unit: "ms"}
	const rows, per = 4, 2500
	for r := 0; r < rows; r++ {
		row := Row{Name: fmt.Sprintf("stage %d", r), Note: "bubble 1.0%"}
		for i := 0; i < per; i++ {
			k := Forward
			if i%2 == 1 {
				k = Backward
			}
			row.Spans = append(row.Spans, Span{Start: float64(i) + float64(r)*0.5, End: float64(i) + float64(r)*0.5 + 0.9, Kind: k, MicroBatch: i / 2, Chunk: i % 3})
		}
		c.Rows = append(c.Rows, row)
	}
	doc := parseSVG(t, renderSVG(t, c))
	if doc.width > MaxSVGWidth || doc.width <= 0 {
		t.Errorf("width %v, want (0, %d]", doc.width, MaxSVGWidth)
	}
	if doc.spans != rows*per || doc.spanTitles != rows*per {
		t.Errorf("%d rects, %d titles, want %d", doc.spans, doc.spanTitles, rows*per)
	}
}

func TestSVGWidthAdapts(t *testing.T) {
	few := &Chart{Rows: []Row{{Name: "s", Spans: []Span{{Start: 0, End: 1, Kind: Forward}}}}}
	many := &Chart{Rows: []Row{{Name: "s"}}}
	for i := 0; i < 40; i++ {
		many.Rows[0].Spans = append(many.Rows[0].Spans, Span{Start: float64(i), End: float64(i) + 1, Kind: Forward, MicroBatch: i})
	}
	wf, wm := parseSVG(t, renderSVG(t, few)).width, parseSVG(t, renderSVG(t, many)).width
	if !(wf >= minSVGWidth && wm > wf && wm <= MaxSVGWidth) {
		t.Errorf("widths: 1 span %v, 40 spans %v", wf, wm)
	}
}

func TestSVGErrorsAndEdges(t *testing.T) {
	for name, c := range map[string]*Chart{
		"end before start": {Rows: []Row{{Spans: []Span{{Start: 2, End: 1}}}}},
		"NaN":              {Rows: []Row{{Spans: []Span{{Start: math.NaN(), End: 1}}}}},
		"arrow row":        {Rows: []Row{{}}, Arrows: []Arrow{{FromRow: 0, ToRow: 1}}},
	} {
		if err := c.SVG(io.Discard); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	for name, c := range map[string]*Chart{
		"empty":       {},
		"no spans":    {Rows: []Row{{Name: "a"}, {Name: "b"}}},
		"zero length": {Rows: []Row{{Name: "a", Spans: []Span{{Start: 5, End: 5, Kind: Forward}}}}},
		"negative":    {Rows: []Row{{Name: "a", Spans: []Span{{Start: -3, End: -1, Kind: Forward}}}}},
		"long names":  {Rows: []Row{{Name: strings.Repeat("n", 500), Note: strings.Repeat("m", 500), Spans: []Span{{Start: 0, End: 1}}}}},
	} {
		doc := parseSVG(t, renderSVG(t, c))
		if doc.width > MaxSVGWidth {
			t.Errorf("%s: width %v", name, doc.width)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for in, want := range map[float64]float64{0.85: 1, 1: 1, 1.01: 2, 2.125: 5, 7: 10, 0.003: 0.005, 120: 200} {
		if got := niceStep(in); math.Abs(got-want) > 1e-12 {
			t.Errorf("niceStep(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestExampleSVG renders a realistic chart: interleaved 1F1B (4 stages, 2
// chunks per stage, 8 micro-batches) followed by the optimizer, with the
// sends of micro-batch 0 as arrows. It writes to $TIMELINE_EXAMPLE_SVG if
// set (e.g. /tmp/timeline-example.svg, to look at in a browser), else to a
// temporary directory.
func TestExampleSVG(t *testing.T) {
	c := interleavedExample(t)
	path := os.Getenv("TIMELINE_EXAMPLE_SVG")
	if path == "" {
		path = filepath.Join(t.TempDir(), "timeline-example.svg")
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SVG(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, data)
	var b strings.Builder
	if err := c.Text(&b, 0, 120); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s\n%s", path, b.String())
}

// interleavedExample simulates Megatron-style interleaved 1F1B and returns
// its timeline.
func interleavedExample(t *testing.T) *Chart {
	const (
		p, v, m         = 4, 2, 8
		tf, tb, tc, top = 1.2, 2.4, 0.15, 0.8 // forward, backward, comm, optimizer (ms)
	)
	type act struct {
		bwd       bool
		mb, chunk int
	}
	orders := make([][]act, p)
	for s := 0; s < p; s++ {
		total := m * v
		warm := min((p-s-1)*2+(v-1)*p, total)
		fwd := func(k int) act { return act{false, k/(p*v)*p + k%p, k % (p * v) / p} }
		bwd := func(k int) act { return act{true, k/(p*v)*p + k%p, v - 1 - k%(p*v)/p} }
		var o []act
		for k := 0; k < warm; k++ {
			o = append(o, fwd(k))
		}
		for k := 0; k < total-warm; k++ {
			o = append(o, fwd(warm+k), bwd(k))
		}
		for k := total - warm; k < total; k++ {
			o = append(o, bwd(k))
		}
		orders[s] = o
	}
	type key struct {
		bwd          bool
		mb, chunk, s int
	}
	end := map[key]float64{}
	free := make([]float64, p)
	next := make([]int, p)
	c := &Chart{Title: "interleaved 1F1B: 4 stages x 2 chunks, 8 micro-batches (simulated)", Unit: "ms"}
	for s := 0; s < p; s++ {
		c.Rows = append(c.Rows, Row{Name: fmt.Sprintf("stage %d", s)})
	}
	for progress := true; progress; {
		progress = false
		for s := 0; s < p; s++ {
			if next[s] == len(orders[s]) {
				continue
			}
			a := orders[s][next[s]]
			var dep key
			var hasDep, remote bool
			switch {
			case !a.bwd && s > 0:
				dep, hasDep, remote = key{false, a.mb, a.chunk, s - 1}, true, true
			case !a.bwd && a.chunk > 0:
				dep, hasDep, remote = key{false, a.mb, a.chunk - 1, p - 1}, true, true
			case a.bwd && s < p-1:
				dep, hasDep, remote = key{true, a.mb, a.chunk, s + 1}, true, true
			case a.bwd && a.chunk < v-1:
				dep, hasDep, remote = key{true, a.mb, a.chunk + 1, 0}, true, true
			case a.bwd:
				dep, hasDep = key{false, a.mb, a.chunk, s}, true
			}
			start := free[s]
			if hasDep {
				e, ok := end[dep]
				if !ok {
					continue
				}
				if remote {
					e += tc
				}
				start = math.Max(start, e)
				if remote && a.mb == 0 {
					c.Arrows = append(c.Arrows, Arrow{FromRow: dep.s, FromTime: end[dep], ToRow: s, ToTime: start})
				}
			}
			d, k := tf, Forward
			if a.bwd {
				d, k = tb, Backward
			}
			end[key{a.bwd, a.mb, a.chunk, s}] = start + d
			free[s] = start + d
			c.Rows[s].Spans = append(c.Rows[s].Spans, Span{Start: start, End: start + d, Kind: k, MicroBatch: a.mb, Chunk: a.chunk})
			next[s]++
			progress = true
		}
	}
	flush := 0.0
	for s := 0; s < p; s++ {
		if next[s] != len(orders[s]) {
			t.Fatalf("schedule deadlocked at stage %d action %d", s, next[s])
		}
		flush = math.Max(flush, free[s])
	}
	for s := range c.Rows {
		c.Rows[s].Spans = append(c.Rows[s].Spans, Span{Start: flush, End: flush + top, Kind: Optimizer, MicroBatch: -1})
		busy := float64(m*v)*(tf+tb) + top
		c.Rows[s].Note = fmt.Sprintf("bubble %.1f%%", 100*(1-busy/(flush+top)))
	}
	return c
}

// withAllReduce is small with an all-reduce under each row, one of them
// overlapping the row's backward.
func withAllReduce() *Chart {
	c := small()
	c.Rows[0].Spans = append(c.Rows[0].Spans, Span{Start: 11, End: 16, Kind: AllReduce, Step: 3, Detail: "exposed 2.0 ms"})
	c.Rows[1].Spans = append(c.Rows[1].Spans, Span{Start: 13, End: 15, Kind: AllReduce, Chunk: 1})
	return c
}

// TestTextAllReduce: all-reduces get a line of their own under their row,
// so they may overlap its compute, which stays as it was.
func TestTextAllReduce(t *testing.T) {
	var b strings.Builder
	if err := withAllReduce().Text(&b, 1, 0); err != nil {
		t.Fatal(err)
	}
	want := `demo
              0         10
ms            +---------+------
stage 0       FFFFff....BBBB..O  bubble 25.0%
  all-reduce             AAAAA
stage 1       ..FFFFbbbbIIWW..O  bubble 40.0%
  all-reduce               aa
key: F=forward, B=backward, I=input-grad backward, W=weight-grad backward, O=optimizer, A=all-reduce (lane under its row), lowercase=chunk>0, .=idle; 1 column = 1 ms
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestSVGAllReduce: an all-reduce is a thin bar in a lane under its row, in
// the legend, with its details in its tooltip; the rows below move down to
// make room.
func TestSVGAllReduce(t *testing.T) {
	c := withAllReduce()
	out := string(renderSVG(t, c))
	doc := parseSVG(t, []byte(out))
	plain := string(renderSVG(t, small()))
	if doc.spans != 13 || strings.Count(out, `class="beside-lane"`) != 2 || strings.Count(plain, `beside-lane`) != 0 {
		t.Errorf("%d spans, %d all-reduce lanes", doc.spans, strings.Count(out, `class="beside-lane"`))
	}
	for _, want := range []string{
		"AR all-reduce (lane under its row)",
		"stage 0 AR chunk 0 step 3 (exposed 2.0 ms): 11.0-16.0 ms",
		"stage 1 AR chunk 1: 13.0-15.0 ms",
		">all-reduce</text>",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// The bars sit in the lanes under the rows: below row 0's boxes and
	// above row 1's, which moved down by a lane.
	t0, t1, err := c.bounds()
	if err != nil {
		t.Fatal(err)
	}
	l := c.layout(t0, t1)
	l.lanesY = 0
	l.rows(c.Rows)
	if l.tops[1] != laneH+besideLaneH || l.tops[2] != 2*(laneH+besideLaneH) {
		t.Errorf("rows at %v", l.tops)
	}
	if y := l.besideTop(0, AllReduce); y < l.boxTop(0)+boxH || y+besideLaneH > l.boxTop(1) {
		t.Errorf("row 0's all-reduce lane at %v, between %v and %v", y, l.boxTop(0)+boxH, l.boxTop(1))
	}
}
