package stages

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/runlog"
)

// eventLog appends one JSON line per executed action; it is flushed once per step
// so a crash loses at most the step in progress.
type eventLog struct {
	f *os.File
	w *bufio.Writer
	e *json.Encoder
}

// openEventLog records the stage's clock (writeClock) and creates the stage's
// event log in runDir, or appends to it when a resumed run continues it.
func openEventLog(runDir string, stage, replica int, resume bool) (*eventLog, error) {
	if err := writeClock(runDir, stage, replica, resume); err != nil {
		return nil, err
	}
	f, err := openLog(runlog.ReplicaEventsFile(runDir, stage, replica), resume)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	return &eventLog{f: f, w: w, e: json.NewEncoder(w)}, nil
}

func (l *eventLog) add(e runlog.Event) error { return l.e.Encode(e) }
func (l *eventLog) flush() error             { return l.w.Flush() }
func (l *eventLog) close() {
	l.w.Flush()
	l.f.Close()
}

// openLog creates a log file, or opens it for appending.
func openLog(path string, resume bool) (*os.File, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if resume {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	return os.OpenFile(path, flags, runlog.FileMode())
}

// bootIDFile is where Linux gives the boot id, drawn at random at every boot
// and shared by every process under the kernel, containers included.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

// localClock returns the clock this process times its events on: its host
// name and the kernel's boot id ("" where there is none to read).
func localClock() runlog.Clock {
	host, _ := os.Hostname()
	id, _ := os.ReadFile(bootIDFile)
	return runlog.Clock{Host: host, BootID: strings.TrimSpace(string(id))}
}

// writeClock records, atomically, the clock the stage's events are timed on
// (runlog.ClockFile), so that the profile never shifts apart stages that
// share one. A resumed run keeps the events of the earlier processes of the
// stage, and their clocks in Earlier; events logged before the stage recorded
// its clock count as on an unknown one.
func writeClock(runDir string, stage, replica int, resume bool) error {
	c := localClock()
	clockFile := runlog.ReplicaClockFile(runDir, stage, replica)
	if resume {
		if st, err := os.Stat(runlog.ReplicaEventsFile(runDir, stage, replica)); err == nil && st.Size() > 0 {
			var old runlog.Clock
			if b, err := os.ReadFile(clockFile); err != nil || json.Unmarshal(b, &old) != nil {
				old = runlog.Clock{}
			}
			c.Earlier = append(old.Earlier, runlog.Clock{Host: old.Host, BootID: old.BootID})
		}
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return checkpoint.WriteAtomic(clockFile, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}
