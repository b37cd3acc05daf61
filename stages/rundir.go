package stages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
)

// The files a run directory holds beside the event logs and checkpoints:
// run.json, metrics.jsonl, eval.json and the final weights.

// Outputs lists the files of a run directory (relative paths) that the
// process of stage, replica writes, checkpoints aside: its event log and
// clock, and for replica 0 its final weights and their checksum, run.json (stage 0) and the
// metrics and evaluation (the stage that computes the loss: the last, or
// stage 0 under a V). These are what the process
// sends to rank 0 when the ranks do not share a run directory: processes
// that share another folder each send their own, never a neighbour's that
// may still be being written.
func Outputs(c *configs.Config, stage, replica int) []string {
	var out []string
	for _, o := range outputs(c, stage, replica) {
		out = append(out, o.path)
	}
	return out
}

// OutputLimits bounds each of Outputs' files by the most bytes the process
// can write into it, so that rank 0 can refuse more from a rank that sends
// its logs (cluster.RendezvousOptions.Owns):
//
//   - the event log: 1 KiB per event (every field at its widest takes about
//     330 bytes), for at most 4 events per micro-batch and chunk in a step (F,
//     RF, B or I, W), an all-reduce per chunk and the optimizer step, over
//     train.steps (a resumed run truncates the steps it repeats);
//   - the final weights: the stage's parameters at the model's float size,
//     plus 64 KiB and 512 bytes per tensor of safetensors header;
//   - metrics.jsonl: 1 KiB per step (a line, an evaluation's included, takes
//     about 250 bytes);
//   - run.json: 1 MiB, plus 64 bytes per action of every stage, for the
//     schedule it may hold;
//   - the clock (a line per restart of the stage), eval.json and the
//     checksum file: 1 MiB each.
func OutputLimits(c *configs.Config, stage, replica int) (map[string]int64, error) {
	out := map[string]int64{}
	for _, o := range outputs(c, stage, replica) {
		n, err := o.limit()
		if err != nil {
			return nil, fmt.Errorf("stage %d: bounding %s: %w", stage, o.path, err)
		}
		out[o.path] = n
	}
	return out, nil
}

// output is one of Outputs' files and its bound.
type output struct {
	path  string
	limit func() (int64, error)
}

func outputs(c *configs.Config, stage, replica int) []output {
	const kib, mib = 1 << 10, 1 << 20
	fixed := func(n int64) func() (int64, error) { return func() (int64, error) { return n, nil } }
	rel := func(path string) string { return strings.TrimPrefix(path, "/") }
	steps, micro, chunks := int64(c.Train.Steps), int64(c.Data.MicroBatches), int64(max(1, c.VirtualStages))
	events := steps * (chunks*(4*micro+1) + 1) * kib
	out := []output{
		{rel(runlog.ReplicaEventsFile("", stage, replica)), fixed(events)},
		{rel(runlog.ReplicaClockFile("", stage, replica)), fixed(mib)},
	}
	if replica != 0 {
		return out
	}
	weights := filepath.Join("weights", fmt.Sprintf("stage-%d.safetensors", stage))
	out = append(out, output{weights, func() (int64, error) { return weightsLimit(c, stage) }}, output{checkpoint.SumPath(weights), fixed(mib)})
	if stage == 0 {
		actions := int64(len(c.Stages)) * chunks * 4 * micro
		out = append(out, output{"run.json", fixed(mib + 64*actions)})
	}
	if stage == c.LossStage() {
		out = append(out, output{"metrics.jsonl", fixed(steps * kib)}, output{"eval.json", fixed(mib)})
	}
	return out
}

// weightsLimit bounds stage's final weights file: its parameters, worked
// out from the layers' sizes without building them, and the header.
func weightsLimit(c *configs.Config, stage int) (int64, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return 0, err
	}
	size := int64(64 << 10)
	for chunk := range max(1, c.VirtualStages) {
		first, last := c.ChunkLayers(stage, chunk)
		part := *model
		part.Layers = model.Layers[first:last]
		params, err := models.TorchParams(&part)
		if err != nil {
			return 0, err
		}
		for _, p := range params {
			n := int64(dtypeSize(model))
			for _, d := range p.Shape {
				n *= int64(d)
			}
			size += n + 512 + int64(len(p.Name))
		}
	}
	return size, nil
}

