package stages

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// EvalStep tags the messages of the evaluation pass after training, so they can
// never be taken for a training step's.
const EvalStep = -1

// Options configures one stage process (or the one-process reference).
type Options struct {
	Config *configs.Config
	// Stage is the index into Config.Stages this runtime executes.
	Stage int
	// Reference puts every layer in this one runtime, with no links: the same code
	// path trains the model the pipeline is checked against.
	Reference bool
	RunDir    string
	// Prev and Next are the links to the neighbouring stages; nil at the ends.
	Prev, Next transport.Link
	// Log receives human-readable progress lines.
	Log io.Writer
	// Train and Test are loaded from Config.Data when nil.
	Train, Test *data.Dataset
}

// Runtime executes one stage's actions, step after step.
type Runtime struct {
	cfg           *configs.Config
	stage, stages int // position in the pipeline, and its length
	engine        *Engine
	actions       []schedule.Action
	solver        G.Solver
	prev, next    *peer
	train, test   *data.Dataset
	sampler       *data.Sampler
	runDir        string
	log           io.Writer
	events        *eventLog
	metrics       *os.File

	losses []float64 // this step's micro-batch losses (last stage)
}

// New builds the stage: its slice of the model, its schedule and its data.
func New(o Options) (*Runtime, error) {
	c := o.Config
	r := &Runtime{cfg: c, stage: o.Stage, stages: len(c.Stages), runDir: o.RunDir, log: o.Log}
	if r.log == nil {
		r.log = io.Discard
	}
	blas.SetThreads(c.Compute.BLASThreads)
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	first, last := c.StageLayers(o.Stage)
	if o.Reference {
		r.stage, r.stages, first, last = 0, 1, 0, len(model.Layers)
	}
	if r.engine, err = NewEngine(model, first, last, c.MicroBatchSize(), c.Train.Seed, false); err != nil {
		return nil, fmt.Errorf("stage %d: %w", r.stage, err)
	}
	sched, err := schedule.Build(c.Schedule, r.stages, c.Data.MicroBatches)
	if err != nil {
		return nil, err
	}
	if err := sched.Check(); err != nil {
		return nil, fmt.Errorf("schedule %s: %w", c.Schedule, err)
	}
	r.actions = sched.Actions[r.stage]
	if r.solver, err = NewSolver(c.Train.Optimizer); err != nil {
		return nil, err
	}
	dt, err := transport.ParseDType(model.DType.String())
	if err != nil {
		return nil, err
	}
	if !r.engine.IsFirst() {
		if o.Prev == nil {
			return nil, fmt.Errorf("stage %d: no link to the previous stage", r.stage)
		}
		r.prev = newPeer(o.Prev, transport.Activation, dt, r.engine.InShape(), c.Transport.RecvTimeout)
	}
	if !r.engine.IsLast() {
		if o.Next == nil {
			return nil, fmt.Errorf("stage %d: no link to the next stage", r.stage)
		}
		r.next = newPeer(o.Next, transport.Gradient, dt, r.engine.OutShape(), c.Transport.RecvTimeout)
	}
	if err := r.loadData(o); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Runtime) loadData(o Options) error {
	first, last := r.engine.IsFirst(), r.engine.IsLast()
	var err error
	if r.train = o.Train; r.train == nil {
		if r.train, err = data.LoadFashionMNIST(r.cfg.Data.Dir, "train", first, last); err != nil {
			return err
		}
	}
	if r.test = o.Test; r.test == nil && r.cfg.Train.Evaluate {
		if r.test, err = data.LoadFashionMNIST(r.cfg.Data.Dir, "test", first, last); err != nil {
			return err
		}
	}
	if r.train.Dim != r.engine.Model.Example.TotalSize() && first {
		return fmt.Errorf("data: %s examples have %d features, model.input is %d", r.train.Name, r.train.Dim, r.engine.Model.Example.TotalSize())
	}
	r.sampler, err = data.NewSampler(r.cfg.Train.Seed, r.train.N, r.cfg.Data.BatchSize)
	return err
}

// Engine exposes the stage's compute, for tests and tools.
func (r *Runtime) Engine() *Engine { return r.engine }

