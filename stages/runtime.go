package stages

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// EvalStep tags the messages of the evaluation pass after training, so they can
// never be taken for a training step's.
const EvalStep = -1

// Options configures one stage process (or the one-process reference).
type Options struct {
	// Layout is the stage's layout, the one Connect took; New lays out
	// Config's stage Stage (or the reference) itself when it is nil.
	Layout *Layout
	Config *configs.Config
	// Stage is the index into Config.Stages this runtime executes.
	Stage int
	// Reference puts every layer in this one runtime, with no links: the same code
	// path trains the model the pipeline is checked against.
	Reference bool
	RunDir    string
	// Prev and Next are the links to the neighbouring stages; nil at the ends.
	Prev, Next transport.Link
	// ReplicaPrev and ReplicaNext join the stage's replicas in a ring, from
	// replica r-1 and to replica r+1 (data_parallel > 1; Connect makes them).
	ReplicaPrev, ReplicaNext transport.Link
	// ReplicaIn and ReplicaOut, when set, carry the all-reduces beside
	// ReplicaPrev and ReplicaNext (all_reduce.transport: stream).
	ReplicaIn  *transport.StreamIn
	ReplicaOut *transport.StreamOut
	// Log receives human-readable progress lines.
	Log io.Writer
	// Train, Test and Text are data already loaded, handed to the dataset's
	// kind (fashion-mnist reads Train and Test, text the tokenized corpus
	// Text); what the kind needs and is not handed, it loads from Config.Data.
	Train, Test *data.Dataset
	Text        *data.Text
	// Resume continues from the newest complete checkpoint in RunDir, if any.
	Resume bool
	// Threads is the reference's BLAS thread count; 0 takes
	// Config.ReferenceThreads. Stages take Config.Threads. The runtime's
	// optimizers use it and its run log records it; the process's BLAS
	// library and kernels get it from SetProcessThreads, not from New.
	Threads int
	// Coordinator commits checkpoints for processes that do not share
	// RunDir; nil: RunDir is shared, and stage 0 commits by looking at it.
	Coordinator Coordinator
	// Pause, if set, lets the launcher stop the stage at an agreed step
	// boundary with a checkpoint there (see Pause); nil: only ctx stops it.
	Pause *Pause
	// Rejoin has a worker of async parameter servers, restarted after it
	// left the run, take its place again: the stage trains from step
	// RejoinAt (the steps done before it, 0-based) on, with the weights
	// it pulls from the servers, reading that step's share of the data.
	Rejoin   bool
	RejoinAt int
}

// rejoinStep is the step a rejoining stage trains from, -1 for a stage
// that starts with the run.
func (o Options) rejoinStep() int {
	if o.Rejoin {
		return o.RejoinAt
	}
	return -1
}

