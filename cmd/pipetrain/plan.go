package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/plan"
	"github.com/pipetrain/pipetrain/predict"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// planOptions are plan's flags.
type planOptions struct {
	path, out, memory, schedules string
	stages, processes, reps      int
	micro                        int
	allowMicro                   bool // --allow-micro-batches: the plan may choose the count
	margin                       float64
	force                        bool
	stagesSet                    bool
	ring                         ringFlags
	within                       ringFlags // --within-host-bandwidth and --within-host-latency
	perHost                      int       // --replicas-per-host; 0: one host
	servers                      int       // --servers; 0: the config's, or 1
}

const planLong = `Measure each layer of the config's model here, then choose the stage
boundaries, schedule and micro-batch count whose simulated step is shortest
within --memory-limit, and write them into a copy of the config.

With --processes N, plan also chooses the grid: every (stages, replicas) with
stages x replicas = N, as many stages as layers at most and a batch each
replica can cut into micro-batches. Each grid is planned on its replicas'
share of the batch (batch_size / replicas), with the ring all-reduce of each
stage's gradients charged as the simulator charges it (--allreduce-bandwidth
and --allreduce-latency, or --allreduce-bandwidth measure to time the ring
here; left out, the figures of gRPC on loopback), and a
table gives each grid's predicted samples per second; the fastest that fits
the memory limit is written, with data_parallel and each stage's addresses.
Without --processes the config's own replicas are kept.

For each grid with replicas, a second table weighs every reduction on that
grid's plan, the same split, schedule and micro-batches: ring, reduce-to-one,
hierarchical (--replicas-per-host consecutive replicas a host, all on one by
default, the links within a host at --within-host-bandwidth and
--within-host-latency) and parameter servers in sync mode (--servers of them,
the config's count by default), and names the fastest. The plan itself keeps
the config's all_reduce.algorithm (or parameter_servers). With
all_reduce.overlap layer, a split's buckets start during its stages' last
weight pass, as in a run, each layer's share of the pass its measured W.

The plan keeps data.micro_batches, which changes the training (the losses
differ), unless --micro-batches N gives another count or
--allow-micro-batches lets it choose one; it says so when it changes it. The
split, schedule and recomputation it chooses change where and when each
micro-batch is computed, never the training: the same losses and weights,
bit for bit.

Each layer is timed with the BLAS threads a stage will have (compute.blas_threads,
or this machine's cores shared among the processes), and when the processes'
threads outnumber the cores, each split is simulated with the stages sharing
them while they compute at once: stages computing together with T threads
on C cores each run at C/T of their measured speed, and a stage idling in the
bubble leaves its cores to the others.

Measured costs vary from run to run by a few percent, so a plan must beat the
given config, and a later candidate (more micro-batches, a later schedule in
--schedules, recomputing, more replicas) an earlier one, by more than
--margin to be chosen: two runs on an idle machine propose the same plan.`