// Run trains for the configured steps, evaluates if asked, and saves the stage's
// final weights under RUN_DIR/weights.
func (r *Runtime) Run(ctx context.Context) error {
	if err := r.open(); err != nil {
		return err
	}
	defer r.close()
	first, last := r.engine.First, r.engine.Last-1
	fmt.Fprintf(r.log, "stage %d: layers %d-%d, %s schedule, %d micro-batches of %d, %d steps\n",
		r.stage, first, last, r.cfg.Schedule, r.cfg.Data.MicroBatches, r.cfg.MicroBatchSize(), r.cfg.Train.Steps)
	start := time.Now()
	lastLog := start
	for step := 0; step < r.cfg.Train.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stage %d stopped before step %d: %w", r.stage, step+1, context.Cause(ctx))
		}
		stepStart := time.Now()
		if err := r.trainStep(ctx, step); err != nil {
			return fmt.Errorf("stage %d, step %d: %w", r.stage, step+1, err)
		}
		if err := r.events.flush(); err != nil {
			return err
		}
		if r.engine.IsLast() {
			done := step + 1
			now := time.Now()
			loss := r.stepLoss()
			rate := float64(r.cfg.Data.BatchSize) / now.Sub(stepStart).Seconds()
			if err := r.writeMetric(done, loss, rate, now.Sub(start)); err != nil {
				return err
			}
			if done%r.cfg.Train.LogEvery == 0 || done == r.cfg.Train.Steps {
				window := done % r.cfg.Train.LogEvery
				if window == 0 {
					window = r.cfg.Train.LogEvery
				}
				avg := float64(window*r.cfg.Data.BatchSize) / now.Sub(lastLog).Seconds()
				fmt.Fprintf(r.log, "step %d/%d  loss %.4f  %.0f samples/s\n", done, r.cfg.Train.Steps, loss, avg)
				lastLog = now
			}
		}
	}
	if r.cfg.Train.Evaluate {
		if err := r.evaluate(ctx); err != nil {
			return fmt.Errorf("stage %d, evaluation: %w", r.stage, err)
		}
	}
	if err := r.saveWeights(); err != nil {
		return err
	}
	fmt.Fprintf(r.log, "stage %d: done in %.1fs, peak %d micro-batches stashed\n", r.stage, time.Since(start).Seconds(), r.engine.PeakInFlight())
	return nil
}