// Runtime executes one stage's actions, step after step. A stage holds one engine
// per chunk (virtual stage); chunk c of stage d is model stage c*p + d.
type Runtime struct {
	cfg           *configs.Config
	stage, stages int // position in the pipeline, and its length
	replica       int // which copy of the pipeline (data_parallel)
	// mbBase is the global index of this replica's first micro-batch, and
	// scaleMBs the micro-batches of the whole batch, which the loss is
	// averaged over.
	mbBase, scaleMBs int
	threads          int                // BLAS threads (and elementwise workers) of this process
	replicas         *replicaSync       // the all-reduce among the stage's replicas; nil without
	ps               *psWorker          // the worker's side of the parameter servers; nil without
	chunks           []compute.Stage    // what each chunk's device opened, which the executor drives
	optims           []*optim.Optimizer // one per chunk: state and step counts are per parameter list
	actions          []schedule.Action  // this stage's compute, in order
	ops              []schedule.Op      // and with its communication: what Run executes
	// finalPasses are the compute ops after which a ReduceGrad follows:
	// each chunk's last backward or weight pass of the step.
	finalPasses map[schedule.Action]bool
	stepCtx     context.Context // the training step's, while its ops run
	eval        *evaluator      // runs evaluation passes
	exec        *executor
	schedName   string
	prev, next  *peer
	feed        feed
	runDir      string
	log         io.Writer
	events      *eventLog
	files       *metricFiles // nil but on replica 0 of the stage that computes the loss

	losses []float64 // this step's micro-batch losses (on the stage that computes the loss)
	// gradNorm is the step's global gradient norm, when the run clips by it.
	gradNorm float64
	// judge ranks the evaluations (early stopping, keep_best); nil when
	// the run does neither. trained is the steps the run trained when it
	// stopped early, 0 when it ran them all.
	judge   *evalJudge
	trained int
	// peakStash is the most micro-batch chunks the stage held at once, over
	// all its chunks together: their own peaks need not coincide (zb-v's
	// chunk 0 holds most while chunk 1 holds least).
	peakStash int
	// held keeps each unfinished micro-batch's received tensors, by chunk and
	// micro-batch, until its backward (or weight) pass is done with them.
	held map[[2]int]held
	// inputs keeps, on the first model stage, each unfinished micro-batch's
	// data input; spareInputs those of finished ones whose memory nothing
	// refers to any more. The next micro-batch's data is gathered into a
	// spare one rather than a fresh allocation, which the kernel would zero
	// and fault in each time (400 KB for 128 Fashion-MNIST images).
	inputs      map[int]*tensor.Dense
	spareInputs []*tensor.Dense
	// dataOrder is the forwards that read the feed, in the order the stage
	// runs them, and dataIndex their places in it (dataForwards). fetching
	// is the read under way for the next of them (nil: none), fed what the
	// last one's read cost (see takeData).
	dataOrder []schedule.Action
	dataIndex map[schedule.Action]int
	fetching  *dataFetch
	fed       fedData
	live      *Metrics

	tied   [][2]string // parameter pairs whose gradients are summed before each step
	resume bool
	rejoin int      // the step a worker restarted in an async run trains from (Options.Rejoin); -1: none
	act    activity // what the stage is doing, for status queries
	layout *Layout
	ckpt   *checkpointer
	pause  *Pause // nil: the stage is never paused
}

// New builds the stage: its slices of the model, its schedule and its data.
func New(o Options) (*Runtime, error) {
	l, err := o.layout()
	if err != nil {
		return nil, err
	}
	c, model, lowered, ranges := l.Config, l.Model, l.Schedule, l.Ranges
	r := &Runtime{cfg: c, stage: l.Stage, stages: l.Stages, replica: l.Replica, runDir: o.RunDir, log: o.Log, live: newMetrics(l.Stage), resume: o.Resume, rejoin: o.rejoinStep(), layout: l, pause: o.Pause}
	r.mbBase, r.scaleMBs = l.Replica*c.Data.MicroBatches, l.Replicas*c.Data.MicroBatches
	if r.log == nil {
		r.log = io.Discard
	}
	r.act.init()
	if err := blas.Err(); err != nil {
		return nil, err
	}
	if err := blas.Satisfies(c.Compute.BLASKernels); err != nil {
		return nil, err
	}
	threads := c.Threads(l.Stage)
	if l.Reference {
		threads = cmp.Or(o.Threads, c.ReferenceThreads())
	}
	r.threads = threads // the process's (SetProcessThreads), recorded in the run log
	sched := lowered.Compute()
	r.actions, r.ops, r.schedName = sched.Actions[r.stage], lowered.Ops[r.stage], sched.Name
	r.finalPasses = finalPasses(r.ops)
	dev, index, err := r.device()
	if err != nil {
		return nil, err
	}
	for chunk, lr := range ranges {
		opts := engine.OptionsFor(r.actions, chunk, c.RecomputesSelective(r.stage))
		if l.Reference {
			opts.Selective = false // the reference keeps every activation: recomputation is checked against it
		}
		s, err := dev.Open(compute.Spec{Model: model, First: lr[0], Last: lr[1], Batch: c.MicroBatchSize(), Seed: c.Train.Seed, Options: opts, Index: index})
		if err != nil {
			return nil, fmt.Errorf("stage %d chunk %d: %w", r.stage, chunk, err)
		}
		if _, ok := s.(compute.Drawing); !ok && model.DrawsInTraining(lr[0], lr[1]) {
			return nil, fmt.Errorf("stage %d chunk %d: layers [%d, %d) hold dropout, whose masks device %q cannot draw: its compute.Stage is not a compute.Drawing", r.stage, chunk, lr[0], lr[1], c.Stages[r.stage].Device)
		}
		r.chunks = append(r.chunks, s)
		o, err := s.NewOptimizer(c.Train.Optimizer)
		if err != nil {
			return nil, err
		}
		o.SetWorkers(threads) // the cores the process's products get
		r.optims = append(r.optims, o)
	}
	r.dataOrder, r.dataIndex = dataForwards(r.actions, func(c int) bool { return r.chunks[c].IsFirst() || r.chunks[c].IsLast() })
	if r.holdsLoss() && r.replica == 0 {
		r.files = newMetricFiles(r.runDir)
	}
	r.judge = newEvalJudge(c)
	r.ckpt = &checkpointer{cfg: c, root: CheckpointDir(r.runDir), stage: r.stage, stages: r.stages, replica: r.replica, coord: o.Coordinator,
		chunks: r.chunks, optims: r.optims, log: r.log, name: r.name(), judge: r.judge}
	if err := r.initFrom(model); err != nil {
		return nil, err
	}
	if err := r.attach(o, model); err != nil {
		return nil, err
	}

	if r.replicas, err = newReplicaSync(o, l, c, r.chunks, &r.act, r.live); err != nil {
		return nil, err
	}
	if err := r.replicas.shardOptimizers(r.optims); err != nil {
		return nil, fmt.Errorf("%s: all_reduce.shard_optimizer: %w", r.name(), err)
	}
	if r.replicas != nil && r.replicas.sharded {
		r.ckpt.gather = func(ctx context.Context, step int) (slotState, error) {
			return r.replicas.gatherState(ctx, step, r.optims)
		}
	}
	if err := r.checkRejoin(o.Resume); err != nil {
		return nil, err
	}
	if err := r.agreeWithServers(); err != nil {
		return nil, err
	}
	if r.ps, err = newPSWorker(l, r.chunks, r.rejoin); err != nil {
		return nil, err
	}
	if r.ps != nil {
		r.ckpt.servers = c.ParameterServers.Count
	}
	if err := r.loadData(o, model); err != nil {
		return nil, err
	}
	r.eval = newEvaluator(r, lowered.Topology())
	r.exec = newExecutor(r.stage, r.stages, r.ops, r.prev, r.next, r, &r.act)
	r.exec.top, r.exec.hold, r.exec.record = lowered.Topology(), r.hold, r.record
	if err := r.exec.check(slices.Concat(r.ops, r.eval.ops)); err != nil {
		return nil, err
	}
	return r, nil
}