func planCmd() *cobra.Command {
	var o planOptions
	c := &cobra.Command{
		Use:   "plan --config FILE [--stages N | --processes N] [--memory-limit BYTES]",
		Short: "Measure each layer here and choose stage boundaries, schedule and micro-batches (and with --processes the stages × replicas grid) that minimise the simulated step time",
		Example: `  # a balanced split of the config's stages, written to CONFIG-planned.yaml
  pipetrain plan --config configs/fmnist-mlp-unbalanced.yaml

  # choose the stages × replicas grid for 4 processes, within 256 MiB a stage
  pipetrain plan --config configs/fmnist-mlp-4stage.yaml --processes 4 --memory-limit 256MiB --out planned.yaml`,
		Long: planLong,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.stagesSet = cmd.Flags().Changed("stages")
			o.ring.latencySet = cmd.Flags().Changed("allreduce-latency")
			o.within.latencySet = cmd.Flags().Changed("within-host-latency")
			if o.perHost < 0 || o.servers < 0 {
				return fmt.Errorf("--replicas-per-host %d, --servers %d: need 1 or more (0: the default)", o.perHost, o.servers)
			}
			return runPlan(cmd.OutOrStdout(), o)
		},
	}
	c.Flags().StringVarP(&o.path, "config", "c", "", "config to plan for (model, data and addresses come from it)")
	c.Flags().IntVar(&o.stages, "stages", 0, "number of stages (default: as many as the config has)")
	c.Flags().IntVar(&o.processes, "processes", 0, "choose the grid too: stages × data-parallel replicas = N processes (default: the config's stages and replicas)")
	c.Flags().StringVar(&o.memory, "memory-limit", "", "bytes per stage for parameters, optimizer state and stashed activations (e.g. 512MiB); default none. Within a limit the plan may also have every stage recompute its forwards (recompute: full, under gpipe or 1f1b) when that fits or is faster")
	c.Flags().StringVar(&o.schedules, "schedules", "1f1b,zb-h1,gpipe", "schedules to consider: "+strings.Join(append(plan.Schedules(), plan.VSchedules()...), ", ")+" (zb-v and dualpipev cut each stage's layers in two, placed in a V)")
	c.Flags().StringVar(&o.out, "out", "", "where to write the new config (default: CONFIG-planned.yaml)")
	c.Flags().BoolVar(&o.force, "force", false, "replace the output file if it exists")
	c.Flags().IntVar(&o.reps, "reps", 5, "runs per layer, the layers taking turns (the fastest is used: a stage has its core to itself, the planning machine may not)")
	c.Flags().IntVar(&o.micro, "micro-batches", 0, "plan for this micro-batch count (per replica) instead of the config's data.micro_batches (a count other than the config's changes the training)")
	c.Flags().BoolVar(&o.allowMicro, "allow-micro-batches", false, "let the plan choose the micro-batch count among the powers of two up to 64 that divide the batch, which changes the training when it differs from data.micro_batches (default: keep the config's)")
	c.Flags().Float64Var(&o.margin, "margin", 5, "percent by which a plan must beat the given config, and a later candidate an earlier one, to be chosen (more than the few percent measured costs vary by)")
	c.Flags().StringVar(&o.ring.bandwidth, "allreduce-bandwidth", "", ringBandwidthUsage+"; measured among the config's replicas, or 2 when it has one")
	c.Flags().DurationVar(&o.ring.latency, "allreduce-latency", defaultAllReduceLatency, "cost of each message of the all-reduce ring")
	addHostFlags(c, &o.within, &o.perHost)
	c.Flags().IntVar(&o.servers, "servers", 0, "parameter servers to weigh against the all-reduces (default: the config's parameter_servers.count, or 1)")
	c.MarkFlagRequired("config")
	return c
}