func (r *Runtime) open() error {
	for _, d := range []string{"events", "weights"} {
		if err := os.MkdirAll(filepath.Join(r.runDir, d), 0o755); err != nil {
			return err
		}
	}
	var err error
	if r.events, err = openEventLog(profile.EventsFile(r.runDir, r.stage)); err != nil {
		return err
	}
	if r.stage == 0 {
		if err := r.writeRunInfo(); err != nil {
			return err
		}
	}
	if r.engine.IsLast() {
		if r.metrics, err = os.Create(filepath.Join(r.runDir, "metrics.jsonl")); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runtime) close() {
	r.events.close()
	if r.metrics != nil {
		r.metrics.Close()
	}
}

func (r *Runtime) writeRunInfo() error {
	theory, _ := schedule.TheoreticalBubble(r.cfg.Schedule, r.stages, r.cfg.Data.MicroBatches)
	info := profile.RunInfo{Schedule: r.cfg.Schedule, Stages: r.stages, MicroBatches: r.cfg.Data.MicroBatches, Steps: r.cfg.Train.Steps, TheoreticalBubble: theory}
	b, _ := json.MarshalIndent(info, "", "  ")
	return checkpoint.WriteAtomic(filepath.Join(r.runDir, "run.json"), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// trainStep runs this stage's actions for one global batch, then the optimizer.
func (r *Runtime) trainStep(ctx context.Context, step int) error {
	idx := r.sampler.Indices(step)
	r.losses = make([]float64, r.cfg.Data.MicroBatches)
	for _, a := range r.actions {
		var err error
		switch a.Kind {
		case schedule.Forward:
			err = r.forward(ctx, step, a.MicroBatch, idx)
		case schedule.Backward:
			err = r.backward(ctx, step, a.MicroBatch)
		default:
			err = fmt.Errorf("action %v: kind not supported by this runtime", a)
		}
		if err != nil {
			return fmt.Errorf("%v: %w", a, err)
		}
	}
	t0 := time.Now()
	if err := r.engine.Step(r.solver); err != nil {
		return fmt.Errorf("optimizer: %w", err)
	}
	return r.events.add(profile.Event{Stage: r.stage, Step: step, Kind: profile.Optimizer, StartNS: t0.UnixNano(), EndNS: time.Now().UnixNano()})
}

func (r *Runtime) forward(ctx context.Context, step, mb int, idx []int) error {
	waitStart := time.Now()
	rows := idx[mb*r.engine.Batch : (mb+1)*r.engine.Batch]
	input, err := r.input(ctx, int64(step), mb, rows)
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := r.engine.Forward(mb, input, r.targets(r.train, rows))
	if err != nil {
		return err
	}
	var sent int64
	if r.engine.IsLast() {
		r.losses[mb] = scalar(out)
	} else if sent, err = r.next.send(ctx, transport.Activation, int64(step), mb, out); err != nil {
		return err
	}
	return r.events.add(profile.Event{Stage: r.stage, Step: step, Kind: profile.Forward, MB: mb,
		StartNS: start.UnixNano(), EndNS: time.Now().UnixNano(), WaitNS: start.Sub(waitStart).Nanoseconds(),
		BytesSent: sent, Stashed: r.engine.InFlight()})
}

func (r *Runtime) backward(ctx context.Context, step, mb int) error {
	waitStart := time.Now()
	var grad G.Value = r.engine.LossScale(r.cfg.Data.MicroBatches)
	if !r.engine.IsLast() {
		t, err := r.next.recv(ctx, int64(step), mb)
		if err != nil {
			return err
		}
		grad = t
	}
	start := time.Now()
	dx, err := r.engine.Backward(mb, grad)
	if err != nil {
		return err
	}
	var sent int64
	if !r.engine.IsFirst() {
		if sent, err = r.prev.send(ctx, transport.Gradient, int64(step), mb, dx); err != nil {
			return err
		}
	}
	return r.events.add(profile.Event{Stage: r.stage, Step: step, Kind: profile.Backward, MB: mb,
		StartNS: start.UnixNano(), EndNS: time.Now().UnixNano(), WaitNS: start.Sub(waitStart).Nanoseconds(),
		BytesSent: sent, Stashed: r.engine.InFlight()})
}

// input is the micro-batch entering the stage: examples on the first stage, the
// upstream activation elsewhere.
func (r *Runtime) input(ctx context.Context, step int64, mb int, rows []int) (*tensor.Dense, error) {
	if r.engine.IsFirst() {
		return r.examples(r.train, rows), nil
	}
	return r.prev.recv(ctx, step, mb)
}

// examples gathers rows of ds into a micro-batch; rows past the batch (the padding
// of a short last evaluation batch) stay zero.
func (r *Runtime) examples(ds *data.Dataset, rows []int) *tensor.Dense {
	shape := r.engine.InShape()
	t := tensor.New(tensor.Of(r.engine.Model.DType), tensor.WithShape(shape...))
	n := len(rows) * ds.Dim
	switch d := t.Data().(type) {
	case []float32:
		data.GatherImages(ds, rows, d[:n])
	case []float64:
		data.GatherImages(ds, rows, d[:n])
	}
	return t
}

func (r *Runtime) targets(ds *data.Dataset, rows []int) []int {
	if !r.engine.IsLast() {
		return nil
	}
	y := make([]int, len(rows))
	data.GatherLabels(ds, rows, y)
	return y
}

// stepLoss is the mean of the micro-batch losses, summed in micro-batch order so
// the pipeline and the reference add the same numbers in the same order.
func (r *Runtime) stepLoss() float64 {
	var s float64
	for _, l := range r.losses {
		s += l
	}
	return s / float64(len(r.losses))
}

// Metric is one line of metrics.jsonl.
type Metric struct {
	Step          int     `json:"step"`
	Loss          float64 `json:"loss"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	ElapsedSec    float64 `json:"elapsed_s"`
}

func (r *Runtime) writeMetric(step int, loss, rate float64, elapsed time.Duration) error {
	b, _ := json.Marshal(Metric{Step: step, Loss: loss, SamplesPerSec: rate, ElapsedSec: elapsed.Seconds()})
	_, err := r.metrics.Write(append(b, '\n'))
	return err
}

// EvalResult is what eval.json holds.
type EvalResult struct {
	Examples int     `json:"examples"`
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
	Loss     float64 `json:"loss"`
}

// evaluate runs the whole test split forward through the pipeline in micro-batches
// (the last one padded) and, on the last stage, scores the predictions.
func (r *Runtime) evaluate(ctx context.Context) error {
	b := r.engine.Batch
	n := r.test.N
	var res EvalResult
	for k := 0; k*b < n; k++ {
		rows := make([]int, 0, b)
		for i := k * b; i < min(n, (k+1)*b); i++ {
			rows = append(rows, i)
		}
		var input *tensor.Dense
		var err error
		if r.engine.IsFirst() {
			input = r.examples(r.test, rows)
		} else if input, err = r.prev.recv(ctx, EvalStep, k); err != nil {
			return err
		}
		targets := r.targets(r.test, rows)
		if targets != nil {
			targets = append(targets, make([]int, b-len(rows))...)
		}
		out, err := r.engine.Forward(k, input, targets)
		if err != nil {
			return err
		}
		r.engine.Discard(k)
		if !r.engine.IsLast() {
			if _, err := r.next.send(ctx, transport.Activation, EvalStep, k, out); err != nil {
				return err
			}
			continue
		}
		logits, err := r.engine.Logits()
		if err != nil {
			return err
		}
		correct, loss := score(logits, targets[:len(rows)])
		res.Correct += correct
		res.Loss += loss
		res.Examples += len(rows)
	}
	if !r.engine.IsLast() {
		return nil
	}
	res.Accuracy = float64(res.Correct) / float64(res.Examples)
	res.Loss /= float64(res.Examples)
	fmt.Fprintf(r.log, "test accuracy %.2f%% (%d/%d), test loss %.4f\n", 100*res.Accuracy, res.Correct, res.Examples, res.Loss)
	b2, _ := json.MarshalIndent(res, "", "  ")
	return checkpoint.WriteAtomic(filepath.Join(r.runDir, "eval.json"), func(w io.Writer) error {
		_, err := w.Write(append(b2, '\n'))
		return err
	})
}

// score counts correct argmax predictions and sums the cross-entropy of the first
// len(targets) rows of logits.
func score(logits *tensor.Dense, targets []int) (correct int, loss float64) {
	c := logits.Shape()[1]
	vals := asFloat64s(logits)
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

func asFloat64s(t *tensor.Dense) []float64 {
	switch d := t.Data().(type) {
	case []float64:
		return d
	case []float32:
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out
	}
	return nil
}

func scalar(t *tensor.Dense) float64 { return asFloat64s(t)[0] }

// saveWeights writes the stage's parameters to RUN_DIR/weights/stage-<i>.safetensors.
func (r *Runtime) saveWeights() error {
	var ts []checkpoint.Tensor
	for _, p := range r.engine.Params() {
		t := checkpoint.Tensor{Name: p.Name(), Shape: p.Shape().Clone()}
		switch d := p.Value().Data().(type) {
		case []float32:
			t.F32 = d
		case []float64:
			t.F64 = d
		}
		ts = append(ts, t)
	}
	path := filepath.Join(r.runDir, "weights", fmt.Sprintf("stage-%d.safetensors", r.stage))
	meta := map[string]string{"step": fmt.Sprint(r.cfg.Train.Steps), "config_digest": r.cfg.Digest(), "stage": fmt.Sprint(r.stage)}
	if err := checkpoint.Write(path, ts, meta); err != nil {
		return fmt.Errorf("stage %d: saving weights: %w", r.stage, err)
	}
	return nil
}

// NewSolver makes the configured optimizer.
func NewSolver(o configs.Optimizer) (G.Solver, error) {
	switch o.Name {
	case "sgd":
		if o.Momentum > 0 {
			return G.NewMomentum(G.WithLearnRate(o.LR), G.WithMomentum(o.Momentum)), nil
		}
		return G.NewVanillaSolver(G.WithLearnRate(o.LR)), nil
	case "adam":
		return G.NewAdamSolver(G.WithLearnRate(o.LR), G.WithBeta1(o.Beta1), G.WithBeta2(o.Beta2), G.WithEps(o.Eps)), nil
	}
	return nil, fmt.Errorf("unknown optimizer %q", o.Name)
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