// checkRejoin refuses a rejoin that cannot be: only a worker of async
// parameter servers leaves a run and comes back, from no checkpoint, at a
// step the run has.
func (r *Runtime) checkRejoin(resume bool) error {
	c := r.cfg
	switch {
	case r.rejoin < 0:
		return nil
	case !c.PSEnabled() || c.ParameterServers.Mode != "async" || r.layout.Reference:
		return fmt.Errorf("%s: only a worker of async parameter servers rejoins a run", r.name())
	case resume:
		return fmt.Errorf("%s: a rejoining worker resumes from no checkpoint: it pulls the servers' weights", r.name())
	case r.rejoin >= c.Train.Steps:
		return fmt.Errorf("%s: rejoining at step %d, past the run's %d steps", r.name(), r.rejoin+1, c.Train.Steps)
	}
	return nil
}

// device is the compute device stages[i].device names for the stage, from
// package compute's registry. The one-process reference computes on the
// cpu, which every build has.
func (r *Runtime) device() (compute.Device, int, error) {
	name := ""
	if !r.layout.Reference {
		name = r.cfg.Stages[r.stage].Device
	}
	d, index, err := compute.Lookup(name)
	if err != nil {
		return nil, 0, fmt.Errorf("stages[%d].device: %w", r.stage, err)
	}
	return d, index, nil
}

// layout is the stage's Layout: the one given, or laid out from the config.
func (o Options) layout() (*Layout, error) {
	switch {
	case o.Layout != nil:
		return o.Layout, nil
	case o.Reference:
		return ReferenceLayout(o.Config)
	}
	return NewLayout(o.Config, o.Stage)
}

