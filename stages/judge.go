package stages

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// evalJudge ranks a run's evaluations by train.early_stop.metric (the
// evaluation's loss): it says when the run should stop early, and gives
// each checkpoint the metric of its step, by which checkpoint.keep_best
// keeps the best. Every stage and replica holds one and shows it the same
// evaluations (shareEval), so all stop after the same step. Its state is
// part of every checkpoint, so a resumed run judges as the run it resumes.
// A nil judge judges nothing.
type evalJudge struct {
	patience int // 0: never stop
	minDelta float64

	seen     bool    // an evaluation was judged
	best     float64 // the best metric so far
	bestStep int     // and its step
	since    int     // evaluations since the best
	lastStep int     // the step of the newest evaluation
	last     float64 // and its metric
}

func newEvalJudge(c *configs.Config) *evalJudge {
	if !c.JudgesEvaluations() {
		return nil
	}
	return &evalJudge{patience: c.Train.EarlyStop.Patience, minDelta: c.Train.EarlyStop.MinDelta}
}

// observe judges the evaluation after step done and says whether the run
// stops there: after patience evaluations in a row none of which is below
// the best by more than minDelta.
func (j *evalJudge) observe(done int, v float64) bool {
	j.lastStep, j.last = done, v
	if !j.seen || v < j.best-j.minDelta {
		j.seen, j.best, j.bestStep, j.since = true, v, done, 0
		return false
	}
	j.since++
	return j.patience > 0 && j.since >= j.patience
}

// Checkpoint metadata: the metric of the checkpoint's step, when it was
// evaluated (checkpoint.MetricKey), and the judge's state.
const (
	judgeBestKey     = "early_stop_best"
	judgeBestStepKey = "early_stop_best_step"
	judgeSinceKey    = "early_stop_since"
)

// record writes the judge's state into the metadata of the checkpoint after
// step done, and the metric of done if done was evaluated.
func (j *evalJudge) record(done int, meta map[string]string, metricKey string) {
	if j == nil || !j.seen {
		return
	}
	meta[judgeBestKey] = strconv.FormatFloat(j.best, 'g', -1, 64)
	meta[judgeBestStepKey] = strconv.Itoa(j.bestStep)
	meta[judgeSinceKey] = strconv.Itoa(j.since)
	if j.lastStep == done {
		meta[metricKey] = strconv.FormatFloat(j.last, 'g', -1, 64)
	}
}

// restore takes the judge's state from a checkpoint's metadata; a
// checkpoint from before the first evaluation has none.
func (j *evalJudge) restore(meta map[string]string, path string) error {
	if j == nil {
		return nil
	}
	*j = evalJudge{patience: j.patience, minDelta: j.minDelta}
	s, ok := meta[judgeBestKey]
	if !ok {
		return nil
	}
	var err error
	if j.best, err = strconv.ParseFloat(s, 64); err == nil {
		if j.bestStep, err = strconv.Atoi(meta[judgeBestStepKey]); err == nil {
			j.since, err = strconv.Atoi(meta[judgeSinceKey])
		}
	}
	if err != nil {
		return fmt.Errorf("%s: early stopping's state: %w", path, err)
	}
	j.seen = true
	return nil
}

// shareEval gives every stage and replica the loss of the evaluation after
// step done, tagged tag, which only replica 0 of the stage that scores the
// evaluation has (res): it travels along the pipeline from that stage (the
// last, or stage 0 under V), then round each stage's replicas.
func (r *Runtime) shareEval(ctx context.Context, tag int, res *EvalResult) (float64, error) {
	var b []byte
	if res != nil {
		b = binary.LittleEndian.AppendUint64(nil, math.Float64bits(res.Loss))
	}
	step := int64(tag)
	if r.replica == 0 && r.stages > 1 {
		// Under V stage 0 scores, and the value travels down the pipeline;
		// otherwise the last stage scores, and it travels up.
		// The ring's link (the last stage to stage 0) carries none of it.
		from, to, kind := r.next, r.prev, transport.Gradient
		if r.layout.Schedule.Topology().Placement == schedule.V {
			from, to, kind = r.prev, r.next, transport.Activation
		}
		if r.stage == 0 || r.stage == r.stages-1 {
			if (r.stage == 0) == (kind == transport.Gradient) {
				to = nil // the end of the chain
			} else {
				from = nil // its head
			}
		}
		var err error
		if b == nil && from != nil {
			if b, err = from.recvBytes(ctx, step, controlTag(from), 8); err != nil {
				return 0, fmt.Errorf("the evaluation's loss: %w", err)
			}
		}
		if to != nil {
			if err := to.sendBytes(ctx, kind, step, controlTag(to), b); err != nil {
				return 0, fmt.Errorf("the evaluation's loss: %w", err)
			}
		}
	}
	if r.replicas.ringOrNil() != nil {
		// The message of the losses' tag: 8 bytes a micro-batch.
		mine := make([]byte, 8*r.cfg.Data.MicroBatches)
		copy(mine, b)
		all, err := r.replicas.gather(ctx, step, lossTag, mine)
		if err != nil {
			return 0, fmt.Errorf("sharing the evaluation's loss with the replicas: %w", err)
		}
		b = all[0]
	}
	if len(b) < 8 {
		return 0, fmt.Errorf("stage %d has no evaluation loss to judge", r.stage)
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
}

// judgeEval shares the evaluation after step done (tag, res on the stage
// that scored it) with every stage and replica and judges it; it says
// whether the run stops early there, which every process decides alike.
func (r *Runtime) judgeEval(ctx context.Context, done, tag int, res *EvalResult) (bool, error) {
	loss, err := r.shareEval(ctx, tag, res)
	if err != nil {
		return false, err
	}
	stop := r.judge.observe(done, loss) && done < r.cfg.Train.Steps
	if stop && r.holdsLoss() && r.replica == 0 {
		j := r.judge
		fmt.Fprintf(r.log, "early stop after step %d: %s has not improved on its best, %.4f after step %d, by more than %g in %s\n",
			done, configs.EarlyStopMetrics[0], j.best, j.bestStep, j.minDelta, words.Count(j.since, "evaluation"))
	}
	return stop, nil
}
