package stages

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	"github.com/pipetrain/pipetrain/checkpoint"
)

// Metric is one line of metrics.jsonl.
type Metric struct {
	Step          int     `json:"step"`
	Loss          float64 `json:"loss"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	ElapsedSec    float64 `json:"elapsed_s"`
	// Eval is set on the steps after which the model was evaluated (train.eval_every).
	Eval *EvalResult `json:"eval,omitempty"`
	// GradNorm is the step's global gradient norm before clipping, in a
	// run that clips by it (train.clip_grad_norm).
	GradNorm *float64 `json:"grad_norm,omitempty"`
	// LR is the learning rate of the step's update, in a run whose rate
	// follows a schedule (train.lr_schedule).
	LR *float64 `json:"lr,omitempty"`
}

// metricFiles writes what a run directory holds of the run's results:
// metrics.jsonl, a line per step, and eval.json, the final evaluation. Only
// the stage that computes the loss has them, and of its replicas only
// replica 0 (the replicas share its results); every method of a nil
// *metricFiles does nothing, so the runtime calls them on every stage.
type metricFiles struct {
	dir   string
	jsonl *os.File // metrics.jsonl, while open
}

// newMetricFiles is the metric files of runDir, not yet opened.
func newMetricFiles(runDir string) *metricFiles { return &metricFiles{dir: runDir} }

func (m *metricFiles) jsonlPath() string { return filepath.Join(m.dir, "metrics.jsonl") }

// open creates metrics.jsonl, or with resume appends to it.
func (m *metricFiles) open(resume bool) error {
	if m == nil {
		return nil
	}
	f, err := openLog(m.jsonlPath(), resume)
	if err != nil {
		return err
	}
	m.jsonl = f
	return nil
}

// rewind drops the lines of steps after start (1-based), which a failed
// attempt logged after the checkpoint it resumes from.
func (m *metricFiles) rewind(start int) error {
	if m == nil {
		return nil
	}
	return truncateJSONL(m.jsonlPath(), func(s int) bool { return s <= start })
}

// step appends a step's line to metrics.jsonl.
func (m *metricFiles) step(line Metric) error {
	if m == nil {
		return nil
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	_, err = m.jsonl.Write(append(b, '\n'))
	return err
}

// final saves the final evaluation as eval.json, replacing it whole.
func (m *metricFiles) final(res *EvalResult) error {
	if m == nil || res == nil {
		return nil
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return checkpoint.WriteAtomic(filepath.Join(m.dir, "eval.json"), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

func (m *metricFiles) close() {
	if m != nil && m.jsonl != nil {
		m.jsonl.Close()
		m.jsonl = nil
	}
}