// attach wraps the links the stage's ops travel on (see routeOf): under Loop
// placement from the previous stage unless every chunk is the model's first,
// to the next unless every chunk is its last, and with chunks or tied weights
// stage 0 and the last stage are linked too (the ring); under V, only the
// neighbours the V passes through.
func (r *Runtime) attach(o Options, model *models.Model) error {
	needPrev, needNext := false, false
	top := r.layout.Schedule.Topology()
	for _, op := range r.ops {
		switch routeOf(top, r.stage, op) {
		case routePrev:
			needPrev = true
		case routeNext:
			needNext = true
		}
		if op.Kind == schedule.ClipNorm {
			// The norm's parts go down the pipeline, the total back.
			needPrev, needNext = needPrev || r.stage > 0, needNext || r.stage < r.stages-1
		}
	}
	r.tied = model.Tied
	if needPrev {
		if o.Prev == nil {
			return fmt.Errorf("stage %d: no link to the previous stage", r.stage)
		}
		r.prev = newPeer(o.Prev, transport.Activation, r.cfg.Transport.RecvTimeout)
		r.prev.metrics, r.prev.side, r.prev.act = r.live, "prev", &r.act
		r.live.addLink("prev", o.Prev)
		r.prev.microBatches = r.cfg.Data.MicroBatches
		r.prev.vshape = top.Placement == schedule.V
	}
	if needNext {
		if o.Next == nil {
			return fmt.Errorf("stage %d: no link to the next stage", r.stage)
		}
		r.next = newPeer(o.Next, transport.Gradient, r.cfg.Transport.RecvTimeout)
		r.next.metrics, r.next.side, r.next.act = r.live, "next", &r.act
		r.live.addLink("next", o.Next)
		r.next.microBatches = r.cfg.Data.MicroBatches
		r.next.vshape = top.Placement == schedule.V
	}
	return nil
}

// holdsFirst and holdsLoss report whether one of the stage's chunks is the
// model's first model stage, which reads the data, or its last, which draws
// the targets and computes the loss: stage 0 and the last stage under Loop
// placement, stage 0 for both under V.
func (r *Runtime) holdsFirst() bool {
	return slices.ContainsFunc(r.chunks, compute.Stage.IsFirst)
}

func (r *Runtime) holdsLoss() bool {
	return slices.ContainsFunc(r.chunks, compute.Stage.IsLast)
}

func (r *Runtime) loadData(o Options, model *models.Model) error {
	f, err := r.openFeed(o, r.cfg.DataModel(model))
	r.feed = f
	return err
}

// Metrics is the stage's live metrics, for ServeMetrics.
func (r *Runtime) Metrics() *Metrics { return r.live }

// chunk is chunk c's compute as its device opened it, which the executor
// drives through compute.Stage.
func (r *Runtime) chunk(c int) compute.Stage { return r.chunks[c] }

// Chunks exposes the stage's compute, one per chunk as its device opened
// it, for tests and tools.
func (r *Runtime) Chunks() []compute.Stage { return r.chunks }

// inFlight is the number of micro-batch chunks whose activations the stage holds.
func (r *Runtime) inFlight() int {
	n := 0
	for _, c := range r.chunks {
		n += c.InFlight()
	}
	return n
}

// Run trains for the configured steps, evaluates if asked, and saves the stage's
// final weights under RUN_DIR/weights.
func (r *Runtime) Run(ctx context.Context) error {
	err := r.run(ctx)
	r.ps.end(ctx, err)
	return err
}

