package configs

import (
	"math"
	"strings"
)

// EarlyStop ends a run whose evaluations stopped improving, as
// PyTorch Lightning's EarlyStopping does: an evaluation improves on the
// best so far when its metric is lower by more than MinDelta, and the run
// stops after Patience evaluations in a row that do not.
type EarlyStop struct {
	// Metric is what evaluations are judged by (EarlyStopMetrics).
	Metric string `mapstructure:"metric" json:"metric,omitempty"`
	// Patience is the evaluations without an improvement that stop the run;
	// 0 never stops it.
	Patience int     `mapstructure:"patience" json:"patience,omitempty"`
	MinDelta float64 `mapstructure:"min_delta" json:"min_delta,omitempty"`
}

// EarlyStopMetrics are the metrics early stopping and checkpoint.keep_best
// judge evaluations by; lower is better for each.
var EarlyStopMetrics = []string{"val_loss"}

// JudgesEvaluations says whether the run ranks its evaluations: to stop
// early, or to keep its best checkpoints.
func (c *Config) JudgesEvaluations() bool {
	return c.Train.EarlyStop.Patience > 0 || c.Checkpoint.KeepBest > 0
}

// validateEarlyStop checks train.early_stop and checkpoint.keep_best, which
// both watch the evaluations train.eval_every runs.
func (c *Config) validateEarlyStop(p *Problems) {
	e := c.Train.EarlyStop
	if m := e.Metric; m != "" && !strings.EqualFold(m, EarlyStopMetrics[0]) {
		p.add("train.early_stop.metric", "unknown metric %q (known: %s)", m, strings.Join(EarlyStopMetrics, ", "))
	}
	if e.Patience < 0 {
		p.add("train.early_stop.patience", "must be 0 (never stop early) or a number of evaluations, got %d", e.Patience)
	}
	if !(e.MinDelta >= 0) || math.IsInf(e.MinDelta, 1) {
		p.add("train.early_stop.min_delta", "must be 0 or a positive finite number, got %v", e.MinDelta)
	}
	if e.Patience > 0 && c.Train.EvalEvery <= 0 {
		p.add("train.early_stop.patience", "early stopping watches the evaluations train.eval_every runs, which is 0: set it to a number of steps")
	}
	switch k := c.Checkpoint.KeepBest; {
	case k < 0:
		p.add("checkpoint.keep_best", "must be 0 or a number of checkpoints, got %d", k)
	case k == 0:
	case c.Checkpoint.Every <= 0:
		p.add("checkpoint.keep_best", "keeps checkpoints, but checkpoint.every is 0: none are written")
	case c.Train.EvalEvery <= 0 || c.Checkpoint.Every%c.Train.EvalEvery != 0:
		p.add("checkpoint.keep_best", "ranks checkpoints by the evaluation of their step: checkpoint.every %d must be a multiple of train.eval_every %d", c.Checkpoint.Every, c.Train.EvalEvery)
	}
}
