package timeline

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxSVGWidth is the widest SVG drawn, in pixels: past it time is scaled down.
const MaxSVGWidth = 1600

// Layout of the SVG, in pixels.
const (
	minSVGWidth  = 640
	svgPad       = 16
	laneH        = 28   // row pitch
	boxH         = 20   // box height inside a row
	sendH        = 5    // height of a SEND bar (drawn at a box's bottom edge)
	besideLaneH  = 12   // pitch of a lane under a row for spans beside its work (AllReduce)
	besideH      = 8    // height of a bar in such a lane
	charW        = 7.0  // rough width of a 12px character
	boxCharW     = 6.6  // rough width of an 11px character
	boxPx        = 30.0 // target width of a typical box
	maxSideChars = 36   // names and notes are cut to this many characters
	fontFamily   = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
)

// svgLayout holds the geometry of one drawing.
type svgLayout struct {
	t0, t1       float64
	plotX, plotW float64 // plot area, horizontally
	scale        float64 // pixels per time unit
	lanesY       float64 // top of the first lane
	width        float64
	tick         float64 // axis tick step, in time units
	dec          int     // decimals for times in tooltips
	// tops[i] is the top of row i's lane, tops[len(rows)] the end of the
	// last row; subs[i] are the kinds drawn in lanes under row i.
	tops []float64
	subs [][]Kind
}

func (l *svgLayout) x(t float64) float64 { return l.plotX + (t-l.t0)*l.scale }

func (l *svgLayout) boxTop(row int) float64 {
	return l.tops[row] + (laneH-boxH)/2
}

// rows lays the rows out from lanesY down: each a lane of laneH, and under
// it a lane of besideLaneH for each kind of its spans drawn beside its work.
func (l *svgLayout) rows(rows []Row) {
	l.tops, l.subs = make([]float64, len(rows)+1), make([][]Kind, len(rows))
	y := l.lanesY
	for i := range rows {
		l.tops[i] = y
		l.subs[i] = rows[i].besidePresent()
		y += laneH + float64(len(l.subs[i]))*besideLaneH
	}
	l.tops[len(rows)] = y
}

// besideTop is the top of the lane under row for spans of kind k.
func (l *svgLayout) besideTop(row int, k Kind) float64 {
	y := l.tops[row] + laneH
	for _, s := range l.subs[row] {
		if s == k {
			break
		}
		y += besideLaneH
	}
	return y
}

