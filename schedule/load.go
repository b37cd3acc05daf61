package schedule

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Formats lists the formats Load reads, in a stable order.
func Formats() []string { return []string{"csv", "grid", "yaml"} }

// Load reads a user-written schedule in one of three formats:
//
//   - "csv": torch.distributed.pipelining's layout, one row per stage and one
//     action per cell ("0F0", "0I3", "1W2c1"); empty cells are ignored. The
//     number before the kind is the stage (the row), and a chunk other than 0
//     is written as the "c<chunk>" suffix. A row holding only the cell
//     "placement: v" gives the placement. WriteCSV writes it.
//   - "grid": what Grid prints, read by ParseGrid.
//   - "yaml": a mapping with a "stages" key holding one list of actions per
//     stage, and optionally a "name" and a "placement":
//     `stages: [[0F0, 0F1, 0B0, 0B1], [...]]`. WriteYAML writes it.
//
// The placement (see Placement) is Loop unless the file names another: the
// same lists of actions mean other traffic under V, so a V-shaped schedule
// must say so.
//
// Stages is the number of rows (stage lists), MicroBatches one more than the
// largest micro-batch mentioned and Chunks one more than the largest chunk
// (at least 1). Like ParseGrid, Load checks only the syntax and names the
// row (or line) and column of the first bad action; call Check on the result
// to learn whether the schedule is runnable.
func Load(r io.Reader, format string) (*Schedule, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s schedule: %w", format, err)
	}
	switch format {
	case "csv":
		return loadCSV(data)
	case "grid":
		return ParseGrid(string(data))
	case "yaml":
		return loadYAML(data)
	}
	return nil, fmt.Errorf("unknown schedule format %q (known: %s)", format, strings.Join(Formats(), ", "))
}

func loadCSV(data []byte) (*Schedule, error) {
	cr := csv.NewReader(bytes.NewReader(data))
	cr.FieldsPerRecord = -1 // stages may run different numbers of actions
	var rows [][]Action
	pl, placed := Loop, false
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("csv: %w", err)
		}
		if cells := nonEmpty(rec); len(cells) == 1 {
			if p, ok, err := parsePlacementLine(cells[0]); ok {
				switch {
				case err != nil:
					return nil, fmt.Errorf("csv line %d: %w", line, err)
				case placed:
					return nil, fmt.Errorf("csv line %d: a second placement row", line)
				}
				pl, placed = p, true
				continue
			}
		}
		list := []Action{}
		for col, cell := range rec {
			cell = strings.TrimSpace(cell)
			if cell == "" {
				continue
			}
			a, err := ParseAction(cell)
			if err != nil {
				return nil, fmt.Errorf("csv row %d, column %d: %w", len(rows)+1, col+1, err)
			}
			list = append(list, a)
		}
		rows = append(rows, list)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("csv: no rows found")
	}
	s := fromRows(rows)
	s.Placement = pl
	return s, nil
}

// nonEmpty returns the cells of rec that hold more than spaces.
func nonEmpty(rec []string) []string {
	var out []string
	for _, c := range rec {
		if strings.TrimSpace(c) != "" {
			out = append(out, c)
		}
	}
	return out
}

func loadYAML(data []byte) (*Schedule, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("yaml: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	at := func(n *yaml.Node, format string, args ...any) error {
		return fmt.Errorf("yaml line %d, column %d: %s", n.Line, n.Column, fmt.Sprintf(format, args...))
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fmt.Errorf("yaml: want a mapping with a \"stages\" key, got an empty document")
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, at(top, "want a mapping with a \"stages\" key")
	}
	var name string
	var stages *yaml.Node
	pl := Loop
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "name":
			if v.Kind != yaml.ScalarNode {
				return nil, at(v, "want the schedule's name as a string")
			}
			name = v.Value
		case placementKey:
			var err error
			if v.Kind != yaml.ScalarNode {
				err = fmt.Errorf("want the placement's name (%s)", strings.Join(Placements(), ", "))
			} else {
				pl, err = ParsePlacement(v.Value)
			}
			if err != nil {
				return nil, at(v, "%v", err)
			}
		case "stages":
			stages = v
		default:
			return nil, at(k, "unknown key %q (want name, placement, stages)", k.Value)
		}
	}
	if stages == nil {
		return nil, at(top, "missing key \"stages\"")
	}
	if stages.Kind != yaml.SequenceNode {
		return nil, at(stages, "want \"stages\" to be a list of lists of actions, one per stage")
	}
	if len(stages.Content) == 0 {
		return nil, at(stages, "no stages found")
	}
	var rows [][]Action
	for st, row := range stages.Content {
		list := []Action{}
		switch {
		case isNull(row):
		case row.Kind != yaml.SequenceNode:
			return nil, at(row, "want stage %d's list of actions", st)
		default:
			for _, cell := range row.Content {
				if isNull(cell) || cell.Kind == yaml.ScalarNode && cell.Value == "" {
					continue
				}
				if cell.Kind != yaml.ScalarNode {
					return nil, at(cell, "want an action such as \"%dF0\" in stage %d's list", st, st)
				}
				a, err := ParseAction(cell.Value)
				if err != nil {
					return nil, at(cell, "%v", err)
				}
				list = append(list, a)
			}
		}
		rows = append(rows, list)
	}
	s := fromRows(rows)
	s.Name, s.Placement = name, pl
	return s, nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// WriteCSV writes the schedule as Load reads it with format "csv": one row
// per stage, one action per cell, after a placement row when the placement is
// not Loop. An empty stage list is written as a single empty quoted cell so
// that the row is not lost.
func (s *Schedule) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if line := placementLine(s.Placement); line != "" {
		if err := cw.Write([]string{strings.TrimSuffix(line, "\n")}); err != nil {
			return err
		}
	}
	for _, list := range s.Actions {
		if len(list) == 0 {
			cw.Flush()
			if _, err := io.WriteString(w, "\"\"\n"); err != nil {
				return err
			}
			continue
		}
		rec := make([]string, len(list))
		for i, a := range list {
			rec[i] = a.String()
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteYAML writes the schedule as Load reads it with format "yaml": its name
// (when set), its placement (when not Loop) and one flow list of actions per
// stage.
func (s *Schedule) WriteYAML(w io.Writer) error {
	var b strings.Builder
	if s.Name != "" {
		b.WriteString("name: " + strconv.Quote(s.Name) + "\n")
	}
	b.WriteString(placementLine(s.Placement))
	b.WriteString("stages:\n")
	for _, list := range s.Actions {
		b.WriteString("  - [")
		for i, a := range list {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(a.String())
		}
		b.WriteString("]\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
