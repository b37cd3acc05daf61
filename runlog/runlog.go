// Package runlog defines what a stage process writes into a run directory
// for others to read: the event log's records (Event), the run's metadata
// (RunInfo), the clock a stage records (Clock), and where each file lives.
// The stage runtime writes them; profile and the launcher read them. It holds
// types and names only, so that writers and readers share one definition
// without the runtime depending on the analysis.
package runlog

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Event kinds: an action's as package schedule spells its kinds (a test
// holds them equal), and the optimizer step.
const (
	Forward   = "F"
	Backward  = "B"   // full backward, or the input-gradient part (I) of a split one
	Input     = "I"   // input gradient of a split backward (zero-bubble schedules)
	Weight    = "W"   // weight gradient of a split backward
	Recompute = "RF"  // forward run again before a backward (stages[i].recompute: full)
	Optimizer = "OPT" // optimizer step after the pipeline flush
	// AllReduce is a chunk's gradient all-reduce among the stage's
	// replicas: from its schedule's reduction op until the sum is in.
	// It runs beside the stage's other actions, so it may overlap them.
	AllReduce = "AR"
	// ClipNorm is a step's gradient clipping (train.clip_grad_norm): the
	// stages' agreement on the global norm, which waits for every stage,
	// and the scaling.
	ClipNorm = "N"
)

// Event is one action executed by a stage.
type Event struct {
	Stage int `json:"stage"`
	// Step is the step's index from 0: the training log, metrics.jsonl and
	// checkpoints call it step Step+1 (StepNumber), and so does everything
	// this package prints.
	Step int    `json:"step"`
	Kind string `json:"kind"` // Forward, Backward, Input, Weight, Recompute, Optimizer, AllReduce or ClipNorm
	// Replica is the stage's replica (data_parallel > 1); 0 otherwise.
	Replica int `json:"replica,omitempty"`
	MB      int `json:"mb"` // micro-batch; meaningless for Optimizer
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
	// DataNS is, on a forward that reads the dataset (the model's first
	// stage its inputs, its last the targets), how long the source took to
	// read them; the stage reads them on a goroutine of its own while it
	// computes the forward before (the first of a step's while it finishes
	// the step before), so most of it is hidden. DataWaitNS is the part the
	// forward waited for, between StartNS and EndNS: it counts in the
	// forward's duration, so costs read from a run's events charge it. Both 0
	// on other actions and in logs written before the fields existed.
	DataNS     int64 `json:"data_ns,omitempty"`
	DataWaitNS int64 `json:"data_wait_ns,omitempty"`
	// BytesSent is what the action sent to a neighbouring stage.
	BytesSent int64 `json:"bytes_sent"`
	// Dropped is, on a worker's Optimizer event under parameter servers
	// with backup workers, how many servers dropped the step's gradients
	// because they came after the step's update.
	Dropped int `json:"dropped,omitempty"`
	// On a worker stage's Optimizer event under parameter servers, Servers
	// is how many servers it pushed to and pulled from (0 on every other
	// event), BytesSent the gradients pushed, BytesPulled the weights
	// pulled, PushNS the push's time (from StartNS until every server
	// answered it), WaitNS the pull's (until every server sent the weights
	// of the next step: the wait for the others' pushes and the update),
	// and Staleness how many updates the servers made between the weights
	// the worker computed the step with and its push's own update (the most
	// of its servers'; 0 in sync mode).
	Servers     int   `json:"servers,omitempty"`
	BytesPulled int64 `json:"bytes_pulled,omitempty"`
	PushNS      int64 `json:"push_ns,omitempty"`
	Staleness   int64 `json:"staleness,omitempty"`
	// Stashed is how many micro-batches' activations the stage held after
	// the action: the schedule's memory cost.
	Stashed int `json:"stashed"`
	// StashBytes is the activation memory the stage held after the action:
	// its tape machines' registers (a pool as large as the most micro-batches
	// it had in flight) and the split stashes (engine.HeldBytes). HeapBytes is
	// the process's live heap then (Go's runtime/metrics). Both 0 in logs
	// written before the fields existed.
	StashBytes int64 `json:"stash_bytes,omitempty"`
	HeapBytes  int64 `json:"heap_bytes,omitempty"`
}

