package schedule

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ReadFile loads a schedule from a file, choosing the format by extension: .csv,
// .yaml or .yml, anything else the text grid Grid prints. It does not Check.
func ReadFile(path string) (*Schedule, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	format := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	switch format {
	case "yml":
		format = "yaml"
	case "csv", "yaml":
	default:
		format = "grid"
	}
	s, err := Load(f, format)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// loweredToken matches what only a lowered grid holds: a receive or send
// ("2F0<1", "2F0>3") or a reduction ("2R", "2Rc1").
var loweredToken = regexp.MustCompile(`[<>]|(^|\s)[0-9]+R(c[0-9]+)?(\s|$)`)

// ReadLowered loads a schedule file as ReadFile does, but accepts a lowered
// grid too (what Lowered.Grid prints, with its sends, receives and
// reductions), and returns the schedule lowered and checked: a compute-only
// file is lowered with the default passes, a lowered one checked as written,
// so a user may place communication by hand.
func ReadLowered(path string) (*Lowered, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".csv" && ext != ".yaml" && ext != ".yml" && loweredToken.Match(b) {
		l, err := ParseLoweredGrid(string(b))
		if err == nil {
			err = l.Check()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return l, nil
	}
	s, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	l, err := Lower(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}