func (r *Runtime) run(ctx context.Context) error {
	first := 0
	if r.resume {
		var err error
		if first, err = r.ckpt.restore(ctx); err != nil {
			return fmt.Errorf("stage %d: resuming: %w", r.stage, err)
		}
		if err := r.rewindLogs(first); err != nil {
			return fmt.Errorf("stage %d: resuming: %w", r.stage, err)
		}
	}
	if r.rejoin >= 0 {
		first = r.rejoin
		fmt.Fprintf(r.log, "%s: rejoins the run at step %d, with the servers' current weights\n", r.name(), first+1)
	}
	if err := r.ckpt.clearAfter(first); err != nil {
		return err
	}
	if err := r.open(); err != nil {
		return err
	}
	defer r.close()
	defer r.replicas.start(ctx)()
	defer r.stopFetching()
	// Commits still running when training stops are given up: a checkpoint whose
	// manifest is not written is never resumed from.
	commitCtx, stopCommits := context.WithCancel(ctx)
	defer func() {
		stopCommits()
		r.ckpt.wait()
	}()
	var layers []string
	for _, e := range r.chunks {
		first, last := e.Layers()
		layers = append(layers, fmt.Sprintf("%d-%d", first, last-1))
	}
	fmt.Fprintf(r.log, "%s: layers %s, %s schedule, %d micro-batches of %d, %d steps; %s\n",
		r.name(), strings.Join(layers, " and "), r.cfg.Schedule, r.cfg.Data.MicroBatches, r.cfg.MicroBatchSize(), r.cfg.Train.Steps, blas.Describe(r.threads))
	if line := r.replicas.shardLine(r.optims); line != "" {
		fmt.Fprintf(r.log, "%s: %s\n", r.name(), line)
	}
	start := time.Now()
	lastLog := start
	var err error
	var final *EvalResult // the final evaluation, once run (nil on all but the last stage)
	finalDone := false
	if r.pause != nil {
		r.pause.begin(first)
	}
	for step := first; step < r.cfg.Train.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("stage %d stopped before step %d: %w", r.stage, step+1, context.Cause(ctx))
		}
		if stop, err := r.pause.enter(ctx, step); err != nil {
			return fmt.Errorf("stage %d stopped before step %d: %w", r.stage, step+1, err)
		} else if stop {
			return r.stopAfter(ctx, commitCtx, first, step)
		}
		stepStart := time.Now()
		if err := r.trainStep(ctx, step); err != nil {
			if nf := asNonFinite(err); nf != nil {
				return nf // names its stage and step already
			}
			return fmt.Errorf("stage %d, step %d: %w", r.stage, step+1, err)
		}
		r.live.step(time.Since(stepStart), r.cfg.Data.MicroBatches*r.cfg.MicroBatchSize())
		if err := r.events.flush(); err != nil {
			return err
		}
		done := step + 1
		now := time.Now()
		// Metrics (and a periodic evaluation) come before the checkpoint, so a
		// run resumed from it has logged every step up to it.
		var val *EvalResult
		evaluated, tag := false, evalTag(done)
		if every := r.cfg.Train.EvalEvery; every > 0 && done%every == 0 && done < r.cfg.Train.Steps {
			if val, err = r.evaluate(ctx, tag); err != nil {
				return fmt.Errorf("stage %d, evaluation after step %d: %w", r.stage, done, err)
			}
			evaluated = true
		} else if r.evaluatesLast(done) {
			// A run that logs evaluations has its final one in metrics.jsonl
			// too, not only in eval.json.
			if val, err = r.evaluate(ctx, EvalStep); err != nil {
				return fmt.Errorf("stage %d, evaluation: %w", r.stage, err)
			}
			final, finalDone, evaluated, tag = val, true, true, EvalStep
		}
		stopEarly := false
		if evaluated && r.judge != nil {
			if stopEarly, err = r.judgeEval(ctx, done, tag, val); err != nil {
				return fmt.Errorf("stage %d, after step %d: %w", r.stage, done, err)
			}
		}
		if r.holdsLoss() && r.replica == 0 {
			loss := r.stepLoss()
			rate := float64(r.cfg.Data.BatchSize) / now.Sub(stepStart).Seconds()
			m := Metric{Step: done, Loss: loss, SamplesPerSec: rate, ElapsedSec: now.Sub(start).Seconds(), Eval: val}
			if r.cfg.Train.ClipGradNorm > 0 {
				m.GradNorm = &r.gradNorm
			}
			if !r.cfg.Train.LRSchedule.Constant() {
				lr := r.cfg.LearningRate(int64(done - 1))
				m.LR = &lr
			}
			if err := r.files.step(m); err != nil {
				return err
			}
			if done%r.cfg.Train.LogEvery == 0 || done == r.cfg.Train.Steps {
				window := done % r.cfg.Train.LogEvery
				if window == 0 {
					window = r.cfg.Train.LogEvery
				}
				avg := float64(window*r.cfg.Data.BatchSize) / now.Sub(lastLog).Seconds()
				fmt.Fprintln(r.log, progressLine(done, r.cfg.Train.Steps, first, loss, avg, now.Sub(start), r.tokensPerExample()))
				lastLog = now
			}
		}
		if r.checkpointsAfter(done) || (stopEarly && r.cfg.Checkpoint.Every > 0 && r.ckpt.takesPart()) {
			if err := r.ckpt.save(commitCtx, done); err != nil {
				return err
			}
		}
		if stopEarly {
			r.trained = done
			if r.cfg.Train.Evaluate && !finalDone {
				// The evaluation that stopped the run is its final one.
				final, finalDone = val, true
			}
			break
		}
	}
	if r.cfg.Train.Evaluate && !finalDone {
		if final, err = r.evaluate(ctx, EvalStep); err != nil {
			return fmt.Errorf("stage %d, evaluation: %w", r.stage, err)
		}
	}
	if r.replica > 0 {
		// Replica 0 evaluates, and writes what the replicas share.
		r.ckpt.await(ctx)
		fmt.Fprintf(r.log, "%s: done in %.1fs\n", r.name(), time.Since(start).Seconds())
		return nil
	}
	if r.cfg.Train.Evaluate {
		if err := r.files.final(final); err != nil {
			return err
		}
	}
	if err := r.saveWeights(); err != nil {
		return err
	}
	r.ckpt.await(ctx)
	fmt.Fprintf(r.log, "%s: done in %.1fs, peak %s stashed\n", r.name(), time.Since(start).Seconds(), words.Count(r.peakStash, "micro-batch"))
	return nil
}

