package stages

import (
	"context"
	"fmt"
	"math"

	"gorgonia.org/tensor"

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

// evaluate runs the feed's evaluation micro-batches forward through the pipeline,
// chunk by chunk, and on the stage that computes the loss scores the
// predictions; other stages return nil.
func (r *Runtime) evaluate(ctx context.Context, tag int) (*EvalResult, error) {
	if r.replica > 0 {
		return nil, nil // the replicas hold replica 0's weights: it evaluates for all
	}
	var res EvalResult
	var input, out, handed *tensor.Dense
	var msg *transport.Tensor
	top := r.layout.Schedule.Topology()
	for _, o := range r.evalOps {
		a := o.Action
		var err error
		switch rt := routeOf(top, r.stage, o); {
		case o.Kind == schedule.RecvAct && rt == routeLocal:
			input, msg, handed = handed, nil, nil
		case o.Kind == schedule.RecvAct:
			input, msg, err = r.link(rt).recvHeld(ctx, int64(tag), a.MicroBatch, top.Tag(o))
		case o.Kind == schedule.SendAct && rt == routeLocal:
			handed = out
		case o.Kind == schedule.SendAct:
			_, _, err = r.link(rt).sendOwned(ctx, sendKind(rt), int64(tag), a.MicroBatch, top.Tag(o), out)
		case o.Kind == schedule.Compute:
			out, err = r.evalForward(a, input, msg, &res)
			input, msg = nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	if !r.holdsLoss() || res.Examples == 0 {
		return nil, nil
	}
	res.Accuracy = float64(res.Correct) / float64(res.Examples)
	res.Loss /= float64(res.Examples)
	what := r.feed.name()
	if r.feed.src.NextToken() {
		res.Perplexity = math.Exp(res.Loss)
		fmt.Fprintf(r.log, "%s loss %.4f, perplexity %.2f, next-token accuracy %.2f%% (%d tokens)\n", what, res.Loss, res.Perplexity, 100*res.Accuracy, res.Examples)
	} else {
		fmt.Fprintf(r.log, "%s accuracy %.2f%% (%d/%d), %s loss %.4f\n", what, 100*res.Accuracy, res.Correct, res.Examples, what, res.Loss)
	}
	return &res, nil
}

// evalForward runs evaluation micro-batch a.MicroBatch forward through chunk
// a.Chunk from input (data on the model's first stage) and releases the
// received msg; on the last model stage it scores the predictions into res,
// elsewhere it returns the activation to send.
func (r *Runtime) evalForward(a schedule.Action, input *tensor.Dense, msg *transport.Tensor, res *EvalResult) (*tensor.Dense, error) {
	e, k := r.engines[a.Chunk], a.MicroBatch
	if e.IsFirst() {
		input = r.newInput(e)
	}
	var targets []int
	rows := 0
	if e.IsFirst() || e.IsLast() {
		x := input
		if !e.IsFirst() {
			x = nil
		}
		targets, rows = r.feed.eval(k, x, e.IsLast())
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