// writeRunInfo writes run.json (stage 0): what profile needs to know of the run.
// computeRecord is what this process computes with, for run.json.
func computeRecord(threads int) *runlog.Compute {
	core, why := blas.Kernels()
	return &runlog.Compute{BLAS: blas.Name(), BLASThreads: threads, Kernels: models.Kernels(), BLASKernels: core, BLASKernelsReason: why}
}

func (r *Runtime) writeRunInfo() error {
	theory, _ := schedule.TheoreticalBubble(r.schedName, r.stages, r.cfg.Data.MicroBatches, len(r.chunks))
	info := runlog.RunInfo{Schedule: r.schedName, Stages: r.stages, MicroBatches: r.cfg.Data.MicroBatches, Steps: r.cfg.Train.Steps, Chunks: len(r.chunks), TheoreticalBubble: theory,
		BatchSize: r.cfg.Data.BatchSize, Compute: computeRecord(r.threads)}
	if n := r.cfg.Replicas(); n > 1 {
		info.Replicas = n
	}
	if r.cfg.PSEnabled() {
		info.ParameterServers = r.cfg.ParameterServers.Count
	}
	if pl := r.layout.Schedule.Placement; pl != schedule.Loop {
		info.Placement = pl.String()
	}
	if sched := r.layout.Schedule.Compute(); sched.Stages == len(r.cfg.Stages) {
		// A prediction that cannot be made leaves the profile without one;
		// it is no reason to stop a run.
		if peak, _, err := engine.PredictMemory(EnginePipeline(r.cfg), r.layout.Model, sched); err == nil {
			info.PredictedStashBytes = peak
		}
	}
	if sched := r.layout.Schedule.Compute(); r.schedName == "custom" || sched.Recomputes() {
		// The schedule itself, so profile can simulate what ran: a custom
		// one, or a named one with recomputations that its name omits.
		var csv strings.Builder
		if err := sched.WriteCSV(&csv); err != nil {
			return err
		}
		info.ScheduleCSV = csv.String()
	}
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return checkpoint.WriteAtomic(filepath.Join(r.runDir, "run.json"), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// saveWeights writes the stage's parameters to RUN_DIR/weights/stage-<i>.safetensors,
// and its checksum beside it (stage-<i>.sha256), which export, sample and
// init_from check.
func (r *Runtime) saveWeights() error {
	var ts []checkpoint.Tensor
	for _, c := range r.chunks {
		for _, w := range c.Weights() {
			ts = append(ts, denseTensor(w.Name, w.Value))
		}
	}
	path := weightsFile(r.runDir, r.stage)
	meta := map[string]string{"step": fmt.Sprint(r.cfg.Train.Steps), "config_digest": r.cfg.Digest(), "stage": fmt.Sprint(r.stage)}
	if r.trained > 0 {
		// Stopped early: the weights are of this step, and the run is done.
		meta["step"], meta[earlyStopKey] = fmt.Sprint(r.trained), "true"
	}
	if _, _, err := checkpoint.WriteChecked(path, ts, meta); err != nil {
		return fmt.Errorf("stage %d: saving weights: %w", r.stage, err)
	}
	return nil
}

// Finished says whether the run in runDir saved the final weights of every
// stage of c after its last step, or after the step it stopped early.
func Finished(c *configs.Config, runDir string) bool {
	for s := range c.Stages {
		meta, err := checkpoint.ReadMeta(weightsFile(runDir, s))
		if err != nil || (meta["step"] != strconv.Itoa(c.Train.Steps) && meta[earlyStopKey] != "true") {
			return false
		}
	}
	return true
}

// earlyStopKey marks final weights of a run that stopped early.
const earlyStopKey = "early_stop"

func weightsFile(runDir string, stage int) string {
	return filepath.Join(runlog.WeightsDir(runDir), fmt.Sprintf("stage-%d.safetensors", stage)) // as Outputs names it
}

// ReadMetrics reads a run's metrics.jsonl.
func ReadMetrics(path string) ([]Metric, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Metric
	for i, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m Metric
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, m)
	}
	return out, nil
}
