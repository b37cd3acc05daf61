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

// openEventLog creates the log, or appends to it when a resumed run continues it.
func openEventLog(path string, resume bool) (*eventLog, error) {
	f, err := openLog(path, resume)
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

// openLog creates a log file, or opens it for appending.
func openLog(path string, resume bool) (*os.File, error) {
	if resume {
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	}
	return os.Create(path)
}
