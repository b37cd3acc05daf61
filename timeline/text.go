package timeline

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxTextColumns bounds Text's grid so that a tiny slot cannot exhaust memory.
const maxTextColumns = 1 << 20

// defaultTextWidth is the column budget when Text is given width <= 0.
const defaultTextWidth = 100

// Text renders the chart as rows of characters, one character per time slot
// of width slot. When slot <= 0 it is chosen automatically: the chart's time
// range divided into at most width columns (100 when width <= 0), rounded up
// to 1, 2 or 5 times a power of ten so that the ruler reads well. When
// slot > 0, width is ignored.
//
// A slot's character is that of the span covering the slot's midpoint: the
// kind's letter ('F', 'B', 'I', 'W', 'O' for OPT, 'S' for SEND, '-' for WAIT,
// the first letter, upper-cased, for other kinds), lowercase for chunk > 0,
// and '.' for idle. Where spans overlap, compute wins over SEND and SEND over
// WAIT. AR spans run beside the row's work: they get a line of their own
// under the row ("  all-reduce", 'A', blank where none is in progress). Above the rows is a ruler in Chart.Unit; each row ends with its Note;
// a key of the letters used closes the picture.
func (c *Chart) Text(w io.Writer, slot float64, width int) error {
	t0, t1, err := c.bounds()
	if err != nil {
		return err
	}
	if math.IsNaN(slot) || math.IsInf(slot, 0) {
		return fmt.Errorf("timeline: invalid slot %v", slot)
	}
	auto := slot <= 0
	if auto {
		if width <= 0 {
			width = defaultTextWidth
		}
		slot = niceStep((t1 - t0) / float64(width))
	}
	var start float64
	var cols int
	for {
		start = math.Floor(t0/slot) * slot
		n := math.Ceil((t1-start)/slot - 1e-9)
		if n > maxTextColumns {
			return fmt.Errorf("timeline: slot %v gives %.0f columns (limit %d)", slot, n, maxTextColumns)
		}
		cols = max(int(n), 1)
		if !auto || cols <= width {
			break
		}
		slot = niceStep(slot * 1.5) // aligning start cost a column: next nice step
	}

	// The grid: one rune per slot, with the layer that wrote it; under a
	// row, a line of its own for each kind drawn beside its work.
	fill := func(spans []Span, idle rune, keep func(Kind) bool) []rune {
		line := make([]rune, cols)
		lay := make([]int8, cols)
		for j := range line {
			line[j] = idle
		}
		for _, s := range spans {
			if !keep(s.Kind) {
				continue
			}
			ch := styleOf(s.Kind).letter
			if s.Chunk > 0 {
				ch = unicode.ToLower(ch)
			}
			l := int8(layer(s.Kind))
			// Slots whose midpoint start+(j+0.5)*slot lies in [Start, End).
			from := max(int(math.Ceil((s.Start-start)/slot-0.5)), 0)
			to := min(int(math.Ceil((s.End-start)/slot-0.5)), cols)
			for j := from; j < to; j++ {
				if l > lay[j] {
					line[j], lay[j] = ch, l
				}
			}
		}
		return line
	}
	grid := make([][]rune, len(c.Rows))
	subs := make([][]Kind, len(c.Rows))
	subGrid := make([][][]rune, len(c.Rows))
	for i, r := range c.Rows {
		grid[i] = fill(r.Spans, '.', func(k Kind) bool { return !beside(k) })
		subs[i] = r.besidePresent()
		for _, k := range subs[i] {
			// Blank, not '.': no collective in progress is not idle time.
			subGrid[i] = append(subGrid[i], fill(r.Spans, ' ', func(s Kind) bool { return s == k }))
		}
	}
	subName := func(k Kind) string { return "  " + besideName(k) }

	// Ruler: a label every `every` columns, where every is the first of 10,
	// 20, 50, ... columns wide enough for the longest label.
	d := decimals(10 * slot)
	label := func(col int) string { return formatNum(start+float64(col)*slot, d) }
	longest := 0
	for col := 0; col <= cols; col += 10 {
		longest = max(longest, len(label(col)))
	}
	every := 10
	for every < longest+1 {
		every = int(niceStep(float64(every) * 1.5))
	}
	d = decimals(float64(every) * slot)

	nameW := utf8.RuneCountInString(c.Unit)
	for i, r := range c.Rows {
		nameW = max(nameW, utf8.RuneCountInString(oneLine(r.Name)))
		for _, k := range subs[i] {
			nameW = max(nameW, utf8.RuneCountInString(subName(k)))
		}
	}
	pad := func(s string) string {
		return s + strings.Repeat(" ", nameW-utf8.RuneCountInString(s)) + "  "
	}

	bw := bufio.NewWriter(w)
	if c.Title != "" {
		fmt.Fprintln(bw, oneLine(c.Title))
	}
	var labels, ticks strings.Builder
	for col := 0; col <= cols; col++ {
		if col%every == 0 {
			ticks.WriteByte('+')
		} else if col < cols {
			ticks.WriteByte('-')
		}
	}
	for col := 0; col <= cols; col += every {
		if n := labels.Len(); n < col {
			labels.WriteString(strings.Repeat(" ", col-n))
		} else if n > col { // no room (only at the very start); skip
			continue
		}
		labels.WriteString(label(col))
	}
	fmt.Fprintln(bw, pad("")+labels.String())
	fmt.Fprintln(bw, pad(oneLine(c.Unit))+ticks.String())
	for i, r := range c.Rows {
		line := pad(oneLine(r.Name)) + string(grid[i])
		if r.Note != "" {
			line += "  " + oneLine(r.Note)
		}
		fmt.Fprintln(bw, strings.TrimRight(line, " "))
		for j, k := range subs[i] {
			fmt.Fprintln(bw, strings.TrimRight(pad(subName(k))+string(subGrid[i][j]), " "))
		}
	}
	fmt.Fprintln(bw, c.textKey(slot, decimals(slot)))
	return bw.Flush()
}

// textKey is the closing line: the letters used and the slot width.
func (c *Chart) textKey(slot float64, d int) string {
	kinds, hatched := c.kindsPresent()
	var parts []string
	for _, k := range kinds {
		st := styleOf(k)
		parts = append(parts, string(st.letter)+"="+st.desc)
	}
	if hatched {
		parts = append(parts, "lowercase=chunk>0")
	}
	parts = append(parts, ".=idle")
	unit := ""
	if c.Unit != "" {
		unit = " " + oneLine(c.Unit)
	}
	return fmt.Sprintf("key: %s; 1 column = %s%s", strings.Join(parts, ", "), formatNum(slot, d), unit)
}

// oneLine replaces line breaks and other control characters by spaces so that
// a name cannot break the grid.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}
