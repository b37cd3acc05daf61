// Package profile reads the per-stage event logs a pipelined training run
// writes and reports where each stage's time went, so a run's measured
// pipeline bubble can be compared with the schedule's theoretical one.
//
// Each stage process writes RUN_DIR/events/stage-<i>.jsonl, one JSON object
// per executed action, and beside it stage-<i>.clock.json, the clock it runs
// on (Clock); the launcher writes RUN_DIR/run.json.
//
// Stages may run on hosts whose clocks differ: Align estimates each stage's
// offset from the messages neighbours exchange, except between stages that
// recorded one clock, and Analyse, Chart and WriteTrace work on stage 0's
// clock. Analyse reports per stage, per step (with straggler steps) and per
// link, beside the schedule simulator's prediction for the run's own action
// costs; Chart, WriteTrace and WriteHTML draw a few steps of the run.
package profile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
)

// Event kinds.
const (
	Forward   = "F"
	Backward  = "B"   // full backward, or the input-gradient part (I) of a split one
	Input     = "I"   // input gradient of a split backward (zero-bubble schedules)
	Weight    = "W"   // weight gradient of a split backward
	Optimizer = "OPT" // optimizer step after the pipeline flush
)

// Event is one action executed by a stage.
type Event struct {
	Stage int `json:"stage"`
	// Step is the step's index from 0: the training log, metrics.jsonl and
	// checkpoints call it step Step+1 (StepNumber), and so does everything
	// this package prints.
	Step int    `json:"step"`
	Kind string `json:"kind"` // Forward, Backward, Input, Weight or Optimizer
	MB   int    `json:"mb"`   // micro-batch; meaningless for Optimizer
	// Chunk is the virtual stage (interleaved schedules); 0 otherwise.
	Chunk int `json:"chunk,omitempty"`
	// StartNS and EndNS are wall-clock ns (time.Now().UnixNano()) of the
	// compute. Wall clock, not monotonic, so that stages in different
	// processes on one host share a time base (across hosts, see Align).
	// StartNS is just after the input arrived; what the action sends leaves at
	// EndNS.
	StartNS int64 `json:"start_ns"`
	EndNS   int64 `json:"end_ns"`
	// WaitNS is time spent blocked waiting for the input before StartNS.
	WaitNS int64 `json:"wait_ns"`
	// SendNS is the part of the action (between StartNS and EndNS) spent in
	// Send: blocked because the link's queue was full, or, on a stage whose
	// Go processors are all busy, yielding to the link's writer while it hands
	// the bytes to the kernel. Logs written before the field existed read as 0.
	SendNS int64 `json:"send_ns"`
	// BytesSent is what the action sent to a neighbouring stage.
	BytesSent int64 `json:"bytes_sent"`
	// Stashed is how many micro-batches' activations the stage held after
	// the action: the schedule's memory cost.
	Stashed int `json:"stashed"`
}

// StepNumber is the number the training log, metrics.jsonl and checkpoints
// give the event's step: its index plus 1.
func (e *Event) StepNumber() int { return e.Step + 1 }

// StepRange returns the first and last step the logs hold, numbered as the
// training log numbers them (from 1), and how many distinct steps lie between
// them; n is 0 for logs without events.
func StepRange(events [][]Event) (first, last, n int) {
	seen := map[int]bool{}
	for _, stage := range events {
		for i := range stage {
			seen[stage[i].StepNumber()] = true
		}
	}
	if len(seen) == 0 {
		return 0, 0, 0
	}
	first, last = math.MaxInt, math.MinInt
	for s := range seen {
		first, last = min(first, s), max(last, s)
	}
	return first, last, len(seen)
}

// RunInfo is the run metadata written by the launcher.
type RunInfo struct {
	Schedule          string  `json:"schedule"`
	Stages            int     `json:"stages"`
	MicroBatches      int     `json:"micro_batches"`
	Steps             int     `json:"steps"`
	Chunks            int     `json:"chunks,omitempty"`   // virtual stages per stage; 0 or 1 without interleaving
	TheoreticalBubble float64 `json:"theoretical_bubble"` // fraction, e.g. (p-1)/(m+p-1)
	// ScheduleCSV is, for a user-written ("custom") schedule, the schedule in
	// schedule.Load's "csv" format, so that the profiler can simulate it.
	ScheduleCSV string `json:"schedule_csv,omitempty"`
	// Clocks are the clocks the stages recorded beside their event logs
	// (ReadClocks), not part of run.json: ReadRun fills them in, and Analyse
	// aligns the stages' clocks with them. nil when no stage recorded one.
	Clocks []Clock `json:"-"`
}

// EventsFile is the path of stage's event log inside a run directory.
func EventsFile(dir string, stage int) string {
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.jsonl", stage))
}

// ReadRun reads run.json, every stage's event log and the stages' clock
// records (into RunInfo.Clocks; see ReadClocks) from a run directory. All
// stages' event logs are required: a report over some of them would misstate
// the pipeline window. Errors name the file, and the line for a bad event.
func ReadRun(dir string) (RunInfo, [][]Event, error) {
	var info RunInfo
	path := filepath.Join(dir, "run.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return info, nil, fmt.Errorf("profile: %w", err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, nil, fmt.Errorf("profile: %s: %w", path, err)
	}
	if info.Stages < 1 {
		return info, nil, fmt.Errorf("profile: %s: stages = %d, want at least 1", path, info.Stages)
	}
	events := make([][]Event, info.Stages)
	for i := range events {
		if events[i], err = readEvents(EventsFile(dir, i), i); err != nil {
			return info, nil, err
		}
	}
	if info.Clocks, err = ReadClocks(dir, info.Stages); err != nil {
		return info, nil, err
	}
	return info, events, nil
}

// readEvents reads one stage's JSON-lines log, skipping blank lines.
func readEvents(path string, stage int) ([]Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("profile: no events for stage %d: %s does not exist", stage, path)
	}
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	defer f.Close()

	var events []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(text, &e); err != nil {
			return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
		}
		if err := e.check(stage); err != nil {
			return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("profile: %s: %w", path, err)
	}
	return events, nil
}

// check rejects events that would silently skew the report.
func (e *Event) check(stage int) error {
	switch {
	case e.Stage != stage:
		return fmt.Errorf("event of stage %d in stage %d's log", e.Stage, stage)
	case e.Kind != Forward && e.Kind != Backward && e.Kind != Input && e.Kind != Weight && e.Kind != Optimizer:
		return fmt.Errorf("unknown kind %q: want F, B, I, W or OPT", e.Kind)
	case e.EndNS < e.StartNS:
		return fmt.Errorf("end_ns %d before start_ns %d", e.EndNS, e.StartNS)
	case e.Step < 0:
		return fmt.Errorf("negative step %d", e.Step)
	case e.SendNS < 0:
		return fmt.Errorf("negative send_ns %d", e.SendNS)
	}
	return nil
}