// SVG writes the chart as a self-contained SVG document (no scripts, no
// external fonts or links) to open in a browser.
//
// Time runs left to right on an axis labelled in Chart.Unit with 1-2-5 tick
// spacing; each row is a lane with its name on the left and its Note on the
// right. Each span is a box coloured by kind, hatched and lighter for
// chunk > 0, with its label ("F3", "f3") or just the micro-batch number inside
// when it fits, and a tooltip ("stage 1 F mb 3 chunk 0: 12.0-15.5 ms"). SEND
// spans are thin bars along the bottom of the lane so that they can overlap
// compute; WAIT spans are pale grey. AR spans run beside the row's work:
// they are bars in a thin lane of their own under the row ("all-reduce"). Idle time is left blank, so bubbles show
// as gaps. A legend lists the kinds present, and Arrows are drawn on top.
//
// The width grows with the number of boxes to keep a typical box readable,
// up to MaxSVGWidth pixels; past that time is scaled down.
func (c *Chart) SVG(w io.Writer) error {
	t0, t1, err := c.bounds()
	if err != nil {
		return err
	}
	l := c.layout(t0, t1)
	kinds, _ := c.kindsPresent()
	kindIdx := map[Kind]int{}
	for i, k := range kinds {
		kindIdx[k] = i
	}

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	y := float64(svgPad)
	titleY := 0.0
	if c.Title != "" {
		titleY = y + 15
		y += 28
	}
	axisY := y + 12 // baseline of the tick labels
	l.lanesY = y + 20
	l.rows(c.Rows)
	lanesEnd := l.tops[len(c.Rows)]
	hatches := c.hatchesUsed(kindIdx)
	legendItems := c.legendItems(kinds, hatches)
	legendY, height := layoutLegend(legendItems, l, lanesEnd)

	p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %[1]s %[2]s" font-family="%s" font-size="12" fill="#1f2937">`+"\n",
		num(l.width), num(height), esc(fontFamily))
	p("<title>%s</title>\n", esc(orDefault(c.Title, "pipeline timeline")))

	// Hatch patterns for chunk > 0: one per kind and chunk parity (the stripes
	// lean one way for odd chunks and the other way for even ones).
	p("<defs>\n")
	p(`<marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="#374151"/></marker>` + "\n")
	for _, h := range hatches {
		fill := styleOf(kinds[h[0]]).fill
		angle := 45
		if h[1] == 0 {
			angle = -45
		}
		p(`<pattern id="h%d_%d" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(%d)"><path d="M0 0h6v6h-6z" fill="%s"/><path d="M1.5 0v6" stroke="%s" stroke-width="3"/></pattern>`+"\n",
			h[0], h[1], angle, lighten(fill, 0.6), lighten(fill, 0.15))
	}
	p("</defs>\n")
	p(`<rect class="bg" width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	if c.Title != "" {
		p(`<text x="%d" y="%s" font-size="15" font-weight="600">%s</text>`+"\n", svgPad, num(titleY), esc(oneLine(c.Title)))
	}

	// Axis: ticks, labels and vertical grid lines across the lanes.
	p(`<g class="axis" font-size="11" fill="#4b5563">` + "\n")
	unit := "time"
	if c.Unit != "" {
		unit = "time (" + oneLine(c.Unit) + ")"
	}
	p(`<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", num(l.plotX-10), num(axisY), esc(unit))
	tickDec := decimals(l.tick)
	first := math.Ceil(l.t0/l.tick-1e-9) * l.tick
	for i := 0; ; i++ {
		t := first + float64(i)*l.tick
		if t > l.t1+l.tick*1e-9 {
			break
		}
		x := l.x(t)
		label := formatNum(t, tickDec)
		anchor := "middle"
		if x-float64(len(label))*3.5 < l.plotX-3 { // keep clear of the unit on the left
			anchor = "start"
		}
		p(`<path d="M%s %sV%s" stroke="#e2e5ea" stroke-width="1"/>`, num(x), num(axisY+4), num(lanesEnd))
		p(`<text x="%s" y="%s" text-anchor="%s">%s</text>`+"\n", num(x), num(axisY), anchor, label)
	}
	p("</g>\n")

	// Lanes, names and notes.
	p(`<g class="lanes">` + "\n")
	for i, r := range c.Rows {
		top := l.tops[i]
		mid := num(top + laneH/2 + 4)
		p(`<rect class="lane" x="%s" y="%s" width="%s" height="%d" fill="#f3f4f6" fill-opacity="0.8"/>`, num(l.plotX), num(top+1), num(l.plotW), laneH-2)
		p(`<text x="%s" y="%s" text-anchor="end" font-weight="500">%s</text>`, num(l.plotX-10), mid, esc(cut(oneLine(r.Name))))
		if r.Note != "" {
			p(`<text x="%s" y="%s" fill="#4b5563">%s</text>`, num(l.plotX+l.plotW+10), mid, esc(cut(oneLine(r.Note))))
		}
		for _, k := range l.subs[i] {
			sub := l.besideTop(i, k)
			p(`<rect class="beside-lane" x="%s" y="%s" width="%s" height="%d" fill="#f9fafb"/>`, num(l.plotX), num(sub), num(l.plotW), besideLaneH-1)
			p(`<text x="%s" y="%s" text-anchor="end" font-size="10" fill="#6b7280">%s</text>`, num(l.plotX-10), num(sub+besideLaneH-3), esc(besideName(k)))
		}
		p("\n")
	}
	p("</g>\n")

	// Boxes: waits first, then compute, then sends on top.
	for i, r := range c.Rows {
		order := make([]int, len(r.Spans))
		for j := range order {
			order[j] = j
		}
		sort.SliceStable(order, func(a, b int) bool { return drawRank(r.Spans[order[a]].Kind) < drawRank(r.Spans[order[b]].Kind) })
		p(`<g class="row">` + "\n")
		for _, j := range order {
			c.writeBox(bw, l, i, r.Spans[j], kindIdx[r.Spans[j].Kind])
		}
		p("</g>\n")
	}

	if len(c.Arrows) > 0 {
		p(`<g class="arrows" stroke="#374151" stroke-width="1.1" stroke-opacity="0.75" fill="none" marker-end="url(#arrowhead)">` + "\n")
		for _, a := range c.Arrows {
			y1, y2 := l.boxTop(a.FromRow)+boxH/2, l.boxTop(a.ToRow)+boxH/2
			switch {
			case a.ToRow > a.FromRow:
				y1, y2 = l.boxTop(a.FromRow)+boxH, l.boxTop(a.ToRow)
			case a.ToRow < a.FromRow:
				y1, y2 = l.boxTop(a.FromRow), l.boxTop(a.ToRow)+boxH
			}
			p(`<path d="M%s %sL%s %s"/>`+"\n", num(l.x(a.FromTime)), num(y1), num(l.x(a.ToTime)), num(y2))
		}
		p("</g>\n")
	}

	writeLegend(bw, legendItems, l, legendY)
	p("</svg>\n")
	return bw.Flush()
}

