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

	"github.com/pipetrain/pipetrain/runlog"
)

// Event kinds (see runlog).
const (
	Forward   = runlog.Forward
	Backward  = runlog.Backward
	Input     = runlog.Input
	Weight    = runlog.Weight
	Optimizer = runlog.Optimizer
)

// Event is one action executed by a stage, as its event log records it.
type Event = runlog.Event

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

// RunInfo is the run metadata stage 0 writes (run.json).
type RunInfo = runlog.RunInfo

// EventsFile is the path of stage's event log inside a run directory.
func EventsFile(dir string, stage int) string { return runlog.EventsFile(dir, stage) }

// ReadRun reads run.json, every stage's event log and the stages' clock
// records (into RunInfo.Clocks; see ReadClocks) from a run directory. All
// stages' event logs are required: a report over some of them would misstate
// the pipeline window. Errors name the file, and the line for a bad event.
func ReadRun(dir string) (RunInfo, [][]Event, error) {
	var info RunInfo
	path := runlog.RunFile(dir)
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
		if err := e.Check(stage); err != nil {
			return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("profile: %s: %w", path, err)
	}
	return events, nil
}
