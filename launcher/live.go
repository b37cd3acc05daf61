package launcher

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
)

// Live follows the event logs of a running job and keeps the bubble of its most
// recent complete steps, for the launcher's progress line. It reads only what the
// stages have flushed (whole lines), so it never disturbs them.
type Live struct {
	dir    string // the run directory
	stages int
	window int // recent steps averaged

	mu      sync.Mutex
	offsets []int64
	partial [][]byte
	steps   map[int]*stepStats
	done    []int // complete steps, in the order they completed
}

type stepStats struct {
	start, end []int64 // per stage: first start and last end of compute (not OPT)
	busy       []int64 // per stage: compute ns
	finished   []bool  // per stage: OPT seen
}

// event is a stage's event as its log records it.
type event = runlog.Event

// NewLive watches RUN_DIR/events for a job of the given stages, averaging over
// the last window complete steps.
func NewLive(runDir string, stages, window int) *Live {
	return &Live{dir: runDir, stages: stages, window: max(window, 1),
		offsets: make([]int64, stages), partial: make([][]byte, stages), steps: map[int]*stepStats{}}
}

// Poll reads whatever the stages wrote since the last call.
func (l *Live) Poll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := 0; s < l.stages; s++ {
		f, err := os.Open(runlog.EventsFile(l.dir, s))
		if err != nil {
			continue // not started yet
		}
		f.Seek(l.offsets[s], io.SeekStart)
		// A read that fails keeps what it got and the next poll reads on:
		// the live view is best effort and never stops a run.
		b, _ := io.ReadAll(bufio.NewReader(f))
		f.Close()
		l.offsets[s] += int64(len(b))
		b = append(l.partial[s], b...)
		cut := bytes.LastIndexByte(b, '\n')
		if cut < 0 {
			l.partial[s] = b
			continue
		}
		l.partial[s] = append([]byte(nil), b[cut+1:]...)
		for _, line := range bytes.Split(b[:cut], []byte("\n")) {
			var e event
			if json.Unmarshal(line, &e) == nil && e.Stage >= 0 && e.Stage < l.stages {
				l.add(e)
			}
		}
	}
}

func (l *Live) add(e event) {
	st := l.steps[e.Step]
	if st == nil {
		st = &stepStats{start: make([]int64, l.stages), end: make([]int64, l.stages), busy: make([]int64, l.stages), finished: make([]bool, l.stages)}
		l.steps[e.Step] = st
	}
	if e.Kind == runlog.Optimizer {
		st.finished[e.Stage] = true
		for _, f := range st.finished {
			if !f {
				return
			}
		}
		l.done = append(l.done, e.Step)
		if n := len(l.done); n > l.window { // forget steps that left the window
			delete(l.steps, l.done[0])
			l.done = l.done[1:]
		}
		return
	}
	if e.Kind == runlog.ClipNorm {
		return // waiting for the other stages' parts of the norm: no work
	}
	if st.start[e.Stage] == 0 || e.StartNS < st.start[e.Stage] {
		st.start[e.Stage] = e.StartNS
	}
	st.end[e.Stage] = max(st.end[e.Stage], e.EndNS)
	st.busy[e.Stage] += e.EndNS - e.StartNS
}

// Bubble returns the mean idle fraction of the stages over the recent complete
// steps, and the stage that was busiest; ok is false before a step completes.
func (l *Live) Bubble() (bubble float64, slowest int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.done) == 0 {
		return 0, 0, false
	}
	busy := make([]int64, l.stages)
	var window int64
	for _, step := range l.done {
		st := l.steps[step]
		lo, hi := int64(0), int64(0)
		for s := range l.stages {
			if st.start[s] != 0 && (lo == 0 || st.start[s] < lo) {
				lo = st.start[s]
			}
			hi = max(hi, st.end[s])
			busy[s] += st.busy[s]
		}
		window += hi - lo
	}
	if window <= 0 {
		return 0, 0, false
	}
	for s := range l.stages {
		bubble += (1 - float64(busy[s])/float64(window)) / float64(l.stages)
		if busy[s] > busy[slowest] {
			slowest = s
		}
	}
	return bubble, slowest, true
}

// Follow polls every interval until stop is closed.
func (l *Live) Follow(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			l.Poll()
		}
	}
}
