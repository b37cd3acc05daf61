package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/predict"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/timeline"
)

const simulateLong = `Predict each schedule's makespan, bubble and stashed memory for a config,
before launching anything.

The first lines give each stage's cost per micro-batch: F (forward), B (full
backward) and, when the model can split its backward, I (input gradient) and
W (weight gradient), then the transfer time between stages. --costs says
where they come from: "measure" times each stage here (the median of --reps
runs), a run directory takes the mean of each action in its events, and
f=F,b=B[,w=W] gives every stage the same costs in ms. A cost that was not
measured is marked with * and explained on a line of its own: I and W are
assumed B/2 each when the run (or --costs without w=) gave none, B is taken
as I + W when the run split every backward, and the transfer is estimated
from the activation size unless a run measured it or --transfer gives it.
With several chunks per stage (interleaved, zb-v), "measure" and a run
directory also give each chunk's own costs, on lines below its stage's, and
the schedules that run the config's chunks are simulated with them (a V's
chunks on one stage are the model's first and last layers, rarely equal).
"measure" times one stage at a time; when the config's stages on this
machine need more cores than it has (their BLAS threads, every replica's; or
several are pinned to one CPU), they share them in the run, and the
simulation shares them too, but only while they compute at once: stages
computing together on C cores with T threads between them each run at C/T
of their measured speed (at full speed when T <= C), and a stage idling in
the bubble leaves its cores to the others. A "cores:" line says which
stages share which cores. Costs from a run directory already hold the
sharing of that run, and given costs are taken as they are: neither is
shared again.

Then, for each schedule: the makespan and mean bubble, each stage's busy time,
bubble and peak stashed activations, a text timeline (a picture, one column
per time slot), and the schedule's actions as a grid:

  # 1f1b: actions per stage, in the grid form --schedule-file and schedule_file read
  stage 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 ...

Those lines, copied into a file (any extension but .csv, .yaml and .yml),
load back as the same schedule: edit the order and simulate it with
--schedule-file, or run it with schedule: custom. When zb-h1 is simulated,
a last line compares it with 1f1b on the same costs and says plainly
whether it helps.

A schedule the config's model cannot run (zb-h1 needs every layer to split
its backward) is refused, as pipetrain validate and launch refuse it: named
with --schedule, it is an error; under --schedule all, it is listed as not
applicable.

With data-parallel replicas (data_parallel in the config, or --replicas R to
try another count on the same global batch: each replica then takes
batch_size/R samples a step), the replicas of each stage sum its gradients
with a ring all-reduce that starts when the stage's last backward of each
chunk is done and runs while it computes on. It is charged
2(R-1)/R x bytes / bandwidth plus a latency per message (2(R-1) per bucket of
all_reduce.bucket_bytes): --allreduce-bandwidth and --allreduce-latency give
the ring's figures; --allreduce-bandwidth measure times R ranks here over
gRPC links on loopback and fits both (the latency too unless given); left
out, they are those the transfer estimate takes for gRPC on loopback
(2 GB/s, 100 us), marked *. The header then gives each
stage's gradient bytes and all-reduce time, and each schedule the step time and
samples per second of the stages x replicas grid, with each stage's all-reduce
and how much of it the computation does not hide (exposed).

The config's all_reduce.algorithm is charged as the collective runs it
(docs/data-parallel.md): reduce-to-one as whole buckets along 2(R-1) hops;
hierarchical step by step on the hosts' layout (each stage's addresses, or
--replicas-per-host N consecutive replicas a host), the links across hosts at
the --allreduce figures and those within a host at --within-host-bandwidth
and --within-host-latency (when only the first are known, they are used for
both, and said so). all_reduce.overlap layer starts each bucket during the
chunk's last weight pass, once the layers it lies in are done (a layer's share
of the pass taken as its share of the chunk's gradient bytes). With
parameter_servers, each stage's push of its gradients and pull of its weights
is charged when its step ends, each server's link carrying every worker's
share of the bytes it holds, at the --allreduce figures
(docs/parameter-servers.md).`