// Compute is what a process computes with: its speed depends on it, and
// comparing runs means knowing it.
type Compute struct {
	BLAS        string `json:"blas"`         // "openblas", or "gonum" (pure Go)
	BLASThreads int    `json:"blas_threads"` // threads per product
	Kernels     string `json:"kernels"`      // the float32 loops: "avx2" or the Go loops
	// BLASKernels is OpenBLAS's kernel set (its core type: "Haswell"), ""
	// with gonum or in logs written before the field existed, and
	// BLASKernelsReason why it is the one ("OpenBLAS chose Prescott for this
	// CPU; using Cooperlake: 3.0x faster in the self-test").
	BLASKernels       string `json:"blas_kernels,omitempty"`
	BLASKernelsReason string `json:"blas_kernels_reason,omitempty"`
}

// StepNumber is the number the training log, metrics.jsonl and checkpoints
// give the event's step: its index plus 1.
func (e *Event) StepNumber() int { return e.Step + 1 }

// RunInfo is the run metadata written by the launcher.
type RunInfo struct {
	Schedule     string `json:"schedule"`
	Stages       int    `json:"stages"`
	MicroBatches int    `json:"micro_batches"`
	Steps        int    `json:"steps"`
	Chunks       int    `json:"chunks,omitempty"` // virtual stages per stage; 0 or 1 without interleaving
	// Placement is where the chunks sit (schedule.Placement's name): "v"
	// for a V-shaped schedule, empty for the loop every other one uses.
	Placement string `json:"placement,omitempty"`
	// Replicas is the run's data_parallel: each stage ran this many
	// processes, replica r's events in ReplicaEventsFile (0 or 1: none).
	Replicas int `json:"replicas,omitempty"`
	// BatchSize is the global batch (every replica's share), for rates.
	BatchSize int `json:"batch_size,omitempty"`
	// Compute is what stage 0's process computed with; logs written before
	// the field existed leave it nil.
	Compute           *Compute `json:"compute,omitempty"`
	TheoreticalBubble float64  `json:"theoretical_bubble"` // fraction, e.g. (p-1)/(m+p-1)
	// PredictedStashBytes is, per stage, the peak activation memory the
	// schedule makes it hold, from its layers' shapes (engine.PredictMemory);
	// nil in logs written before the field existed or when it could not be
	// predicted.
	PredictedStashBytes []int64 `json:"predicted_stash_bytes,omitempty"`
	// ScheduleCSV is, for a user-written ("custom") schedule or one with
	// recomputations (RF) its name does not say, the schedule in
	// schedule.Load's "csv" format, so that the profiler can simulate it.
	ScheduleCSV string `json:"schedule_csv,omitempty"`
	// ParameterServers is the run's parameter_servers.count: each server
	// wrote its log in PSEventsFile. 0 without servers.
	ParameterServers int `json:"parameter_servers,omitempty"`
	// Clocks are the clocks the stages recorded beside their event logs
	// (ReadClocks), not part of run.json: ReadRun fills them in, and Analyse
	// aligns the stages' clocks with them. nil when no stage recorded one.
	Clocks []Clock `json:"-"`
}

// CheckpointDir is where a run keeps its checkpoints.
func CheckpointDir(runDir string) string { return filepath.Join(runDir, "checkpoints") }

// WeightsDir is where a run keeps its final weights, one file per stage.
func WeightsDir(runDir string) string { return filepath.Join(runDir, "weights") }

// RunFile is the path of a run directory's metadata, written by stage 0.
func RunFile(dir string) string { return filepath.Join(dir, "run.json") }