// drawRank orders boxes within a row: waits underneath, then compute, then
// SEND bars on top (they are thin, so compute under them stays visible).
func drawRank(k Kind) int {
	switch k {
	case Wait:
		return 0
	case Send:
		return 2
	}
	return 1
}

// layout picks the horizontal geometry: margins from the longest name and
// note, and a time scale that gives a typical (median) box about boxPx
// pixels, within [minSVGWidth, MaxSVGWidth] overall.
func (c *Chart) layout(t0, t1 float64) *svgLayout {
	nameChars, noteChars := len("time (ms)"), 0
	var durs []float64
	for _, r := range c.Rows {
		nameChars = max(nameChars, min(utf8.RuneCountInString(r.Name), maxSideChars))
		noteChars = max(noteChars, min(utf8.RuneCountInString(r.Note), maxSideChars))
		for _, s := range r.Spans {
			// A collective beside the work may last far longer than a box:
			// the boxes set the scale.
			if s.End > s.Start && !beside(s.Kind) {
				durs = append(durs, s.End-s.Start)
			}
		}
	}
	leftW := float64(nameChars)*charW + 20
	rightW := float64(svgPad)
	if noteChars > 0 {
		rightW = float64(noteChars)*charW + 20
	}
	fixed := 2*svgPad + leftW + rightW
	want := 0.0
	if len(durs) > 0 {
		sort.Float64s(durs)
		want = (t1 - t0) / durs[len(durs)/2] * boxPx
	}
	plotW := math.Min(math.Max(want, minSVGWidth-fixed), MaxSVGWidth-fixed)
	plotW = math.Max(plotW, 100) // absurdly long names: still draw something
	l := &svgLayout{t0: t0, t1: t1, plotX: svgPad + leftW, plotW: math.Round(plotW)}
	l.scale = l.plotW / (t1 - t0)
	l.width = math.Round(fixed + l.plotW)
	l.tick = niceStep((t1 - t0) / math.Max(2, math.Floor(l.plotW/90)))
	// Tick labels must not collide: widen the step until they fit.
	for {
		d := decimals(l.tick)
		w := float64(max(len(formatNum(t0, d)), len(formatNum(t1, d)))) * 6.2
		if w+12 <= l.tick*l.scale {
			break
		}
		l.tick = niceStep(l.tick * 1.5)
	}
	l.dec = max(decimals(l.tick)+1, 1)
	return l
}