// simulateOptions are simulate's flags.
type simulateOptions struct {
	config       string
	schedules    string // "all" or names separated by commas
	schedulesSet bool   // --schedule was given
	scheduleFile string
	costs        string
	svg          string
	transfer     time.Duration
	transferSet  bool // --transfer was given
	reps         int
	lowered      bool

	replicas  int // --replicas; 0 when not given
	ring      ringFlags
	within    ringFlags // --within-host-bandwidth and --within-host-latency
	perHost   int       // --replicas-per-host; 0: the config's addresses
	recompute string    // --recompute: every stage's mode; "" keeps the config's
}

func simulateCmd() *cobra.Command {
	var o simulateOptions
	c := &cobra.Command{
		Use:   "simulate --config FILE [--schedule all|NAME,...] [--costs measure|RUN_DIR|f=F,b=B[,w=W]]",
		Short: "Predict each schedule's makespan, bubble and stashed memory for a config, before launching anything",
		Example: `  # every schedule on costs measured here
  pipetrain simulate --config configs/fmnist-mlp-4stage.yaml

  # one schedule on a past run's costs, with its timeline as an SVG
  pipetrain simulate --config configs/fmnist-mlp-4stage.yaml --schedule zb-h1 --costs runs/mlp4 --svg zb.svg

  # data-parallel replicas, the ring timed on this machine
  pipetrain simulate --config configs/fmnist-mlp-2x2.yaml --allreduce-bandwidth measure`,
		Long: simulateLong,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.schedulesSet = cmd.Flags().Changed("schedule")
			o.transferSet = cmd.Flags().Changed("transfer")
			o.ring.latencySet = cmd.Flags().Changed("allreduce-latency")
			o.within.latencySet = cmd.Flags().Changed("within-host-latency")
			if cmd.Flags().Changed("replicas") && o.replicas < 1 {
				return fmt.Errorf("--replicas %d: need at least 1", o.replicas)
			}
			if cmd.Flags().Changed("replicas-per-host") && o.perHost < 1 {
				return fmt.Errorf("--replicas-per-host %d: need at least 1", o.perHost)
			}
			return runSimulate(cmd.OutOrStdout(), o)
		},
	}
	c.Flags().StringVarP(&o.config, "config", "c", "", "run config (YAML)")
	c.Flags().StringVar(&o.schedules, "schedule", "all", "schedules to simulate: all, or built-in names separated by commas ("+strings.Join(schedule.Names(), ", ")+")")
	c.Flags().StringVar(&o.scheduleFile, "schedule-file", "", "simulate a schedule written by hand (.csv, .yaml, or the grid simulate prints), after checking it")
	c.Flags().StringVar(&o.costs, "costs", "measure", "action costs: measure (time the config's stages here), a run directory (its events), or f=F,b=B[,w=W] in ms (w defaults to b/2)")
	c.Flags().DurationVar(&o.transfer, "transfer", 0, "time to move one activation between stages (default: a run's measured mean link delay with --costs RUN_DIR, else estimated from its size at 2 GB/s plus 100us)")
	c.Flags().BoolVar(&o.lowered, "lowered", false, "also print each schedule lowered: its actions with the sends, receives and gradient reductions the stages execute")
	c.Flags().IntVar(&o.reps, "reps", 5, "measurements per action when --costs measure (the median is used)")
	c.Flags().StringVar(&o.svg, "svg", "", "write each schedule's timeline as an SVG: FILE.svg gets the schedule name added before .svg")
	c.Flags().IntVar(&o.replicas, "replicas", 0, "data-parallel replicas of the pipeline, on the same global batch (default: the config's data_parallel)")
	c.Flags().StringVar(&o.recompute, "recompute", "", "simulate every stage with this activation recomputation ("+strings.Join(configs.RecomputeModes, ", ")+"; default: each stage's stages[i].recompute)")
	c.Flags().StringVar(&o.ring.bandwidth, "allreduce-bandwidth", "", ringBandwidthUsage+"; an assumed figure is marked *")
	c.Flags().DurationVar(&o.ring.latency, "allreduce-latency", defaultAllReduceLatency, "cost of each message of the all-reduce ring (default as the transfer estimate takes it, marked *)")
	addHostFlags(c, &o.within, &o.perHost)
	c.MarkFlagRequired("config")
	return c
}

// planned is one schedule simulate was asked for: built, or not applicable to
// the config (under --schedule all) and why.
type planned struct {
	name  string // the built-in's name; "" for --schedule-file
	sched *schedule.Schedule
	skip  string
}