// EventsFile is the path of stage's event log inside a run directory.
func EventsFile(dir string, stage int) string {
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.jsonl", stage))
}

// ReplicaEventsFile is the event log of stage's replica: EventsFile for
// replica 0, events/stage-<i>.replica-<r>.jsonl for the others.
func ReplicaEventsFile(dir string, stage, replica int) string {
	if replica == 0 {
		return EventsFile(dir, stage)
	}
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.replica-%d.jsonl", stage, replica))
}

// PSEventsFile is the event log of parameter server i: events/ps-<i>.jsonl.
func PSEventsFile(dir string, i int) string {
	return filepath.Join(dir, "events", fmt.Sprintf("ps-%d.jsonl", i))
}

// ReplicaClockFile is ClockFile for stage's replica, beside its event log.
func ReplicaClockFile(dir string, stage, replica int) string {
	if replica == 0 {
		return ClockFile(dir, stage)
	}
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.replica-%d.clock.json", stage, replica))
}

// Clock is the clock a stage's events are timed on, as the stage process
// records it when it starts, next to its event log (ClockFile): its host name
// and the Linux kernel's boot id (/proc/sys/kernel/random/boot_id). Processes
// under one kernel, containers included, read one wall clock; the kernel draws
// a new boot id at random at every boot, so two hosts never have the same one.
//
//	{"host":"gpu1","boot_id":"1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"}
type Clock struct {
	Host   string `json:"host"`
	BootID string `json:"boot_id"` // "" where the stage could read none
	// Earlier holds, oldest first, the clocks of the stage's earlier
	// processes whose events its log still holds: a resumed run appends to the
	// log. An entry without a boot id stands for events logged before the
	// stage recorded its clock.
	Earlier []Clock `json:"earlier,omitempty"`
}

// ClockFile is the path of stage's clock record inside a run directory:
// events/stage-<i>.clock.json, beside its event log.
func ClockFile(dir string, stage int) string {
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.clock.json", stage))
}

// Known reports whether c names the clock of every event in its stage's
// log: it has a boot id, and so has every earlier entry.
func (c *Clock) Known() bool {
	if c.BootID == "" {
		return false
	}
	for i := range c.Earlier {
		if c.Earlier[i].BootID == "" {
			return false
		}
	}
	return true
}

// Shares reports whether two stages' logs were timed on one clock throughout:
// both are Known, with the same boot ids in the same order.
func (c *Clock) Shares(d *Clock) bool {
	return c.Known() && d.Known() && c.Key() == d.Key()
}

// Key is the boot ids of c's processes, oldest first.
func (c *Clock) Key() string {
	var ids []string
	for _, e := range c.Earlier {
		ids = append(ids, e.BootID)
	}
	return strings.Join(append(ids, c.BootID), " ")
}

// Check rejects an event of stage's log that would silently skew a report.
func (e *Event) Check(stage int) error {
	switch {
	case e.Stage != stage:
		return fmt.Errorf("event of stage %d in stage %d's log", e.Stage, stage)
	case e.Kind != Forward && e.Kind != Backward && e.Kind != Input && e.Kind != Weight && e.Kind != Recompute && e.Kind != Optimizer && e.Kind != AllReduce && e.Kind != ClipNorm:
		return fmt.Errorf("unknown kind %q: want F, B, I, W, RF, OPT, AR or N", e.Kind)
	case e.EndNS < e.StartNS:
		return fmt.Errorf("end_ns %d before start_ns %d", e.EndNS, e.StartNS)
	case e.Step < 0:
		return fmt.Errorf("negative step %d", e.Step)
	case e.SendNS < 0:
		return fmt.Errorf("negative send_ns %d", e.SendNS)
	case e.Servers > 0 && e.Kind != Optimizer:
		return fmt.Errorf("servers %d on a %s event: only the optimizer step talks to parameter servers", e.Servers, e.Kind)
	}
	return nil
}