func runPlan(w io.Writer, o planOptions) error {
	cfg, err := configs.Load(o.path)
	if err != nil {
		return err
	}
	if cfg.VirtualStages > 1 && cfg.Placement() != schedule.V {
		return fmt.Errorf("%s: plan splits plain pipelines and V-shaped ones (zb-v, dualpipev); this config interleaves virtual stages", cfg.Path)
	}
	limit, err := parseBytes(o.memory)
	if err != nil {
		return fmt.Errorf("--memory-limit: %w", err)
	}
	switch {
	case o.processes < 0:
		return fmt.Errorf("--processes %d: need at least 1", o.processes)
	case o.reps < 1:
		return fmt.Errorf("--reps %d: need at least 1", o.reps)
	case o.processes > 0 && o.stagesSet:
		return errors.New("give --stages or --processes, not both: --processes tries every stages × replicas grid")
	case o.micro > 0 && o.allowMicro:
		return fmt.Errorf("give --micro-batches %d or --allow-micro-batches, not both: one fixes the count, the other lets the plan choose it", o.micro)
	case o.margin < 0 || math.IsNaN(o.margin) || math.IsInf(o.margin, 0):
		return fmt.Errorf("--margin %v: need a percentage of 0 or more", o.margin)
	}
	nStages := o.stages
	if nStages == 0 {
		nStages = len(cfg.Stages)
	}
	model, err := models.Build(cfg.Model)
	if err != nil {
		return err
	}
	size := int(model.DType.Size())
	bucket := predict.BucketBytes(cfg, model)
	ring, err := o.ring.resolve(cfg.Replicas(), bucket, cfg.RingStreams())
	if err != nil {
		return err
	}
	within, err := resolveWithin(o.within, ring, true, bucket, cfg.RingStreams())
	if err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = strings.TrimSuffix(cfg.Path, filepath.Ext(cfg.Path)) + "-planned.yaml"
	}
	// Checked before measuring: a config the user edited by hand
	// since the last plan is not overwritten unless asked.
	if _, err := os.Stat(out); err == nil && !o.force {
		return fmt.Errorf("--out %s exists; --force replaces it", out)
	}
	names := strings.Split(o.schedules, ",")
	if !predict.Splittable(model) {
		// Zero-bubble schedules need layers that split their backward.
		names = slices.DeleteFunc(names, func(n string) bool { return n == "zb-h1" || n == "zb-v" || n == "dualpipev" })
	}
	// The replicas' share of the batch, which the micro-batches divide;
	// with --processes each grid narrows the candidates to its own.
	share := cfg.Data.BatchSize
	if o.processes == 0 {
		share /= cfg.Replicas()
	}
	if o.micro > 0 && share%o.micro != 0 {
		if share != cfg.Data.BatchSize {
			return fmt.Errorf("--micro-batches %d does not divide each of the %d replicas' batch of %d", o.micro, cfg.Replicas(), share)
		}
		return fmt.Errorf("--micro-batches %d does not divide data.batch_size %d", o.micro, cfg.Data.BatchSize)
	}
	// Costs are measured at one micro-batch size and scaled to the others
	// (plan.Problem): at the one the plan will run where --micro-batches
	// fixes it, since kernels are not linear in the batch.
	micro := cfg.MicroBatchSize()
	if o.micro > 0 && o.processes == 0 {
		micro = share / o.micro
	}
	processes := o.processes
	if processes == 0 {
		processes = nStages * cfg.Replicas()
	}
	cores := predict.SharePlanCores(cfg, processes)
	fmt.Fprintf(w, "pipetrain plan: measuring each layer of %s at micro-batch %d (fastest of %d runs, the layers taking turns)...\n", cfg.Path, micro, o.reps)
	fmt.Fprintf(w, "  %s\n", describeCores(cores))
	// Timed with the threads a stage will have, not the whole machine's.
	layers, err := predict.PlanLayers(cfg, model, micro, cores.Threads, o.reps)
	if err != nil {
		return err
	}
	servers := cmp.Or(o.servers, cfg.ParameterServers.Count, 1)
	if err := addServerBytes(cfg, model, layers, servers); err != nil {
		return err
	}
	prob := plan.Problem{
		Stages: nStages, Batch: cfg.Data.BatchSize, MicroBatch: micro, OverheadMS: 0.05,
		Schedules: names, MemoryLimit: limit, Layers: layers,
		TransferBytesPerMS: schedule.Loopback.BytesPerMS(), LatencyMS: schedule.Loopback.LatencyMS(),
		Replicas: cfg.Replicas(), AllReduceBytesPerMS: ring.bytesPerSecond / 1000, AllReduceLatencyMS: ms(ring.latency),
		BucketBytes: int64(bucket), Algorithm: planAlgorithm(cfg), PerLayer: cfg.AllReduce.Overlap == "layer",
		ReplicasPerHost: o.perHost, WithinBytesPerMS: within.bytesPerSecond / 1000, WithinLatencyMS: ms(within.latency),
		// Recomputation costs a forward per micro-batch: worth weighing
		// only where memory is short.
		Recompute: limit > 0, InputBytes: int64(model.ShapeAt(0, micro).TotalSize() * size),
		Cores:   cores.Cores,
		Threads: cores.Threads,
		Margin:  o.margin / 100,
	}
	switch {
	case o.micro > 0:
		prob.MicroBatches = o.micro
	case !o.allowMicro:
		// The micro-batch count changes the training: kept unless asked.
		prob.MicroBatches = cfg.Data.MicroBatches
	}
	for m := 1; prob.MicroBatches == 0 && m <= share && m <= 64; m *= 2 {
		if share%m == 0 {
			prob.Candidates = append(prob.Candidates, m)
		}
	}
	if o.allowMicro {
		// The config's count first, whatever it is: another must beat it
		// by the margin, since it changes the training.
		prob.PreferMicroBatches = cfg.Data.MicroBatches
		if !slices.Contains(prob.Candidates, cfg.Data.MicroBatches) {
			prob.Candidates = append(prob.Candidates, cfg.Data.MicroBatches)
		}
	}
	for i, l := range layers {
		fmt.Fprintf(w, "  layer %d %-6s F %.3f ms  B %.3f ms  activations %s  parameters+state %s\n", i, l.Name, l.F, l.B, human(l.ActBytes+l.FixedActBytes), human(l.ParamBytes))
	}
	if o.processes > 0 || cfg.Replicas() > 1 {
		shape := map[string]string{"ring": "a ring", "reduce-to-one": "reduce-to-one", "hierarchical": "hierarchical, across hosts", "ps": "parameter servers' links"}[prob.Algorithm]
		fmt.Fprintf(w, "  all-reduce: %s at %s/s plus %.3f ms a message, buckets of %s", shape, decimal(ring.bytesPerSecond), ms(ring.latency), human(prob.BucketBytes))
		if ring.measured != "" {
			fmt.Fprintf(w, "; %s", ring.measured)
		}
		if why := ringAssumed(ring.bwKnown, ring.latKnown); why != "" {
			fmt.Fprintf(w, "; %s", why)
		}
		fmt.Fprintln(w)
	}
	var best *plan.Plan
	var grids []plan.Grid
	if o.processes == 0 {
		if best, err = plan.Solve(prob); err != nil {
			return err
		}
		grids = []plan.Grid{{Stages: best.Stages(), Replicas: best.Replicas, Plan: best}}
	} else {
		best, grids, err = plan.SolveGrids(prob, o.processes)
		printGrids(w, o.processes, grids, best)
		if err != nil {
			return err
		}
	}
	printReductions(w, prob, grids, reductionsWeighed{servers: servers, within: within, perHost: o.perHost})
	found := best
	var cur *plan.Plan
	// The config's own grid, when it is one of those planned.
	if len(cfg.Stages) == best.Stages() && o.processes == 0 || o.processes > 0 && len(cfg.Stages)*cfg.Replicas() == o.processes {
		// The first layer of each model stage, in model order: one per
		// stage, or two under a V.
		var bounds []int
		for k := range cfg.ModelStages() {
			first, _ := cfg.ChunkLayers(cfg.Place(k))
			bounds = append(bounds, first)
		}
		now := prob
		now.Stages, now.Replicas = len(cfg.Stages), cfg.Replicas()
		cur, err = plan.Evaluate(now, bounds, cfg.Schedule, cfg.Data.MicroBatches, allRecompute(cfg) && slices.Contains([]string{"gpipe", "1f1b"}, cfg.Schedule))
		if err != nil {
			return fmt.Errorf("evaluating the current split: %w", err)
		}
		// The given config is kept when the plan is not clearly faster,
		// where the plan could have chosen it: its schedule among those
		// weighed, its micro-batch count allowed.
		if slices.Contains(names, cfg.Schedule) && (o.micro == 0 || o.micro == cfg.Data.MicroBatches) {
			best = now.Prefer(best, cur)
		}
	}
	fmt.Fprintf(w, "\nplan: %s\n", describe(best, len(prob.Layers)))
	if cur != nil {
		fmt.Fprintf(w, "now:  %s\n", describe(cur, len(prob.Layers)))
		if best == cur {
			fmt.Fprintf(w, "keeping the given config: the fastest plan found (%s, step %.2f ms) is %.2fx of it, within --margin %g%%\n",
				shortPlan(found, len(prob.Layers)), found.StepMS, cur.StepMS/found.StepMS, o.margin)
		} else {
			fmt.Fprintf(w, "predicted speedup over the given config: %.2fx\n", cur.StepMS/best.StepMS)
		}
	}
	for _, line := range trainingChanges(cfg, best, o) {
		fmt.Fprintln(w, line)
	}
	dropped, err := predict.WritePlannedConfig(cfg, best, len(prob.Layers), out, describe(best, len(prob.Layers)))
	if err != nil {
		return err
	}
	if len(dropped) > 0 {
		fmt.Fprintf(w, "left out %s: each is one process's, and %d replicas cannot share it\n", strings.Join(dropped, " and "), best.Replicas)
	}
	fmt.Fprintf(w, "wrote %s\n", out)
	return nil
}

