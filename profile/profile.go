// Package profile reads the per-stage event logs a pipelined training run
// writes and reports where each stage's time went, so a run's measured
// pipeline bubble can be compared with the schedule's theoretical one.
//
// Each stage process writes RUN_DIR/events/stage-<i>.jsonl, one JSON object
// per executed action, and beside it stage-<i>.clock.json, the clock it runs
// on (Clock); the launcher writes RUN_DIR/run.json. With data-parallel
// replicas those are replica 0's, which Analyse reports on; replica r > 0
// writes stage-<i>.replica-<r>.jsonl and .clock.json (ReadReplicas,
// AddReplicas).
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
	Recompute = runlog.Recompute
	Optimizer = runlog.Optimizer
	AllReduce = runlog.AllReduce
	ClipNorm  = runlog.ClipNorm
)

// compute reports whether an event of kind k is the stage's own work in the
// pipeline: an action of the schedule. The optimizer step follows the flush,
// and an all-reduce runs beside the actions, so neither counts toward a
// stage's busy time or a step's window.
func compute(k string) bool { return k != Optimizer && k != AllReduce && k != ClipNorm }

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
	events, err := readPipeline(dir, info.Stages, 0)
	if err != nil {
		return info, nil, err
	}
	if info.Clocks, err = ReadClocks(dir, info.Stages); err != nil {
		return info, nil, err
	}
	return info, events, nil
}

// Replica is one copy of a run's pipeline (data_parallel): the event logs of
// its stages' processes and their clock records.
type Replica struct {
	Events [][]Event // Events[s] is stage s's log
	// Clocks are its stages' clock records (ReadReplicaClocks), for Align:
	// each replica's processes recorded their own. nil when none did.
	Clocks []Clock
}

// ReadReplicas reads the event logs and clock records of every replica of a
// run with replicas (info.Replicas > 1, info as ReadRun returns it), replica
// 0 included; nil for a run without. Every replica's logs are required, as
// every stage's are for ReadRun; errors name the file.
func ReadReplicas(dir string, info RunInfo) ([]Replica, error) {
	if info.Replicas < 2 {
		return nil, nil
	}
	out := make([]Replica, info.Replicas)
	for r := range out {
		events, err := readPipeline(dir, info.Stages, r)
		if err != nil {
			return nil, err
		}
		clocks, err := ReadReplicaClocks(dir, info.Stages, r)
		if err != nil {
			return nil, err
		}
		out[r] = Replica{Events: events, Clocks: clocks}
	}
	return out, nil
}

// readPipeline reads the logs of one replica's stages.
func readPipeline(dir string, stages, replica int) ([][]Event, error) {
	events := make([][]Event, stages)
	for i := range events {
		var err error
		if events[i], err = readEvents(runlog.ReplicaEventsFile(dir, i, replica), i, replica); err != nil {
			return nil, err
		}
	}
	return events, nil
}

// checkEvent rejects an event of a stage replica's log that would silently
// skew a report (Event.Check), all-reduces included.
func checkEvent(e *Event, stage, replica int) error {
	if err := e.Check(stage); err != nil {
		return err
	}
	// Replica 0 is left out of the JSON, so only an event that names
	// another replica than the log's can be refused.
	if e.Replica != 0 && e.Replica != replica {
		return fmt.Errorf("event of replica %d in replica %d's log", e.Replica, replica)
	}
	return nil
}

// readEvents reads one stage replica's JSON-lines log, skipping blank lines.
func readEvents(path string, stage, replica int) ([]Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		if replica > 0 {
			return nil, fmt.Errorf("profile: no events for stage %d of replica %d: %s does not exist", stage, replica, path)
		}
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
		if err := checkEvent(&e, stage, replica); err != nil {
			return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("profile: %s: %w", path, err)
	}
	return events, nil
}