func runSimulate(w io.Writer, o simulateOptions) error {
	cfg, err := configs.Load(o.config)
	if err != nil {
		return err
	}
	model, err := models.Build(cfg.Model)
	if err != nil {
		return err
	}
	// Settle what to simulate before measuring anything: a bad request fails fast.
	if o.transferSet && o.transfer < 0 {
		return fmt.Errorf("--transfer %v: must be 0 or more", o.transfer)
	}
	configured := cfg.Replicas()
	if err := setReplicas(cfg, o); err != nil {
		return err
	}
	if err := setRecompute(cfg, model, o.recompute); err != nil {
		return err
	}
	repl, err := newReplication(cfg, model, o, configured)
	if err != nil {
		return err
	}
	plans, err := simulationPlan(cfg, model, o)
	if err != nil {
		return err
	}
	costs, err := predict.ResolveCosts(cfg, model, o.costs, o.reps)
	if err != nil {
		return err
	}
	var transfer *time.Duration
	if o.transferSet {
		transfer = &o.transfer
	}
	costs.SetTransfer(cfg, model, transfer)
	printCosts(w, costs, cfg, predict.Splittable(model))
	repl.print(w)

	stash := predict.MemoryPredictor(cfg, model)
	var zb, oneF *schedule.Timeline
	for _, p := range plans {
		if p.sched == nil {
			fmt.Fprintf(w, "\n%s: not applicable here: %s\n", p.name, p.skip)
			continue
		}
		tl, err := simulateOne(w, p.sched, repl.Costs(costs.ForSchedule(p.sched), p.sched.Chunks), stash, o.svg, o.lowered, trainingPasses(cfg, model), repl)
		if err != nil {
			return err
		}
		switch p.name {
		case "zb-h1":
			zb = tl
		case "1f1b":
			oneF = tl
		}
	}
	if zb == nil {
		return nil
	}
	if oneF == nil { // compare with 1F1B all the same, on the same costs
		s, err := schedule.Build("1f1b", len(cfg.Stages), cfg.Data.MicroBatches, 1)
		if err != nil {
			return err
		}
		if oneF, err = schedule.Simulate(s, repl.Costs(costs.Costs, 1)); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\n%s\n", zbVerdict(zb, oneF, costs))
	return nil
}

// setRecompute gives every stage of cfg the recomputation mode --recompute
// names, validated as the config's own key is.
func setRecompute(cfg *configs.Config, model *models.Model, mode string) error {
	if mode == "" {
		return nil
	}
	for i := range cfg.Stages {
		cfg.Stages[i].Recompute = mode
	}
	if err := cfg.ValidateRecompute(model); err != nil {
		return fmt.Errorf("--recompute %s: %w", mode, err)
	}
	return nil
}

// simulationPlan resolves --schedule and --schedule-file into the schedules to
// simulate. A schedule named with --schedule that is unknown, does not fit the
// config or that the model cannot run is an error; under "all", the last two
// are kept as not applicable, with the reason.
func simulationPlan(cfg *configs.Config, model *models.Model, o simulateOptions) ([]planned, error) {
	p, m := len(cfg.Stages), cfg.Data.MicroBatches
	if o.scheduleFile != "" {
		if o.schedulesSet {
			return nil, errors.New("give --schedule or --schedule-file, not both")
		}
		s, err := loadScheduleFile(o.scheduleFile)
		if err != nil {
			return nil, fmt.Errorf("--schedule-file: %w", err)
		}
		if s.Stages != p {
			return nil, fmt.Errorf("%s has %d stages; %s has %d", o.scheduleFile, s.Stages, cfg.Path, p)
		}
		if err := cfg.CheckScheduleRuns(s, model); err != nil {
			return nil, fmt.Errorf("%s: %w (pipetrain launch refuses it too)", o.scheduleFile, err)
		}
		return []planned{{sched: s}}, nil // no name: never taken for a built-in
	}
	all := o.schedules == "all"
	names := schedule.Names()
	if !all {
		names = nil
		for _, n := range strings.Split(o.schedules, ",") {
			n = strings.TrimSpace(n)
			if !slices.Contains(schedule.Names(), n) {
				return nil, fmt.Errorf("--schedule: unknown schedule %q (known: %s; or all)", n, strings.Join(schedule.Names(), ", "))
			}
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	var out []planned
	for _, name := range names {
		v := 1
		switch name {
		case "interleaved", "interleaved-zb":
			v = max(2, cfg.VirtualStages)
		case "zb-v", "dualpipev":
			v = 2
		}
		s, err := schedule.Build(name, p, m, v)
		if err == nil {
			s = s.WithRecompute(func(st, _ int) bool { return cfg.RecomputesFull(st) })
			if err = cfg.CheckScheduleRuns(s, model); err != nil {
				err = fmt.Errorf("%w; pipetrain launch refuses it too", err)
			}
		}
		if err != nil {
			if !all {
				return nil, fmt.Errorf("--schedule %s: not applicable to %s: %w", name, cfg.Path, err)
			}
			out = append(out, planned{name: name, skip: err.Error()})
			continue
		}
		out = append(out, planned{name: name, sched: s})
	}
	return out, nil
}

// printCosts writes the header and each stage's costs, marking with * every cost
// that was not measured and explaining each kind of mark on a line below.
// I and W are shown only when the model can split its backward: no schedule
// that runs them is simulated otherwise.
func printCosts(w io.Writer, c predict.Costs, cfg *configs.Config, split bool) {
	mark := func(b bool) string {
		if b {
			return "*"
		}
		return ""
	}
	transfer := fmt.Sprintf("transfer %.3f ms", c.Transfer)
	if c.TransferEstimated {
		transfer += "*"
	} else {
		transfer += " (" + c.TransferFrom + ")"
	}
	fmt.Fprintf(w, "%s: %s, %s; costs per micro-batch %s; %s\n", cfg.Path, words.Count(len(cfg.Stages), "stage"), words.Count(cfg.Data.MicroBatches, "micro-batch"), c.Source, transfer)
	for s := range c.F {
		fmt.Fprintf(w, "  stage %d  F %.3f ms  B %.3f ms%s", s, c.F[s], c.B[s], mark(c.BStages[s]))
		if split {
			fmt.Fprintf(w, "  (I %.3f%s + W %.3f%s ms)", c.I[s], mark(c.IWStages[s]), c.W[s], mark(c.IWStages[s]))
		}
		if c.Gap != nil {
			fmt.Fprintf(w, "  hand-off %.3f ms", c.Gap[s])
		}
		fmt.Fprintln(w)
		if c.ChunkCosts != nil {
			for k, x := range c.ChunkCosts[s] {
				fmt.Fprintf(w, "    chunk %d  F %.3f ms  B %.3f ms%s", k, x.F, x.B, mark(c.BStages[s]))
				if split {
					fmt.Fprintf(w, "  (I %.3f%s + W %.3f%s ms)", x.I, mark(c.IWStages[s]), x.W, mark(c.IWStages[s]))
				}
				fmt.Fprintln(w)
			}
		}
	}
	if c.Sharing != "" {
		fmt.Fprintf(w, "  cores: %s; the costs above are timed alone, and stages that compute at once there run at cores/threads of their speed while they do\n", c.Sharing)
	}
	if slices.Contains(c.BStages, true) {
		fmt.Fprintf(w, "  * B: not measured, taken as I + W: %s\n", c.BDerived)
	}
	if split && slices.Contains(c.IWStages, true) {
		fmt.Fprintf(w, "  * I, W: not measured, assumed B/2 each: %s\n", c.IWAssumed)
	}
	if c.TransferEstimated {
		fmt.Fprintln(w, "  * transfer: not measured, estimated from the largest activation's size at 2 GB/s plus 100 us (--transfer sets it)")
	}
}

// zbVerdict compares zb-h1's simulated step with 1F1B's on the same costs,
// and names the stages whose split backward costs clearly more than the
// fused one, the usual reason zb-h1 loses.
func zbVerdict(zb, oneF *schedule.Timeline, c predict.Costs) string {
	var dearer []string
	for s := range c.B {
		if c.IWStages[s] || c.BStages[s] || c.B[s] <= 0 {
			continue // I + W is B by assumption or by construction
		}
		if r := (c.I[s] + c.W[s]) / c.B[s]; r > 1.05 {
			if len(dearer) == 0 {
				dearer = append(dearer, fmt.Sprintf("%.2fx B on stage %d", r, s))
			} else {
				dearer = append(dearer, fmt.Sprintf("%.2fx on stage %d", r, s))
			}
		}
	}
	assumed := slices.Contains(c.IWStages, true)
	var b strings.Builder
	switch {
	case zb.Makespan >= oneF.Makespan:
		fmt.Fprintf(&b, "zb-h1 does not help here: %.2f ms against 1f1b's %.2f ms on the same costs.", zb.Makespan, oneF.Makespan)
		if len(dearer) > 0 {
			fmt.Fprintf(&b, " Its split backward costs more than the fused one (I + W is %s), so its W passes add more time than the bubbles they fill.", strings.Join(dearer, ", "))
		}
	case assumed:
		fmt.Fprintf(&b, "zb-h1 would shorten the step here, %.2f ms against 1f1b's %.2f ms (%.2fx), but only if I and W cost B/2 each:", zb.Makespan, oneF.Makespan, oneF.Makespan/zb.Makespan)
		return b.String() + " they were assumed, not measured (--costs measure, or the directory of a zb-h1 run, times them)."
	default:
		fmt.Fprintf(&b, "zb-h1 shortens the step here: %.2f ms against 1f1b's %.2f ms (%.2fx) on the same costs.", zb.Makespan, oneF.Makespan, oneF.Makespan/zb.Makespan)
	}
	if assumed {
		b.WriteString(" I and W were assumed B/2 each, not measured (--costs measure, or the directory of a zb-h1 run, times them).")
	}
	return b.String()
}

// trainingPasses are the lowering passes a stage adds to its schedule
// beyond the sends, receives and reductions: the exchanges of the model's
// tied weights and, when the config clips, the gradient norm's.
func trainingPasses(c *configs.Config, model *models.Model) []schedule.Pass {
	passes := []schedule.Pass{schedule.AddTiedSync(len(model.Tied))}
	if c.Train.ClipGradNorm > 0 {
		passes = append(passes, schedule.AddClipNorm)
	}
	return passes
}

// simulateOne lowers s (adding its sends, receives, reductions and the
// given passes), simulates the result and prints its summary, per-stage figures, text
// timeline and its actions as a grid ParseGrid reads back; with lowered, also
// the lowered ops; with svg, it also writes the timeline as an SVG.
func simulateOne(w io.Writer, s *schedule.Schedule, costs schedule.Costs, stash func(*schedule.Schedule) []int64, svg string, lowered bool, passes []schedule.Pass, repl *replication) (*schedule.Timeline, error) {
	l, err := schedule.Lower(s, append([]schedule.Pass{schedule.AddSendRecv, schedule.AddReduceGrad}, passes...)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	tl, err := l.Simulate(costs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	name := s.Name
	if name == "" {
		name = "schedule from file"
	}
	if s.Chunks > 1 {
		name += fmt.Sprintf(" (%d chunks per stage)", s.Chunks)
	}
	var mean float64
	for _, b := range tl.Bubble {
		mean += b / float64(len(tl.Bubble))
	}
	theory := ""
	if t, ok := schedule.TheoreticalBubble(s.Name, s.Stages, s.MicroBatches, s.Chunks); ok {
		theory = fmt.Sprintf(", equal-stage theory %.1f%%", 100*t)
	}
	fmt.Fprintf(w, "\n%s: makespan %.2f ms, mean bubble %.1f%%%s\n", name, tl.Makespan, 100*mean, theory)
	repl.printStep(w, tl)
	chart := &timeline.Chart{Title: fmt.Sprintf("%s: simulated, makespan %.2f ms", name, tl.Makespan), Unit: "ms"}
	peak := stash(s)
	for st := range tl.Spans {
		fmt.Fprintf(w, "  stage %d  busy %8.2f ms  bubble %5.1f%%  peak stash %s",
			st, tl.Busy[st], 100*tl.Bubble[st], words.Count(tl.PeakInFlight[st], "micro-batch"))
		if peak != nil {
			fmt.Fprintf(w, ", activations %.2f MiB", float64(peak[st])/(1<<20))
		}
		if tl.Exposed != nil {
			fmt.Fprintf(w, "  %s %.2f ms, %.2f exposed", repl.verb(), tl.AllReduce(st), tl.Exposed[st])
		}
		fmt.Fprintln(w)
		row := timeline.Row{Name: fmt.Sprintf("stage %d", st), Note: fmt.Sprintf("bubble %.1f%%", 100*tl.Bubble[st])}
		for _, sp := range tl.Spans[st] {
			row.Spans = append(row.Spans, timeline.Span{Start: sp.Start, End: sp.End, Kind: timeline.Kind(sp.Action.Kind.String()), MicroBatch: sp.Action.MicroBatch, Chunk: sp.Action.Chunk})
		}
		if tl.Reductions != nil {
			for _, r := range tl.Reductions[st] {
				row.Spans = append(row.Spans, timeline.Span{Start: r.Start, End: r.End, Kind: timeline.AllReduce, Chunk: r.Chunk})
			}
		}
		chart.Rows = append(chart.Rows, row)
	}
	if err := chart.Text(w, 0, 100); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "  # %s: actions per stage, in the grid form --schedule-file and schedule_file read\n", name)
	printIndented(w, s.Grid())
	if lowered {
		fmt.Fprintf(w, "  # %s lowered: each action with its receive (<from) and send (>to), each chunk's gradient reduction (R), each tied weight's exchange (T)\n", name)
		printIndented(w, l.Grid())
	}
	if svg == "" {
		return tl, nil
	}
	file := strings.TrimSuffix(svg, ".svg") + "-" + strings.ReplaceAll(s.Name, "/", "_") + ".svg"
	if s.Name == "" {
		file = svg
	}
	if dir := filepath.Dir(file); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := chart.SVG(f); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "  timeline written to %s\n", file)
	return tl, f.Close()
}

// loadScheduleFile reads a hand-written schedule and checks it before anything runs.
func loadScheduleFile(path string) (*schedule.Schedule, error) {
	s, err := schedule.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// printIndented prints text's lines indented by two spaces.
func printIndented(w io.Writer, text string) {
	for _, line := range strings.SplitAfter(text, "\n") {
		if line != "" {
			fmt.Fprint(w, "  "+line)
		}
	}
}

// setReplicas applies --replicas: the same global batch over R copies of
// the pipeline, each taking batch_size/R samples a step.
func setReplicas(cfg *configs.Config, o simulateOptions) error {
	r, m := o.replicas, cfg.Data.MicroBatches
	if r == 0 || r == cfg.Replicas() {
		return nil
	}
	if cfg.Data.BatchSize%(r*m) != 0 {
		return fmt.Errorf("--replicas %d: data.batch_size %d is not a multiple of %d replicas × %d micro-batches", r, cfg.Data.BatchSize, r, m)
	}
	if o.costs != "measure" && !strings.Contains(o.costs, "=") {
		// A run's costs are for its own micro-batch size, which R changes.
		return fmt.Errorf("--replicas %d: the run in %s timed micro-batches of %d samples, %d replicas run micro-batches of %d; give --costs measure or f=F,b=B",
			r, o.costs, cfg.MicroBatchSize(), r, cfg.Data.BatchSize/r/m)
	}
	cfg.DataParallel = r
	return nil
}

// replication is the data-parallel side of a simulation: the replicas, the
// ring their all-reduces take, and each stage's gradient bytes.
type replication struct {
	predict.Replication
	configured    int // the config's replicas
	stages, batch int
	show          bool // the config has replicas or servers, or --replicas was given
	figures       ringFigures
	within        ringFigures // the links within a host (hierarchical)
	perHost       int         // --replicas-per-host; 0: the config's addresses
	algorithm     string      // all_reduce.algorithm
	servers       configs.ParameterServers
}

// newReplication sets up the all-reduces of cfg (after --replicas; the
// config itself has configured replicas).
func newReplication(cfg *configs.Config, model *models.Model, o simulateOptions, configured int) (*replication, error) {
	r := &replication{configured: configured, stages: len(cfg.Stages), batch: cfg.Data.BatchSize,
		show: cfg.Replicas() > 1 || o.replicas > 0 || cfg.PSEnabled(), algorithm: cfg.ReduceAlgorithm(), servers: cfg.ParameterServers}
	flags := o.ring
	if cfg.Replicas() == 1 && flags.bandwidth == "measure" {
		flags.bandwidth = "" // nothing to all-reduce, so nothing to measure
	}
	var err error
	if r.figures, err = flags.resolve(cfg.Replicas(), predict.BucketBytes(cfg, model), cfg.RingStreams()); err != nil {
		return nil, err
	}
	if r.within, err = resolveWithin(o.within, r.figures, r.algorithm == "hierarchical" && cfg.Replicas() > 1, predict.BucketBytes(cfg, model), cfg.RingStreams()); err != nil {
		return nil, err
	}
	r.perHost = o.perHost
	m, err := predict.NewReplication(cfg, model, predict.Links{Across: r.figures.link(), Within: r.within.link(), ReplicasPerHost: o.perHost})
	if err != nil {
		return nil, err
	}
	r.Replication = *m
	return r, nil
}

// parseBandwidth reads bytes per second: "1.2GB/s", "500MiB/s", "2e9".
func parseBandwidth(s string) (float64, error) {
	b, err := parseBytes(strings.TrimSuffix(strings.TrimSpace(s), "/s"))
	if err != nil {
		return 0, fmt.Errorf("%q is not a rate like 1.2GB/s or 500MiB/s", s)
	}
	return float64(b), nil
}

// print writes the replicas, the ring's figures and each stage's gradients
// and all-reduce time under the costs, marking with * what was not given.
func (r *replication) print(w io.Writer) {
	if !r.show {
		return
	}
	mark := func(given bool) string {
		if given {
			return ""
		}
		return "*"
	}
	from := fmt.Sprintf("data_parallel %d", r.Replicas)
	if r.Replicas != r.configured {
		from = fmt.Sprintf("--replicas %d; the config has %d", r.Replicas, r.configured)
	}
	fmt.Fprintf(w, "  %s of each stage (%s): %s, %d samples per replica a step",
		words.Count(r.Replicas, "replica"), from, words.Count(r.stages*r.Replicas, "process"), r.batch/r.Replicas)
	if r.Servers == nil && r.Replicas == 1 {
		fmt.Fprintln(w, ", nothing to all-reduce")
		return
	}
	fmt.Fprintf(w, "; %s\n", r.describe(mark))
	for s, g := range r.Grads {
		fmt.Fprintf(w, "  stage %d  gradients %s  %s %.3f ms%s%s\n", s, human(sum(g)), r.verb(), r.StageTime(s), mark(r.figures.bwKnown && r.figures.latKnown), r.stageNote(s))
	}
	if r.figures.measured != "" {
		fmt.Fprintf(w, "  all-reduce figures %s\n", r.figures.measured)
	}
	if why := ringAssumed(r.figures.bwKnown, r.figures.latKnown); why != "" {
		fmt.Fprintf(w, "  * all-reduce: %s\n", why)
	}
	if r.Hosts != nil && r.within.measured != "" {
		fmt.Fprintf(w, "  within-host figures %s\n", r.within.measured)
	}
}

// describe says what the reductions are charged as, at which figures.
func (r *replication) describe(mark func(bool) string) string {
	at := fmt.Sprintf("%s/s%s plus %.3f ms%s a message", decimal(r.Ring.Bandwidth*1000), mark(r.figures.bwKnown), r.Ring.Latency, mark(r.figures.latKnown))
	switch {
	case r.Servers != nil:
		mode := cmp.Or(r.servers.Mode, "sync")
		return fmt.Sprintf("%s (%s): each worker stage pushes its gradients to the servers holding them and pulls its weights back when its step ends, at %s; "+
			"each server's link carries every worker's share%s", words.Count(r.servers.Count, "parameter server"), mode, at, psModel(mode, r.servers.Aggregate))
	case r.Hosts != nil:
		within := withinFigures(r.within)
		from := "hosts of the stage's addresses"
		if r.perHost > 0 {
			from = fmt.Sprintf("--replicas-per-host %d", r.perHost)
		}
		return fmt.Sprintf("hierarchical all-reduce, hosts of %s replicas (%s): across hosts at %s, %s; buckets of %s",
			joinInts(r.Hosts[0]), from, at, within, human(r.Ring.BucketBytes))
	}
	d := fmt.Sprintf("%s all-reduce at %s, buckets of %s", r.algorithm, at, human(r.Ring.BucketBytes))
	if r.PerLayer {
		d += "; all_reduce.overlap layer: under a schedule that splits the backward, each bucket starts once the chunk's last weight pass has finished its layers"
	}
	return d
}

// withinFigures says what the links within a host are charged at, and
// which figure was taken from the links across hosts, the only one known.
func withinFigures(f ringFigures) string {
	d := fmt.Sprintf("within hosts at %s/s plus %.3f ms a message", decimal(f.bytesPerSecond), ms(f.latency))
	switch {
	case !f.bwKnown && !f.latKnown:
		return "within hosts the same: only one link figure is known (--within-host-bandwidth and --within-host-latency set them)"
	case !f.bwKnown:
		return d + " (the bandwidth across hosts: only that one is known; --within-host-bandwidth sets it)"
	case !f.latKnown:
		return d + " (the latency across hosts: only that one is known; --within-host-latency sets it)"
	}
	return d
}

// verb names a stage's reduction on its line.
func (r *replication) verb() string {
	if r.Servers != nil {
		return "push and pull"
	}
	return "all-reduce"
}

// stageNote is what a stage's line adds: the bytes each server holds of
// it, or its hosts where they differ from stage 0's.
func (r *replication) stageNote(s int) string {
	switch {
	case r.Servers != nil:
		var held []string
		for k, b := range r.ServerBytes[s] {
			held = append(held, fmt.Sprintf("%d: %s", k, human(b)))
		}
		return "  (servers hold " + strings.Join(held, ", ") + ")"
	case r.Hosts != nil && !slices.Equal(r.Hosts[s], r.Hosts[0]):
		return "  (hosts of " + joinInts(r.Hosts[s]) + " replicas)"
	}
	return ""
}

// psModel says how the simulator's identical workers charge the mode:
// async and backup workers as sync.
func psModel(mode string, aggregate int) string {
	switch {
	case mode == "async":
		return "; async is charged as sync: identical workers push as much each step, and none is slower to wait for"
	case aggregate > 0:
		return "; backup workers are charged as every worker's push: identical workers arrive together"
	}
	return ""
}

func joinInts(xs []int) string {
	var out []string
	for _, x := range xs {
		out = append(out, strconv.Itoa(x))
	}
	return strings.Join(out, ", ")
}

func sum(xs []int64) int64 {
	var t int64
	for _, x := range xs {
		t += x
	}
	return t
}

// ringAssumed says which of the ring's figures were left to their defaults
// and which flags set them; "" when both were given.
func ringAssumed(bwGiven, latGiven bool) string {
	var assumed, flags []string
	if !bwGiven {
		assumed, flags = append(assumed, "2 GB/s"), append(flags, "--allreduce-bandwidth")
	}
	if !latGiven {
		assumed, flags = append(assumed, "100 us a message"), append(flags, "--allreduce-latency")
	}
	if len(assumed) == 0 {
		return ""
	}
	verb := "set them"
	if len(flags) == 1 {
		verb = "sets it"
	}
	return fmt.Sprintf("not measured, the ring taken at %s, as the transfer estimate takes gRPC on loopback (%s %s)",
		strings.Join(assumed, " and "), strings.Join(flags, " and "), verb)
}

// printStep writes the grid's step time and throughput under a schedule's
// summary.
func (r *replication) printStep(w io.Writer, tl *schedule.Timeline) {
	if !r.show {
		return
	}
	fmt.Fprintf(w, "  %d stages × %s: step %.2f ms, %.0f samples/s (batch %d)", r.stages, words.Count(r.Replicas, "replica"), tl.Makespan, 1000*float64(r.batch)/tl.Makespan, r.batch)
	if tl.Exposed != nil {
		fmt.Fprintf(w, ", %s exposed %.2f ms", r.verb(), slices.Max(tl.Exposed))
	}
	fmt.Fprintln(w)
}

// decimal writes a byte count in decimal units: 2 GB, 1.2 GB, 500 MB.
func decimal(b float64) string {
	for _, u := range []struct {
		unit string
		size float64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}} {
		if b >= u.size {
			return strconv.FormatFloat(b/u.size, 'g', 4, 64) + " " + u.unit
		}
	}
	return strconv.FormatFloat(b, 'g', 4, 64) + " B"
}