// planAlgorithm is the reduction the config's replicas use, as
// plan.Problem names it.
func planAlgorithm(cfg *configs.Config) string {
	if cfg.PSEnabled() {
		return "ps"
	}
	return cfg.ReduceAlgorithm()
}

// addServerBytes sets each layer's bytes held by each of servers
// parameter servers (stages.PSLayerBytes), as the config's servers would
// hold them with that count.
func addServerBytes(cfg *configs.Config, model *models.Model, layers []plan.Layer, servers int) error {
	c := *cfg
	c.ParameterServers.Count = servers
	bytes, err := stages.PSLayerBytes(&c, model)
	if err != nil {
		return err
	}
	if len(bytes) != len(layers) {
		return fmt.Errorf("%s: the servers would hold %d layers' parameters, the plan has %d layers", cfg.Path, len(bytes), len(layers))
	}
	for j := range layers {
		layers[j].ServerBytes = bytes[j]
	}
	return nil
}

// reductionsWeighed is what printReductions says of the figures.
type reductionsWeighed struct {
	servers int
	within  ringFigures
	perHost int
}

// printReductions weighs, on each grid's plan with replicas, every way of
// summing its gradients: the same split, schedule and micro-batches, each
// reduction charged at the same figures; and says which is fastest.
func printReductions(w io.Writer, p plan.Problem, grids []plan.Grid, how reductionsWeighed) {
	algorithms := plan.Algorithms()
	names := map[string]string{"ps": "ps sync"}
	header := false
	for _, g := range grids {
		if g.Plan == nil || g.Replicas < 2 {
			continue
		}
		if !header {
			hosts := "all of a grid's replicas on one host"
			if how.perHost > 0 {
				hosts = words.Count(how.perHost, "consecutive replica") + " a host (--replicas-per-host)"
			}
			fmt.Fprintf(w, "\nreductions weighed on each plan (step ms; the same split, schedule and micro-batches): hierarchical with %s, %s; ps sync with %s, which are processes of their own\n",
				hosts, withinFigures(how.within), words.Count(how.servers, "parameter server"))
			fmt.Fprintf(w, "  %6s  %8s", "stages", "replicas")
			for _, a := range algorithms {
				fmt.Fprintf(w, "  %13s", cmp.Or(names[a], a))
			}
			fmt.Fprintf(w, "  fastest\n")
			header = true
		}
		fmt.Fprintf(w, "  %6d  %8d", g.Stages, g.Replicas)
		rs, best := plan.CompareReductions(p, g.Plan, algorithms)
		for _, r := range rs {
			if r.Err != nil {
				fmt.Fprintf(w, "  %13s", "-")
				continue
			}
			fmt.Fprintf(w, "  %13.2f", r.Plan.StepMS)
		}
		verdict := "none"
		if best >= 0 {
			a := rs[best].Algorithm
			verdict = cmp.Or(names[a], a)
			if ring := rs[0]; a != "ring" && ring.Err == nil {
				verdict += fmt.Sprintf(", %.2fx the ring", ring.Plan.StepMS/rs[best].Plan.StepMS)
			}
		}
		fmt.Fprintf(w, "  %s\n", verdict)
	}
	if header {
		fmt.Fprintf(w, "  the plan keeps the config's reduction (%s); all_reduce.algorithm or parameter_servers choose another\n", cmp.Or(names[p.Algorithm], p.Algorithm, "ring"))
	}
}