// checkpointsAfter says whether this process takes part in a checkpoint
// after step done in the course of training: every checkpoint.every steps
// and after the last.
func (r *Runtime) checkpointsAfter(done int) bool {
	every := r.cfg.Checkpoint.Every
	return every > 0 && r.ckpt.takesPart() && (done%every == 0 || done == r.cfg.Train.Steps)
}

// stopAfter ends a paused stage at the agreed step done (see Pause): it
// writes the checkpoint of done, whatever checkpoint.every says (even 0:
// the checkpoint is what lets `launch --resume` continue the run), unless
// training wrote it already or the stage trained nothing since first; then
// it waits for the commit. The final evaluation and weights are left to the
// resumed run. With parameter servers there is none: the servers keep their
// state only at checkpoint.every's steps, so the run resumes from the last
// of those.
func (r *Runtime) stopAfter(ctx, commitCtx context.Context, first, done int) error {
	if done > first && r.ckpt.takesPart() && !r.checkpointsAfter(done) && r.ps == nil {
		if err := r.ckpt.save(commitCtx, done); err != nil {
			return err
		}
	}
	r.ckpt.await(ctx)
	return fmt.Errorf("%s stopped after step %d: %w", r.name(), done, ErrPaused)
}

func (r *Runtime) open() error {
	for _, d := range []string{"events", "weights"} {
		if err := runlog.MkdirAll(filepath.Join(r.runDir, d)); err != nil {
			return err
		}
	}
	var err error
	// A rejoining worker keeps the events of its processes' first life.
	if r.events, err = openEventLog(r.runDir, r.stage, r.replica, r.resume || r.rejoin >= 0); err != nil {
		return err
	}
	if r.replica > 0 {
		return nil
	}
	if r.stage == 0 {
		if err := r.writeRunInfo(); err != nil {
			return err
		}
	}
	return r.files.open(r.resume)
}

func (r *Runtime) close() {
	r.events.close()
	r.files.close()
}

// evaluatesLast reports whether the evaluation after step done, the last, is
// run inside the step loop: when evaluations are logged every eval_every steps
// and either the final one is wanted (train.evaluate) or done is a multiple.
func (r *Runtime) evaluatesLast(done int) bool {
	every := r.cfg.Train.EvalEvery
	return done == r.cfg.Train.Steps && every > 0 && (r.cfg.Train.Evaluate || done%every == 0)
}

// progressLine is the line a stage logs every train.log_every steps: the
// step, the loss, the throughput of the last steps (in tokens as well for a
// language model, whose examples hold tokensPerExample > 1 targets) and,
// before the last step, when the run should end at the pace of the steps
// this process ran (from step first on, evaluations included).
func progressLine(done, steps, first int, loss, samplesPerSec float64, elapsed time.Duration, tokensPerExample int) string {
	line := fmt.Sprintf("step %d/%d  loss %.4f  %.0f samples/s", done, steps, loss, samplesPerSec)
	if tokensPerExample > 1 {
		line += fmt.Sprintf(" (%.0f tokens/s)", samplesPerSec*float64(tokensPerExample))
	}
	if ran := done - first; done < steps && ran > 0 {
		eta := time.Duration(float64(elapsed) / float64(ran) * float64(steps-done))
		line += "  ETA " + words.Duration(eta)
	}
	return line
}

// tokensPerExample is the targets one example yields: the context of a
// language model, 1 for a classifier.
func (r *Runtime) tokensPerExample() int { return r.layout.Model.Targets() }

