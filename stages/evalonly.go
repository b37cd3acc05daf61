package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/runlog"
)

// EvaluateWeights evaluates the weights at path on the evaluation split of
// o.Config's data (test images, validation tokens) without training: the
// one-process reference runtime, its parameters read from path as
// train.init_from reads them (a safetensors file in PyTorch's names or
// pipetrain's, a folder of them, a run's weights or checkpoint folder, or
// whatever else init_from accepts), runs the evaluation pass a run ends
// with, in the same micro-batches of the same size and order, so the
// figures of a run's own final weights are its eval.json's bit for bit at
// the same BLAS threads. No optimizer steps, and o.RunDir is ignored:
// nothing is written anywhere. The weights are checked against the model
// (every parameter, by name and shape, and nothing else) before any is read,
// the errors naming the file and the tensor.
func EvaluateWeights(ctx context.Context, o Options, path string) (*EvalResult, error) {
	r, err := evaluationRuntime(o, path)
	if err != nil {
		return nil, err
	}
	res, err := r.evaluate(ctx, EvalStep)
	if err != nil {
		return nil, fmt.Errorf("evaluating %s: %w", path, err)
	}
	if res == nil {
		return nil, fmt.Errorf("%s: the data has no %s examples to evaluate on", r.cfg.Path, r.feed.name())
	}
	return res, nil
}

// evaluationRuntime is the reference runtime EvaluateWeights evaluates
// with, its parameters read from path.
func evaluationRuntime(o Options, path string) (*Runtime, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	c := *o.Config
	c.Train.InitFrom, c.Train.Evaluate = abs, true
	// The runtime makes an optimizer per chunk, which never steps here: plain
	// SGD holds no state, where Adam's would double the model's memory.
	c.Train.Optimizer = configs.Optimizer{Name: "sgd"}
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Path, err)
	}
	if err := checkpoint.CheckInit(model, abs); err != nil {
		return nil, fmt.Errorf("the weights do not fit the config's %s model: %w", c.Model.Name, err)
	}
	o.Config, o.Reference, o.Layout, o.RunDir, o.Resume = &c, true, nil, "", false
	o.Prev, o.Next, o.ReplicaPrev, o.ReplicaNext, o.Coordinator, o.Pause = nil, nil, nil, nil, nil, nil
	o.ReplicaIn, o.ReplicaOut = nil, nil
	return New(o)
}

// IsRunDir reports whether dir holds a run that launch, stage or reference
// wrote: its final weights, checkpoints or run.json.
func IsRunDir(dir string) bool {
	for _, p := range []string{runlog.WeightsDir(dir), runlog.CheckpointDir(dir), filepath.Join(dir, "run.json")} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// RunWeights is the folder of the weights of the run in runDir that which
// (FinalWeights, LatestCheckpoint or a checkpoint's step) names, as Export
// takes them: checked against the config's stages (no stale file of another
// split), a checkpoint against its manifest. It returns the step they are
// of and their stage files.
func RunWeights(c *configs.Config, runDir string, which int) (dir string, step int, files []string, err error) {
	files, dir, step, err = exportFiles(c, runDir, which)
	return dir, step, files, err
}

// RunThreads is the BLAS thread count stage 0 of the run in runDir computed
// with, as its run.json records it; 0 when it records none.
func RunThreads(runDir string) int {
	b, err := os.ReadFile(filepath.Join(runDir, "run.json"))
	if err != nil {
		return 0
	}
	var info runlog.RunInfo
	if json.Unmarshal(b, &info) != nil || info.Compute == nil {
		return 0
	}
	return info.Compute.BLASThreads
}
