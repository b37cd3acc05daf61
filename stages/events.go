package stages

import (
	"bufio"
	"encoding/json"
	"os"

	"github.com/pipetrain/pipetrain/profile"
)

// eventLog appends one JSON line per executed action; it is flushed once per step
// so a crash loses at most the step in progress.
type eventLog struct {
	f *os.File
	w *bufio.Writer
	e *json.Encoder
}

func openEventLog(path string) (*eventLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	return &eventLog{f: f, w: w, e: json.NewEncoder(w)}, nil
}

func (l *eventLog) add(e profile.Event) error { return l.e.Encode(e) }
func (l *eventLog) flush() error              { return l.w.Flush() }
func (l *eventLog) close() {
	l.w.Flush()
	l.f.Close()
}