// trainStep runs this stage's actions for one global batch, then the optimizer.
func (r *Runtime) trainStep(ctx context.Context, step int) error {
	r.losses = make([]float64, r.layout.Schedule.MicroBatches)
	r.stepCtx = ctx
	if err := r.exec.run(ctx, step); err != nil {
		return err
	}
	if err := r.awaitReductions(ctx, step); err != nil {
		return err
	}
	if err := r.gatherLosses(ctx, step); err != nil {
		return err
	}
	if err := r.checkSummedGradients(ctx, step); err != nil {
		return err
	}
	if r.ps != nil {
		return r.psStep(ctx, step) // the servers step the optimizer
	}
	t0 := time.Now()
	lr := r.cfg.LearningRate(int64(step)) // the schedule's, the same on every stage and replica
	for i := range r.chunks {
		r.optims[i].SetLR(lr)
		if err := r.chunk(i).Step(r.optims[i]); err != nil {
			return fmt.Errorf("optimizer: %w", err)
		}
	}
	r.live.action(runlog.Optimizer, time.Since(t0), 0, r.inFlight())
	if err := r.events.add(runlog.Event{Stage: r.stage, Replica: r.replica, Step: step, Kind: runlog.Optimizer, StartNS: t0.UnixNano(), EndNS: time.Now().UnixNano()}); err != nil {
		return err
	}
	if err := r.replicas.shareWeights(ctx, step); err != nil {
		return err
	}
	return r.replicas.check(ctx, step)
}

// name is how the stage names itself in logs and errors.
func (r *Runtime) name() string {
	if r.layout.Reference {
		return fmt.Sprintf("stage %d", r.stage)
	}
	return r.cfg.ProcessName(r.stage, r.replica)
}

// hold keeps msg (nil: nothing to keep) until micro-batch mb of chunk is finished.
func (r *Runtime) hold(chunk, mb int, msg *transport.Tensor) {
	if msg == nil {
		return
	}
	if r.held == nil {
		r.held = map[[2]int]held{}
	}
	k := [2]int{chunk, mb}
	r.held[k] = append(r.held[k], msg)
}

// finish releases what micro-batch mb of chunk received, and on the first
// model stage its data input, now that its backward is done.
func (r *Runtime) finish(chunk, mb int) {
	e := r.chunk(chunk)
	k := [2]int{chunk, mb}
	if h, ok := r.held[k]; ok {
		delete(r.held, k)
		releaseHeld(e, h)
	}
	if in, ok := r.inputs[mb]; ok && e.IsFirst() {
		delete(r.inputs, mb)
		if e.Unshare(engine.Bytes(in)) {
			r.spareInputs = append(r.spareInputs, in)
		}
	}
}

// spareInput is a buffer for a micro-batch's data on the first model
// stage: a spare one (see Runtime.inputs) or a new one.
func (r *Runtime) spareInput(e compute.Stage) *tensor.Dense {
	if n := len(r.spareInputs); n > 0 {
		in := r.spareInputs[n-1]
		r.spareInputs = r.spareInputs[:n-1]
		return in
	}
	return r.newInput(e)
}

// keepInput keeps micro-batch mb's data input until the micro-batch is
// finished.
func (r *Runtime) keepInput(mb int, in *tensor.Dense) {
	if r.inputs == nil {
		r.inputs = map[int]*tensor.Dense{}
	}
	r.inputs[mb] = in
}

// newInput is a zeroed input micro-batch for the first model stage.
func (r *Runtime) newInput(e compute.Stage) *tensor.Dense {
	return tensor.New(tensor.Of(r.layout.Model.DType), tensor.WithShape(e.InShape()...))
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

func scalar(t *tensor.Dense) float64 { return engine.Float64s(t)[0] }

// agreeWithServers settles, for a resumed stage whose parameter servers are
// ranks of the job, the step every rank resumes from before the stage says
// hello to the servers: each server waits for that agreement to restore
// its shard, and answers no hello before. Within connect_timeout, as the
// hello.
func (r *Runtime) agreeWithServers() error {
	if !r.resume || r.ckpt.coord == nil || !r.cfg.PSRanks() || r.layout.Reference {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Transport.ConnectTimeout)
	defer cancel()
	if err := r.ckpt.agree(ctx); err != nil {
		return fmt.Errorf("%s: resuming: %w", r.name(), err)
	}
	return nil
}
