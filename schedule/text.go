package schedule

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// stageLabel is the row label shared by Grid and Text, padded so rows line up
// when there are ten or more stages.
func stageLabel(st, stages int) string {
	return fmt.Sprintf("stage %*d:", len(strconv.Itoa(max(stages-1, 0))), st)
}

// Grid prints one line per stage with its actions in order, e.g.
// "stage 0: 0F0 0F1 0B0 ...", after a line "placement: v" when the placement
// is not Loop. ParseGrid reads it back.
func (s *Schedule) Grid() string {
	var b strings.Builder
	b.WriteString(placementLine(s.Placement))
	for st, list := range s.Actions {
		b.WriteString(stageLabel(st, len(s.Actions)))
		for _, a := range list {
			b.WriteByte(' ')
			b.WriteString(a.String())
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// ParseGrid reads a schedule written as Grid prints it: one line
// "stage N: a a a" per stage, N counting up from 0, and at most one line
// "placement: NAME" (loop, the default, or v). Blank lines and lines
// starting with '#' are ignored. Stages is the number of stage lines,
// MicroBatches one more than the largest micro-batch mentioned and Chunks one
// more than the largest chunk (at least 1); Name is left empty. ParseGrid
// checks only the syntax, naming the line and column of a bad action: call
// Check on the result to learn whether the schedule is runnable.
func ParseGrid(text string) (*Schedule, error) {
	rows, pl, err := gridRows(text, ParseAction)
	if err != nil {
		return nil, err
	}
	s := fromRows(rows)
	s.Placement = pl
	return s, nil
}

// placementKey names a schedule's placement in every format: a grid line
// "placement: v", a YAML key, a CSV row of one cell.
const placementKey = "placement"

// placementLine is the grid's placement line, empty for Loop so that the
// schedules that have always been written without one still are.
func placementLine(pl Placement) string {
	if pl == Loop {
		return ""
	}
	return placementKey + ": " + pl.String() + "\n"
}

// parsePlacementLine reads "placement: NAME"; ok is false when line is not a
// placement line at all.
func parsePlacementLine(line string) (pl Placement, ok bool, err error) {
	key, value, found := strings.Cut(strings.TrimSpace(line), ":")
	if !found || strings.TrimSpace(key) != placementKey {
		return Loop, false, nil
	}
	pl, err = ParsePlacement(strings.TrimSpace(value))
	return pl, true, err
}

// gridRows reads "stage N: items..." lines, N counting from 0, and at most
// one placement line, skipping blank lines and "#" comments, each item read
// by parse.
func gridRows[T any](text string, parse func(string) (T, error)) ([][]T, Placement, error) {
	var rows [][]T
	pl, placed := Loop, false
	for n, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if p, ok, err := parsePlacementLine(line); ok {
			switch {
			case err != nil:
				return nil, Loop, fmt.Errorf("line %d: %w", n+1, err)
			case placed:
				return nil, Loop, fmt.Errorf("line %d: a second placement line", n+1)
			}
			pl, placed = p, true
			continue
		}
		head, _, ok := strings.Cut(line, ":")
		f := strings.Fields(head)
		if !ok || len(f) != 2 || f[0] != "stage" {
			return nil, Loop, fmt.Errorf("line %d: want \"stage N: actions...\", got %q", n+1, trimmed)
		}
		st, err := strconv.Atoi(f[1])
		if err != nil || st != len(rows) {
			return nil, Loop, fmt.Errorf("line %d: want stage %d, got %q", n+1, len(rows), f[1])
		}
		list := []T{}
		for col := len(head) + 1; col < len(line); {
			for col < len(line) && isSpace(line[col]) {
				col++
			}
			w := col
			for col < len(line) && !isSpace(line[col]) {
				col++
			}
			if w == col {
				break
			}
			item, err := parse(line[w:col])
			if err != nil {
				return nil, Loop, fmt.Errorf("line %d, column %d: %w", n+1, w+1, err)
			}
			list = append(list, item)
		}
		rows = append(rows, list)
	}
	if len(rows) == 0 {
		return nil, Loop, fmt.Errorf("no stage lines found")
	}
	return rows, pl, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' }

// fromRows wraps parsed stage lists in a Schedule, inferring its sizes from
// the actions as ParseGrid describes.
func fromRows(rows [][]Action) *Schedule {
	s := &Schedule{Stages: len(rows), Chunks: 1, Actions: rows}
	for _, list := range rows {
		for _, a := range list {
			s.MicroBatches = max(s.MicroBatches, a.MicroBatch+1)
			s.Chunks = max(s.Chunks, a.Chunk+1)
		}
	}
	return s
}

// Text renders the timeline as one row per stage, one character per time slot
// of width slot: the kind of the action running at the middle of the slot
// ('F', 'B', 'I' or 'W', lower-case for a chunk other than 0 so that the
// interleaving shows), '.' for idle. Sampling the middle keeps the output exact when slot divides
// the costs; a coarser slot is only a sketch (short actions can vanish). A
// header gives the makespan and a time ruler marking every tenth slot; each
// row ends with the stage's bubble. A slot <= 0 (or NaN) means 1.
func (t *Timeline) Text(slot float64) string {
	if !(slot > 0) {
		slot = 1
	}
	stages := len(t.Spans)
	slots := int(math.Ceil(t.Makespan / slot))
	pad := strings.Repeat(" ", len(stageLabel(0, stages))+1)

	var b strings.Builder
	fmt.Fprintf(&b, "makespan %g, slot %g\n", t.Makespan, slot)
	ruler := []byte(strings.Repeat(" ", slots))
	for k := 0; k < slots; k += 10 {
		label := strconv.FormatFloat(float64(k)*slot, 'g', -1, 64)
		for len(ruler) < k+len(label) { // let the last label run past the rows
			ruler = append(ruler, ' ')
		}
		copy(ruler[k:], label)
	}
	b.WriteString(strings.TrimRight(pad+string(ruler), " ") + "\n")

	for st, spans := range t.Spans {
		row := []byte(strings.Repeat(".", slots))
		j := 0
		for k := range row {
			mid := (float64(k) + 0.5) * slot
			for j < len(spans) && spans[j].End <= mid {
				j++
			}
			if j < len(spans) && spans[j].Start <= mid {
				a := spans[j].Action
				row[k] = a.Kind.String()[0]
				if a.Chunk != 0 && 'A' <= row[k] && row[k] <= 'Z' {
					row[k] += 'a' - 'A'
				}
			}
		}
		fmt.Fprintf(&b, "%s %s  bubble %.1f%%\n", stageLabel(st, stages), row, 100*t.Bubble[st])
	}
	return b.String()
}

// GridPlacement returns the placement a grid (compute-only or lowered)
// names, Loop when it names none, reading no further than its first stage
// line.
func GridPlacement(text string) (Placement, error) {
	for n, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		pl, ok, err := parsePlacementLine(line)
		if err != nil {
			return Loop, fmt.Errorf("line %d: %w", n+1, err)
		}
		if !ok {
			break
		}
		return pl, nil
	}
	return Loop, nil
}