// trainingChanges says what the plan changes in the training: the
// micro-batch count and the replicas do (not one loss stays the same); the
// split, the schedule and recomputation do not (bit-identical).
func trainingChanges(cfg *configs.Config, p *plan.Plan, o planOptions) []string {
	var out []string
	if p.MicroBatches != cfg.Data.MicroBatches {
		asked := "--allow-micro-batches"
		if o.micro > 0 {
			asked = "--micro-batches"
		}
		out = append(out, fmt.Sprintf("changes the training: data.micro_batches %d -> %d (asked for with %s): each micro-batch holds other samples, so the losses and weights differ from the given config's",
			cfg.Data.MicroBatches, p.MicroBatches, asked))
	}
	if p.Replicas != cfg.Replicas() {
		out = append(out, fmt.Sprintf("changes the training: data_parallel %d -> %d (asked for with --processes): the replicas sum the gradients in another order, so the losses and weights differ from the given config's in the last bits",
			cfg.Replicas(), p.Replicas))
	}
	what := "the training stays bit-identical to the given config's: the split, schedule and recomputation change only where and when each micro-batch is computed"
	if len(out) > 0 {
		what = "the rest of the plan (split, schedule, recomputation) changes only where and when each micro-batch is computed, not the training"
	}
	return append(out, what)
}

