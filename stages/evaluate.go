package stages

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// EvalResult is what eval.json holds: over the test images, or over the
// validation text's tokens (then Examples counts tokens and Perplexity is set).
type EvalResult struct {
	Examples   int     `json:"examples"`
	Correct    int     `json:"correct"`
	Accuracy   float64 `json:"accuracy"`
	Loss       float64 `json:"loss"`
	Perplexity float64 `json:"perplexity,omitempty"`
}

// evalTag tags the messages of the evaluation after step done (1-based), so they
// are never taken for a training step's or another evaluation's; the final one
// is EvalStep.
func evalTag(done int) int { return -1 - done }

// evaluator runs evaluation passes: the feed's evaluation micro-batches
// forward through the pipeline, chunk by chunk, with no backward, scored on
// the stage that computes the loss. The stage's goroutine runs it between
// steps, over the stage's links.
type evaluator struct {
	stage    int
	ops      []schedule.Op // one pass, lowered
	top      schedule.Topology
	chunks   []compute.Stage
	feed     feed
	link     func(route) *peer
	newInput func(compute.Stage) *tensor.Dense
	log      io.Writer
}

// newEvaluator lowers the stage's part of an evaluation pass.
func newEvaluator(r *Runtime, top schedule.Topology) *evaluator {
	return &evaluator{stage: r.stage, ops: top.LowerEvaluation(r.feed.evalBatches()).Ops[r.stage], top: top, chunks: r.chunks,
		feed: r.feed, link: r.link, newInput: r.newInput, log: r.log}
}

// evaluate runs one pass whose messages carry tag; the stage that computes
// the loss returns the result and logs it, the others return nil.
func (ev *evaluator) evaluate(ctx context.Context, tag int) (*EvalResult, error) {
	var res EvalResult
	var input, out, handed *tensor.Dense
	var msg *transport.Tensor
	for _, o := range ev.ops {
		a := o.Action
		var err error
		switch rt := routeOf(ev.top, ev.stage, o); {
		case o.Kind == schedule.RecvAct && rt == routeLocal:
			input, msg, handed = handed, nil, nil
		case o.Kind == schedule.RecvAct:
			input, msg, err = ev.link(rt).recvHeld(ctx, int64(tag), a.MicroBatch, ev.top.Tag(o))
		case o.Kind == schedule.SendAct && rt == routeLocal:
			handed = out
		case o.Kind == schedule.SendAct:
			_, _, err = ev.link(rt).sendOwned(ctx, sendKind(rt), int64(tag), a.MicroBatch, ev.top.Tag(o), out)
		case o.Kind == schedule.Compute:
			out, err = ev.forward(a, input, msg, &res)
			input, msg = nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	if !slices.ContainsFunc(ev.chunks, compute.Stage.IsLast) || res.Examples == 0 {
		return nil, nil
	}
	res.Accuracy = float64(res.Correct) / float64(res.Examples)
	res.Loss /= float64(res.Examples)
	what := ev.feed.name()
	if ev.feed.src.NextToken() {
		res.Perplexity = math.Exp(res.Loss)
		fmt.Fprintf(ev.log, "%s loss %.4f, perplexity %.2f, next-token accuracy %.2f%% (%d tokens)\n", what, res.Loss, res.Perplexity, 100*res.Accuracy, res.Examples)
	} else {
		fmt.Fprintf(ev.log, "%s accuracy %.2f%% (%d/%d), %s loss %.4f\n", what, 100*res.Accuracy, res.Correct, res.Examples, what, res.Loss)
	}
	return &res, nil
}

// forward runs evaluation micro-batch a.MicroBatch forward through chunk
// a.Chunk from input (data on the model's first stage) and releases the
// received msg; on the last model stage it scores the predictions into res,
// elsewhere it returns the activation to send.
func (ev *evaluator) forward(a schedule.Action, input *tensor.Dense, msg *transport.Tensor, res *EvalResult) (*tensor.Dense, error) {
	e, k := ev.chunks[a.Chunk], a.MicroBatch
	if e.IsFirst() {
		input = ev.newInput(e)
	}
	var targets []int
	rows := 0
	if e.IsFirst() || e.IsLast() {
		x := input
		if !e.IsFirst() {
			x = nil
		}
		targets, rows = ev.feed.eval(k, x, e.IsLast())
	}
	out, err := e.Forward(k, input, targets)
	if err != nil {
		return nil, err
	}
	e.Discard(k)
	if msg != nil {
		releaseHeld(e, held{msg})
	}
	if !e.IsLast() {
		return out, nil
	}
	logits, err := e.Logits()
	if err != nil {
		return nil, err
	}
	correct, loss := score(logits, targets[:rows])
	res.Correct += correct
	res.Loss += loss
	res.Examples += rows
	return nil, nil
}

// evaluate runs an evaluation pass tagged tag on replica 0: the replicas
// hold replica 0's weights, so it evaluates for all.
func (r *Runtime) evaluate(ctx context.Context, tag int) (*EvalResult, error) {
	if r.replica > 0 {
		return nil, nil
	}
	return r.eval.evaluate(ctx, tag)
}

// score counts correct argmax predictions and sums the cross-entropy of the first
// len(targets) rows of logits.
func score(logits *tensor.Dense, targets []int) (correct int, loss float64) {
	c := logits.Shape()[1]
	vals := engine.Float64s(logits)
	for i, y := range targets {
		row := vals[i*c : (i+1)*c]
		best, mx := 0, row[0]
		for j, v := range row {
			if v > mx {
				best, mx = j, v
			}
		}
		if best == y {
			correct++
		}
		var z float64
		for _, v := range row {
			z += math.Exp(v - mx)
		}
		loss += math.Log(z) + mx - row[y]
	}
	return correct, loss
}