// writeBox draws one span.
func (c *Chart) writeBox(bw *bufio.Writer, l *svgLayout, row int, s Span, ki int) {
	st := styleOf(s.Kind)
	x0, x1 := l.x(s.Start), l.x(s.End)
	w := math.Max(x1-x0, 0.5)
	y, h := l.boxTop(row), float64(boxH)
	switch {
	case s.Kind == Send:
		y, h = y+boxH-sendH, sendH
	case beside(s.Kind):
		y, h = l.besideTop(row, s.Kind)+(besideLaneH-1-besideH)/2, besideH
	}
	fill := st.fill
	if s.Kind == Wait {
		fill = lighten(fill, 0.35)
	}
	if s.Chunk > 0 {
		if w >= 4 {
			fill = fmt.Sprintf("url(#h%d_%d)", ki, s.Chunk%2)
		} else { // too narrow for stripes, which would only shimmer
			fill = lighten(st.fill, 0.45)
		}
	}
	fmt.Fprintf(bw, `<rect class="span" x="%s" y="%s" width="%s" height="%s" fill="%s"`, num(x0), num(y), num(w), num(h), fill)
	if w >= 3 {
		fmt.Fprintf(bw, ` stroke="#ffffff" stroke-width="0.75"`)
	}
	if w >= 8 && h >= boxH {
		fmt.Fprintf(bw, ` rx="2"`)
	}
	fmt.Fprintf(bw, "><title>%s</title></rect>", esc(c.tooltip(l, row, s)))

	// Box text: the label, else just the micro-batch number, if it fits.
	text := s.Label
	if text == "" {
		text = defaultLabel(s)
		if s.Kind != Optimizer && s.Kind != Wait && float64(len(text))*boxCharW+4 > w {
			text = strconv.Itoa(s.MicroBatch)
		}
	}
	if text != "" && h >= boxH && float64(utf8.RuneCountInString(text))*boxCharW+4 <= w {
		cx, cy := num(x0+w/2), num(y+h/2+4)
		if s.Chunk > 0 {
			fmt.Fprintf(bw, `<text x="%s" y="%s" text-anchor="middle" font-size="11" font-weight="600" fill="#111827" stroke="#ffffff" stroke-width="2.5" stroke-opacity="0.85" paint-order="stroke" pointer-events="none">%s</text>`, cx, cy, esc(oneLine(text)))
		} else {
			textFill := "#ffffff"
			if s.Kind == Wait {
				textFill = "#374151"
			}
			fmt.Fprintf(bw, `<text x="%s" y="%s" text-anchor="middle" font-size="11" font-weight="600" fill="%s" pointer-events="none">%s</text>`, cx, cy, textFill, esc(oneLine(text)))
		}
	}
	bw.WriteByte('\n')
}

// tooltip is a box's hover text: "stage 1 F mb 3 chunk 0: 12.0-15.5 ms".
func (c *Chart) tooltip(l *svgLayout, row int, s Span) string {
	var b strings.Builder
	b.WriteString(oneLine(c.Rows[row].Name))
	if beside(s.Kind) { // no micro-batch: it runs for the whole step's
		fmt.Fprintf(&b, " %s chunk %d", oneLine(string(s.Kind)), s.Chunk)
	} else {
		fmt.Fprintf(&b, " %s mb %d chunk %d", oneLine(string(s.Kind)), s.MicroBatch, s.Chunk)
	}
	if s.Step != 0 {
		fmt.Fprintf(&b, " step %d", s.Step)
	}
	if s.Label != "" {
		fmt.Fprintf(&b, " (%s)", oneLine(s.Label))
	}
	if s.Detail != "" {
		fmt.Fprintf(&b, " (%s)", oneLine(s.Detail))
	}
	fmt.Fprintf(&b, ": %s-%s", formatNum(s.Start, l.dec), formatNum(s.End, l.dec))
	if c.Unit != "" {
		b.WriteString(" " + oneLine(c.Unit))
	}
	return b.String()
}