// shortPlan names a plan's split and schedule.
func shortPlan(p *plan.Plan, layers int) string {
	d := describe(p, layers)
	head, _, _ := strings.Cut(d, ": step")
	return head
}

// describeCores says in one line how the layers are timed and charged.
func describeCores(c predict.PlanCores) string {
	s := fmt.Sprintf("%d BLAS %s a stage", c.Threads, words.Plural(c.Threads, "thread"))
	switch {
	case c.Cores == 0:
		return s + "; cores shared not charged: " + c.Why
	case float64(c.Processes*c.Threads) > c.Cores:
		return fmt.Sprintf("%s; %d processes share %g cores: those computing at once each run at cores/threads of their speed here (%.2f while all %d do)",
			s, c.Processes, c.Cores, min(1, c.Cores/float64(c.Processes*c.Threads)), c.Processes)
	}
	return fmt.Sprintf("%s; %d processes on %g cores: none shares one", s, c.Processes, c.Cores)
}

// printGrids writes the table of the grids --processes considered.
func printGrids(w io.Writer, processes int, grids []plan.Grid, best *plan.Plan) {
	fmt.Fprintf(w, "\ngrids of %s (stages × replicas), each planned on its replicas' share of the batch:\n", words.Count(processes, "process"))
	fmt.Fprintf(w, "  %6s  %8s  %-8s  %13s  %9s  %9s  %19s  %12s\n", "stages", "replicas", "schedule", "micro-batches", "step ms", "samples/s", "all-reduce exposed", "memory")
	for _, g := range grids {
		if g.Plan == nil {
			fmt.Fprintf(w, "  %6d  %8d  none: %s\n", g.Stages, g.Replicas, strings.TrimPrefix(g.Err.Error(), "plan: "))
			continue
		}
		p := g.Plan
		exposed := "-"
		if p.ExposedMS != nil {
			exposed = fmt.Sprintf("%.2f ms", slices.Max(p.ExposedMS))
		}
		chosen := ""
		if p == best {
			chosen = "  <- chosen"
		}
		fmt.Fprintf(w, "  %6d  %8d  %-8s  %13d  %9.2f  %9.0f  %19s  %12s%s\n", g.Stages, g.Replicas, p.Schedule, p.MicroBatches, p.StepMS, p.SamplesPerSecond, exposed, human(slices.Max(p.MemoryBytes)), chosen)
	}
}

func describe(p *plan.Plan, layers int) string {
	var ranges []string
	for _, chunks := range predict.StageRanges(p, layers) {
		if len(chunks) == 1 {
			ranges = append(ranges, chunks[0])
		} else {
			ranges = append(ranges, "["+strings.Join(chunks, ", ")+"]")
		}
	}
	var mean float64
	for _, b := range p.Bubble {
		mean += b / float64(len(p.Bubble))
	}
	sched := p.Schedule
	if p.Recompute {
		sched += " recomputing every forward"
	}
	d := fmt.Sprintf("layers %s, %s, %d micro-batches: step %.2f ms, mean bubble %.1f%%", strings.Join(ranges, " | "), sched, p.MicroBatches, p.StepMS, 100*mean)
	if p.Replicas > 1 {
		d += fmt.Sprintf("; %d replicas: %.0f samples/s, all-reduce exposed %.2f ms", p.Replicas, p.SamplesPerSecond, slices.Max(p.ExposedMS))
	}
	return d
}

// allRecompute reports whether every stage of cfg recomputes its forwards,
// the one recomputation the planner weighs.
func allRecompute(cfg *configs.Config) bool {
	for i := range cfg.Stages {
		if !cfg.RecomputesFull(i) {
			return false
		}
	}
	return len(cfg.Stages) > 0
}

// parseBytes reads "123", "512MiB", "2GiB", "1.5GB".
func parseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := 1.0
	num := strings.TrimSpace(s)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			mult, num = u.mult, strings.TrimSpace(strings.TrimSuffix(num, u.suffix))
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a size like 512MiB or 2GiB", s)
	}
	return int64(v * mult), nil
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
}
