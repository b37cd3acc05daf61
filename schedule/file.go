package schedule

import (
	"fmt"
	"os"
	"path/filepath"
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