// hatchesUsed lists the (kind index, chunk parity) pairs that some span with
// chunk > 0 uses, sorted; each gets a hatch pattern.
func (c *Chart) hatchesUsed(kindIdx map[Kind]int) [][2]int {
	seen := map[[2]int]bool{}
	var out [][2]int
	for _, r := range c.Rows {
		for _, s := range r.Spans {
			h := [2]int{kindIdx[s.Kind], s.Chunk % 2}
			if s.Chunk > 0 && !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] > out[j][1]
	})
	return out
}

// legendItem is one swatch and its text.
type legendItem struct {
	fill, text string
	w          float64
}

func (c *Chart) legendItems(kinds []Kind, hatches [][2]int) []legendItem {
	var items []legendItem
	add := func(fill, text string) {
		items = append(items, legendItem{fill, text, 14 + 6 + float64(utf8.RuneCountInString(text))*6.4 + 18})
	}
	for _, k := range kinds {
		st := styleOf(k)
		fill := st.fill
		if k == Wait {
			fill = lighten(fill, 0.35)
		}
		text := st.desc
		if st.desc != string(k) {
			text = string(k) + " " + st.desc
		}
		add(fill, text)
	}
	if len(hatches) > 0 {
		add(fmt.Sprintf("url(#h%d_%d)", hatches[0][0], hatches[0][1]), "chunk > 0 (lighter, hatched)")
	}
	return items
}

// layoutLegend returns the y of the legend's first line and the height of the
// whole drawing.
func layoutLegend(items []legendItem, l *svgLayout, lanesEnd float64) (y, height float64) {
	y = lanesEnd + 16
	lines := 1
	x := l.plotX
	for _, it := range items {
		if x+it.w > l.width-svgPad && x > l.plotX {
			lines++
			x = l.plotX
		}
		x += it.w
	}
	return y, y + float64(lines)*18 + svgPad
}

func writeLegend(bw *bufio.Writer, items []legendItem, l *svgLayout, y float64) {
	fmt.Fprintf(bw, `<g class="legend" font-size="11" fill="#374151">`+"\n")
	fmt.Fprintf(bw, `<text x="%s" y="%s" text-anchor="end" fill="#6b7280">blank = idle</text>`+"\n", num(l.plotX-10), num(y+10))
	x := l.plotX
	for _, it := range items {
		if x+it.w > l.width-svgPad && x > l.plotX {
			y += 18
			x = l.plotX
		}
		fmt.Fprintf(bw, `<rect class="legend" x="%s" y="%s" width="14" height="12" rx="2" fill="%s"/><text x="%s" y="%s">%s</text>`+"\n",
			num(x), num(y+1), it.fill, num(x+20), num(y+11), esc(it.text))
		x += it.w
	}
	fmt.Fprintf(bw, "</g>\n")
}

// lighten mixes a #rrggbb colour with white; f = 0 keeps it, 1 gives white.
func lighten(hex string, f float64) string {
	v, err := strconv.ParseUint(strings.TrimPrefix(hex, "#"), 16, 32)
	if err != nil || len(hex) != 7 {
		return hex
	}
	mix := func(c uint64) int { return int(math.Round(float64(c) + (255-float64(c))*f)) }
	return fmt.Sprintf("#%02x%02x%02x", mix(v>>16&0xff), mix(v>>8&0xff), mix(v&0xff))
}

// num prints a coordinate with at most two decimals.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// esc escapes text for XML character data and attribute values; characters
// XML cannot hold become U+FFFD.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder never fail
	return b.String()
}

// cut shortens s to maxSideChars characters, marking the cut with an ellipsis.
func cut(s string) string {
	if utf8.RuneCountInString(s) <= maxSideChars {
		return s
	}
	r := []rune(s)
	return string(r[:maxSideChars-1]) + "…"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
