// Package plan chooses where to cut a model into pipeline stages, in the
// style of PipeDream's planner: given per-layer costs measured on this
// machine, it picks stage boundaries (contiguous layer ranges, every stage
// non-empty, in order) that minimise the simulated step time under a
// per-stage memory limit, and recommends a schedule and a micro-batch count.
//
// # Cost model
//
// Layer costs are measured for one micro-batch of Problem.MicroBatch samples.
// With m micro-batches a step's micro-batch holds Batch/m samples
// (Batch/Replicas/m with replicas), and every size-dependent quantity (F, B,
// I, W, ActBytes, OutBytes) is scaled linearly by that over MicroBatch. That is an approximation: kernels are not linear in
// the batch size (small batches under-use the device), so the further the
// micro-batch is from the measured one the rougher the estimate; measuring at
// the size you expect to run keeps it honest. To stand for launch and
// bookkeeping costs that do not shrink with the micro-batch, every action (a
// stage's forward, backward, input-gradient or weight pass of one
// micro-batch) also costs a fixed OverheadMS.
//
// A boundary after layer j carries layer j's output (and, backwards, its
// gradient, of the same size): LatencyMS + OutBytes*scale/TransferBytesPerMS
// (TransferBytesPerMS 0 means no bandwidth cost, latency only). The simulator
// takes one transfer cost for every link, so a split is charged its slowest
// boundary on every link: a slight over-estimate when boundaries differ, and
// exactly what the simulator would say when they do not. Transfers overlap
// with compute (sends never block), as in schedule.Simulate.
//
// A stage's memory is its layers' ParamBytes plus, for the activations,
// PeakInFlight(stage) micro-batches of its layers' scaled ActBytes (rounded
// up to a byte) and FixedActBytes, where PeakInFlight comes from the schedule: under 1f1b the
// first stage stashes the most micro-batches, under gpipe every stage stashes
// all m. A schedule that splits the backward (zb-h1) counts SplitActBytes
// instead, what a micro-batch keeps until its weight pass.
//
// # Recomputation
//
// With Problem.Recompute, gpipe and 1f1b are also weighed with every stage
// recomputing its forwards (stages[i].recompute: full): each micro-batch
// costs one forward more (an RF before its backward), and a stage keeps one
// micro-batch's activations plus the inputs of the others in flight, the
// newest of which that micro-batch's machine holds (PeakInFlight-1 inputs:
// the model's InputBytes on stage 0, the previous layer's OutBytes after).
// The search's bounds are those of the schedule without the RFs: adding
// work to a fixed order never shortens the simulated step, so they stay
// lower bounds and the plan stays exact.
//
// # Data-parallel replicas
//
// With Problem.Replicas R > 1 the pipeline runs R times side by side, each
// copy on Batch/R samples a step (so the micro-batch holds Batch/R/m), and
// the R copies of each stage sum its gradients, its layers' GradBytes, with
// a ring all-reduce (schedule.RingAllReduce: 2(R-1)/R of the bytes at
// AllReduceBytesPerMS, plus AllReduceLatencyMS per message). It starts when
// the stage's last backward is done and overlaps whatever the pipeline still
// computes; the simulator charges what sticks out past the step's end. The
// all-reduce flattens the gradients into a buffer of its own, so a stage with
// replicas also holds its GradBytes once more. The step time is that of one
// copy; samples per second count all R copies' samples.
// SolveGrids chooses R for a given number of processes.
//
// # Core sharing
//
// Layer costs are measured by one process with the threads one stage will
// have. When the Stages×Replicas processes, each running Problem.Threads
// BLAS threads, need more than Problem.Cores, the cores of the machine they
// share, the split is simulated with the processes sharing the cores
// (schedule.CoreGroups): while stages whose processes need D cores compute
// at once, each computes at min(1, Cores/D) of its measured speed, so a
// stage slows the others only while it computes, and one idling in the
// bubble leaves its cores to them. An action's fixed overhead is compute
// too; transfers and all-reduces use no core. docs/profiling.md gives the
// figures measured against it. The bounds of the search (see Solve) hold
// for this model too: sharing never shortens an action.
//
// # Search
//
// See Solve. The result is deterministic. On small problems (a few stages,
// tens of layers) the search runs to the end and the plan is optimal, up to
// a relative 1e-12 in the step time (or within Problem.Margin of it, see
// Solve), among all contiguous splits for the cost model above; on large
// ones (16 stages of 64 layers, say) it stops after a fixed amount of work
// (a few seconds) with the fastest split found.
//
// # V-shaped schedules
//
// zb-v and dualpipev cut the model into 2p model stages, stage s holding
// model stages s and 2p-1-s. Each chunk is charged its own layers (schedule.Costs.Chunks),
// the turn of the V (model stages p-1 and p, on one stage) no transfer, and a
// stage's memory is its fullest moment under the schedule's order, its two
// chunks' activations weighed apart. Its splits are searched by simulation,
// without the bounds above (see vshape.go): exact on small problems, the
// fastest found on large ones.
package plan

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/pipetrain/pipetrain/schedule"
)

// Layer is one layer's measured cost for ONE micro-batch of size
// Problem.MicroBatch, and its memory.
type Layer struct {
	Name     string
	F, B     float64 // forward, full backward (ms)
	I, W     float64 // split backward parts (ms); both 0 if unknown (then B/2 each); one 0: B minus the other
	ActBytes int64   // activations one in-flight micro-batch keeps for this layer, growing with its size
	// FixedActBytes is what one in-flight micro-batch keeps for this layer
	// whatever its size (a tape machine's weight-gradient product).
	FixedActBytes int64
	ParamBytes    int64 // parameters plus optimizer state and gradients
	OutBytes      int64 // the layer's output for one micro-batch (what crosses a stage boundary)
	GradBytes     int64 // the layer's gradients: what replicas all-reduce (independent of the micro-batch)
	// ServerBytes is, with Problem.Algorithm "ps", the bytes of the
	// layer's parameters each server holds (one entry per server).
	ServerBytes []int64
	// SplitActBytes is what one micro-batch keeps for this layer under a
	// schedule that splits the backward (a split machine, which holds no
	// weight-gradient product, and what the weight pass needs), growing
	// with its size. 0 means ActBytes and FixedActBytes.
	SplitActBytes int64
}

// Problem is what Solve plans and Evaluate simulates.
type Problem struct {
	Layers       []Layer
	Stages       int
	MicroBatches int   // fixed, or 0 to let Solve choose among Candidates
	Candidates   []int // micro-batch counts to try when MicroBatches == 0 (each must divide Batch)
	// PreferMicroBatches, when among Candidates, is tried first rather than
	// in increasing order: with a Margin, another count is chosen only when
	// it is faster by more than it (the count changes the training).
	PreferMicroBatches int
	// Batch is the global batch (samples per step), which replicas share.
	// Costs scale linearly with the micro-batch size Batch/Replicas/m
	// relative to MicroBatch (see the package comment for this
	// approximation).
	Batch      int
	MicroBatch int      // micro-batch size the layer costs were measured at
	OverheadMS float64  // fixed cost per action, not scaling with size (e.g. 0.05)
	Schedules  []string // schedule names to consider (gpipe, 1f1b, zb-h1, zb-v, dualpipev); empty = {"1f1b"}
	// MemoryLimit is the per-stage limit in bytes; 0 = none. Stage memory =
	// sum ParamBytes + PeakInFlight(stage) * sum (scaled ActBytes + FixedActBytes),
	// or sum scaled SplitActBytes under a schedule that splits the backward.
	MemoryLimit int64
	// A boundary tensor of n bytes costs LatencyMS + n/TransferBytesPerMS
	// (TransferBytesPerMS 0: latency only).
	TransferBytesPerMS float64
	LatencyMS          float64
	// Replicas is the number of data-parallel copies of the pipeline (0
	// counts as 1; it must divide Batch). Their all-reduce of a stage's
	// gradients costs AllReduceLatencyMS per message and moves bytes at
	// AllReduceBytesPerMS (0: latency only), in buckets of at most
	// BucketBytes (0: one bucket); see schedule.RingAllReduce.
	Replicas            int
	AllReduceBytesPerMS float64
	AllReduceLatencyMS  float64
	BucketBytes         int64
	// Algorithm is how the replicas sum a stage's gradients (Algorithms):
	// "" or "ring"; "reduce-to-one"; "hierarchical", on hosts of
	// ReplicasPerHost consecutive replicas (0: one host), the links within
	// a host at WithinBytesPerMS and WithinLatencyMS and those across at
	// the AllReduce figures; or "ps", parameter servers (sync), each
	// worker stage pushing its gradients to the servers holding them
	// (Layer.ServerBytes) and pulling its weights when its step ends, the
	// servers' links at the AllReduce figures
	// (schedule.ParameterServers; even with one replica).
	Algorithm        string
	ReplicasPerHost  int
	WithinBytesPerMS float64
	WithinLatencyMS  float64
	// PerLayer is all_reduce.overlap layer: under a schedule that splits
	// the backward, a stage's buckets start during its last weight pass,
	// each once the pass has finished the layers it lies in, a layer's
	// share of the pass its W (schedule.RingAllReduce.LayerBuckets). The
	// ring's only; V-shaped splits still start each chunk's at its end.
	PerLayer bool
	// Recompute lets Solve also consider gpipe and 1f1b with every stage
	// recomputing its forwards (stages[i].recompute: full), which trades a
	// forward per micro-batch for keeping one micro-batch's activations and
	// the rest's inputs. InputBytes
	// is the model's input for one micro-batch of MicroBatch samples, what
	// stage 0 keeps per micro-batch then (a later stage keeps the previous
	// layer's OutBytes).
	Recompute  bool
	InputBytes int64
	// Cores is how many cores the Stages×Replicas processes share, all on
	// one machine; 0 means each has the cores it needs. When they need
	// more, those computing at once share them (see Core sharing).
	Cores float64
	// Threads is the BLAS threads each process computes with, the cores it
	// keeps busy while it computes (0 counts as 1).
	Threads int
	// Margin is the relative gain a candidate later in Solve's order (more
	// micro-batches, a later schedule, recomputing) must clear over an
	// earlier one to be chosen: measured costs vary from run to run, and
	// without it near-equal candidates trade places (see Search). 0
	// chooses the fastest, ties broken by that order.
	Margin float64
}

// cores is how the plan's stages share Cores: one group, each stage
// keeping its replicas' threads busy while it computes; the zero value
// (nothing shared) when the processes need no more than Cores.
func (p Problem) cores() schedule.CoreGroups {
	demand := float64(p.replicas() * max(1, p.Threads))
	if p.Cores <= 0 || float64(p.Stages)*demand <= p.Cores {
		return schedule.CoreGroups{}
	}
	return schedule.OneGroup(p.Stages, p.Cores, demand)
}

// band is the slowest step time that still counts as within the margin of x.
func (p Problem) band(x float64) float64 { return above(x * (1 + p.Margin)) }

// Prefer returns given, the user's own plan (Evaluate's), when best, Solve's,
// does not beat it by more than the margin and it fits the memory limit:
// a plan that is not clearly faster is not worth a change that measurement
// noise could have chosen. Otherwise it returns best.
func (p Problem) Prefer(best, given *Plan) *Plan {
	if given == nil || given.StepMS > p.band(best.StepMS) {
		return best
	}
	if p.MemoryLimit > 0 && slices.Max(given.MemoryBytes) > p.MemoryLimit {
		return best
	}
	return given
}

// replicas is Replicas with 0 counted as 1.
func (p Problem) replicas() int { return max(1, p.Replicas) }

// Algorithms are the values of Problem.Algorithm, the default first.
func Algorithms() []string { return []string{"ring", "reduce-to-one", "hierarchical", "ps"} }

// ring is the all-reduce among the replicas of a stage.
func (p Problem) ring() schedule.RingAllReduce {
	r := schedule.RingAllReduce{Replicas: p.replicas(), Bandwidth: p.AllReduceBytesPerMS, Latency: p.AllReduceLatencyMS, BucketBytes: p.BucketBytes,
		ReduceToOne: p.Algorithm == "reduce-to-one"}
	if p.Algorithm == "hierarchical" {
		r.Hosts = hosts(p.replicas(), p.ReplicasPerHost)
		r.Within = schedule.LinkFigures{Bandwidth: p.WithinBytesPerMS, Latency: p.WithinLatencyMS}
	}
	return r
}

// hosts lays r replicas out perHost a host, the last host the rest; with
// perHost 0, all on one.
func hosts(r, perHost int) []int {
	if perHost <= 0 {
		perHost = r
	}
	var out []int
	for left := r; left > 0; left -= perHost {
		out = append(out, min(left, perHost))
	}
	return out
}

// servers is the parameter servers' cost model; nil without them.
func (p Problem) servers() *schedule.ParameterServers {
	if p.Algorithm != "ps" {
		return nil
	}
	return &schedule.ParameterServers{Workers: p.replicas(), Link: schedule.LinkFigures{Bandwidth: p.AllReduceBytesPerMS, Latency: p.AllReduceLatencyMS}}
}

// reduces reports whether a step reduces anything: with replicas, or
// parameter servers.
func (p Problem) reduces() bool { return p.replicas() > 1 || p.Algorithm == "ps" }

// Plan is a split with its schedule and simulated numbers.
type Plan struct {
	// Boundaries holds the first layer of each model stage, in model order,
	// Boundaries[0] == 0: one per stage (len == Stages), or for zb-v two
	// (len == 2·Stages: stage s holds model stages s and 2·Stages-1-s).
	Boundaries   []int
	Schedule     string
	Recompute    bool      // every stage recomputes its forwards (stages[i].recompute: full)
	MicroBatches int       // per replica
	StepMS       float64   // simulated makespan of one step, all-reduces included
	Bubble       []float64 // per stage, from the simulator
	MemoryBytes  []int64   // per stage (each replica of it holds as much)

	Replicas         int       // data-parallel copies of the pipeline, 1 without
	AllReduceMS      []float64 // per stage, its all-reduce's time; nil with one replica
	ExposedMS        []float64 // per stage, how much of it the step's compute does not hide; nil with one replica
	SamplesPerSecond float64   // the whole batch, all replicas' samples, over StepMS
}

// Stages returns the number of stages the plan has: one per boundary, or one
// per two under a V.
func (pl *Plan) Stages() int { return len(pl.Boundaries) / pl.Topology().Chunks }

// Topology returns the plan's stages, chunks per stage and placement, which
// say which stage holds each of its model stages (Boundaries).
func (pl *Plan) Topology() schedule.Topology {
	if slices.Contains(VSchedules(), pl.Schedule) {
		return schedule.Topology{Stages: len(pl.Boundaries) / 2, Chunks: 2, Placement: schedule.V}
	}
	return schedule.Topology{Stages: len(pl.Boundaries), Chunks: 1}
}

// Schedules lists the built-in schedules with one chunk per stage, which the
// planner searches exactly (see Solve). It also accepts zb-v and dualpipev
// (VSchedules).
func Schedules() []string { return []string{"gpipe", "1f1b", "zb-h1"} }

// VSchedules lists the V-shaped schedules the planner accepts: two chunks per
// stage, searched by simulation alone (see vshape.go).
func VSchedules() []string { return []string{"zb-v", "dualpipev"} }

// Solve returns the best plan. For each candidate (micro-batch count, in
// increasing order after PreferMicroBatches, then schedule, in the order
// given, then keeping before recomputing) it searches the boundaries, simulating splits with
// schedule.Simulate, and keeps the first candidate whose fastest split is
// within Problem.Margin of the fastest of all (ties within a relative 1e-12
// without a margin): a candidate later in that order is chosen only when it
// is faster by more than the margin, so costs measured a little differently
// from one run to the next do not change the plan.
//
// The search:
//
//  1. A dynamic programme over (stage index, first layer) finds, for every
//     suffix of layers and every number of remaining stages, the smallest
//     achievable largest per-stage cost among splits whose stages fit the
//     memory limit. The stage index is part of the state because a stage's
//     memory depends on its position (PeakInFlight differs per stage). If
//     nothing fits, the same programme over memory finds the smallest limit
//     that would.
//  2. With per-stage cost F+B (F+I+W when the backward is split) plus the
//     outgoing boundary transfer it gives the classic bottleneck split,
//     which sets the steady-state throughput. Because a finite pipeline's
//     step also pays for fill and drain, and 1F1B-like schedules keep only a
//     few micro-batches in flight on the late stages, the programme is run
//     again with each stage's own lower bound on the step time (below) as
//     its cost; the faster of the two splits, simulated, is the seed.
//  3. The seeds of all candidates are compared, and each candidate, the most
//     promising first, descends from its seed: one cut moved by one layer at
//     a time, simulated, while that helps.
//  4. A depth-first branch and bound over the cuts then visits every split
//     that could still beat the fastest time found and simulates it. A
//     partial split is pruned when a lower bound on its makespan, valid for
//     any schedule, already reaches that time: the bound follows the
//     dependency chains the simulator enforces (forwards flowing to the
//     stage, the round trip through the later stages, the backward chain
//     down to stage 0, the schedule's in-flight limit) and, for the stages not
//     yet placed, tables from the same dynamic programme. The bound is
//     exact for gpipe and close for the others, so in practice the
//     simulator ranks the seed's near-ties and little else; the bound makes
//     the choice exact, not heuristic.
//
// Steps 3 and 4 share a budget of work per call (see searchBudget); when it
// runs out, the fastest split found so far is the plan.
//
// Errors: fewer layers than stages, no split fits the memory limit (the
// message gives the smallest limit that would fit), bad inputs.
func Solve(p Problem) (*Plan, error) {
	mdl, err := newModel(p)
	if err != nil {
		return nil, err
	}
	counts := []int{p.MicroBatches}
	if p.MicroBatches == 0 {
		if len(p.Candidates) == 0 {
			return nil, errors.New("plan: set MicroBatches or list Candidates")
		}
		counts = slices.Clone(p.Candidates)
		slices.Sort(counts)
		counts = slices.Compact(counts)
		if k := slices.Index(counts, p.PreferMicroBatches); k > 0 {
			// The count that leaves the training as it is comes first.
			counts = slices.Insert(slices.Delete(counts, k, k+1), 0, p.PreferMicroBatches)
		}
	}
	for _, m := range counts {
		if err := checkMicroBatches(p, m); err != nil {
			return nil, err
		}
	}
	names := p.Schedules
	if len(names) == 0 {
		names = []string{"1f1b"}
	}
	for _, name := range names {
		if err := checkSchedule(name); err != nil {
			return nil, err
		}
	}

	// Every candidate's seed first: the fastest of them is the time to beat,
	// so that hopeless candidates are pruned at once.
	var cands []*candidate
	var skipped error // why a V schedule left out a micro-batch count
	beat := math.Inf(1)
	for _, m := range counts {
		for _, name := range names {
			for _, recompute := range recomputeChoices(p, name) {
				c, err := mdl.candidate(name, m, recompute)
				if err != nil && slices.Contains(VSchedules(), name) {
					skipped = err // too few micro-batches for it: the others may do
					continue
				}
				if err != nil {
					return nil, err
				}
				if err := c.prepare(); err != nil {
					return nil, err
				}
				cands = append(cands, c)
				if c.seed != nil {
					beat = min(beat, c.seed.StepMS)
				}
			}
		}
	}
	if len(cands) == 0 {
		return nil, skipped
	}
	if math.IsInf(beat, 1) {
		fit := slices.MinFunc(cands, func(a, b *candidate) int { return cmp.Compare(a.need, b.need) })
		smallest := "the smallest limit that fits"
		if fit.vshape && !fit.needExact { // found by a descent, not proven smallest
			smallest = "a limit that fits"
		}
		how := fit.name
		if fit.recompute {
			how += " recomputing"
		}
		return nil, fmt.Errorf("plan: no split of %d layers into %d stages fits the memory limit of %d bytes per stage; %s is %d bytes (%s, %d micro-batches)",
			len(p.Layers), p.Stages, p.MemoryLimit, smallest, int64(fit.need), how, fit.m)
	}
	// Then each candidate's own search, for a split within the margin of
	// the best so far, the most promising first, while the budget lasts: a
	// quick descent from the seed for all, then the exhaustive branch and
	// bound. Last, the first candidate (fewest micro-batches, then schedule
	// order) whose split is within the margin of the fastest.
	left := searchBudget
	found := make([]*Plan, len(cands))
	searches := make([]*bnb, len(cands))
	for k, c := range cands {
		found[k] = c.seed
	}
	for _, phase := range []func(*bnb){(*bnb).descend, (*bnb).exhaust} {
		var order []int
		for k := range cands {
			if found[k] != nil {
				order = append(order, k)
			}
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(found[a].StepMS, found[b].StepMS) })
		for _, k := range order {
			if left <= 0 {
				break
			}
			b := searches[k]
			if b == nil {
				b = cands[k].newSearch(p.band(beat), &left)
				searches[k] = b
			}
			b.limit = min(b.limit, p.band(beat))
			phase(b)
			if b.err != nil {
				return nil, b.err
			}
			if b.best != nil {
				found[k], beat = b.best, min(beat, b.best.StepMS)
			}
		}
	}
	for _, pl := range found {
		if pl != nil && pl.StepMS <= p.band(beat) {
			return pl, nil
		}
	}
	panic("plan: lost the fastest plan") // beat is some found plan's time
}

// Evaluate simulates the given boundaries with the named schedule and
// micro-batch count, every stage recomputing its forwards if asked, for reporting a user's current split next to Solve's
// plan. Problem.MicroBatches, Candidates and Schedules are ignored, and so is
// MemoryLimit: a split over the limit is still evaluated (compare its
// MemoryBytes with the limit).
func Evaluate(p Problem, boundaries []int, sched string, microBatches int, recompute bool) (*Plan, error) {
	mdl, err := newModel(p)
	if err != nil {
		return nil, err
	}
	if err := checkSchedule(sched); err != nil {
		return nil, err
	}
	if err := checkMicroBatches(p, microBatches); err != nil {
		return nil, err
	}
	if recompute && !slices.Contains(recomputing, sched) {
		return nil, fmt.Errorf("plan: recomputation is planned under %s only, not %s", strings.Join(recomputing, " and "), sched)
	}
	c, err := mdl.candidate(sched, microBatches, recompute)
	if err != nil {
		return nil, err
	}
	if len(boundaries) != c.vPieces() {
		if c.vshape {
			return nil, fmt.Errorf("plan: %d boundaries for %d stages of 2 model stages each under %s", len(boundaries), p.Stages, sched)
		}
		return nil, fmt.Errorf("plan: %d boundaries for %d stages", len(boundaries), p.Stages)
	}
	if boundaries[0] != 0 {
		return nil, fmt.Errorf("plan: boundaries must start at layer 0, got %d", boundaries[0])
	}
	for s := 1; s < len(boundaries); s++ {
		if boundaries[s] <= boundaries[s-1] || boundaries[s] >= mdl.n {
			return nil, fmt.Errorf("plan: boundaries %v: stage %d would be empty or past the %d layers (each must be greater than the previous and less than %d)",
				boundaries, s, mdl.n, mdl.n)
		}
	}
	return c.simulate(boundaries)
}

// recomputing lists the schedules the planner considers with full
// recomputation: those whose stages keep whole micro-batches from forward
// to backward; under zb-h1 and zb-v what the weight pass keeps stays.
var recomputing = []string{"gpipe", "1f1b"}

// recomputeChoices are the recomputation settings Solve tries for a
// schedule: keeping, and where Problem.Recompute allows, recomputing.
func recomputeChoices(p Problem, name string) []bool {
	if p.Recompute && slices.Contains(recomputing, name) {
		return []bool{false, true}
	}
	return []bool{false}
}

func checkSchedule(name string) error {
	if !slices.Contains(Schedules(), name) && !slices.Contains(VSchedules(), name) {
		return fmt.Errorf("plan: schedule %q not supported (one chunk per stage: %s; two in a V: %s)", name, strings.Join(Schedules(), ", "), strings.Join(VSchedules(), ", "))
	}
	return nil
}

func checkMicroBatches(p Problem, m int) error {
	if r := p.replicas(); r > 1 && (m < 1 || p.Batch%(r*m) != 0) {
		return fmt.Errorf("plan: %d micro-batches: must be >= 1 and divide each of the %d replicas' batch of %d", m, r, p.Batch/r)
	}
	if m < 1 || p.Batch%m != 0 {
		return fmt.Errorf("plan: %d micro-batches: must be >= 1 and divide the batch of %d", m, p.Batch)
	}
	return nil
}

// model holds a validated problem's layer costs as prefix sums, so that any
// contiguous range costs O(1).
type model struct {
	p                       Problem
	n                       int
	f, b, i, w              []float64 // prefix sums of the measured costs, len n+1
	act, fixed, param, grad []int64   // prefix sums of the bytes, len n+1
	// prefix sums of SplitActBytes (ActBytes where 0) and of FixedActBytes
	// where SplitActBytes is 0, len n+1
	splitAct, splitFixed []int64
	out                  []float64 // OutBytes per layer
	served               [][]int64 // per server, prefix sums of ServerBytes, len n+1; nil without servers
	fwdBack, fwdInpt     []float64 // prefix sums of F+B and F+I
}

func finite(x float64) bool { return x >= 0 && !math.IsInf(x, 1) && !math.IsNaN(x) }

func newModel(p Problem) (*model, error) {
	n := len(p.Layers)
	switch {
	case p.Stages < 1:
		return nil, fmt.Errorf("plan: stages must be >= 1, got %d", p.Stages)
	case n < p.Stages:
		return nil, fmt.Errorf("plan: %d layers cannot fill %d stages (every stage needs a layer)", n, p.Stages)
	case p.Batch < 1 || p.MicroBatch < 1:
		return nil, fmt.Errorf("plan: batch and measured micro-batch size must be >= 1, got %d and %d", p.Batch, p.MicroBatch)
	case !finite(p.OverheadMS) || !finite(p.LatencyMS) || !finite(p.TransferBytesPerMS):
		return nil, fmt.Errorf("plan: overhead, latency and link speed must be finite and >= 0, got %v, %v and %v",
			p.OverheadMS, p.LatencyMS, p.TransferBytesPerMS)
	case p.Replicas < 0 || p.Batch%p.replicas() != 0:
		return nil, fmt.Errorf("plan: %d replicas: must be >= 1 and divide the batch of %d", p.Replicas, p.Batch)
	case !finite(p.AllReduceLatencyMS) || !finite(p.AllReduceBytesPerMS) || p.BucketBytes < 0:
		return nil, fmt.Errorf("plan: all-reduce latency, speed and bucket size must be finite and >= 0, got %v, %v and %d",
			p.AllReduceLatencyMS, p.AllReduceBytesPerMS, p.BucketBytes)
	case !slices.Contains(append(Algorithms(), ""), p.Algorithm):
		return nil, fmt.Errorf("plan: unknown algorithm %q (known: %s)", p.Algorithm, strings.Join(Algorithms(), ", "))
	case p.ReplicasPerHost < 0 || !finite(p.WithinBytesPerMS) || !finite(p.WithinLatencyMS):
		return nil, fmt.Errorf("plan: replicas per host, speed and latency within a host must be finite and >= 0, got %d, %v and %v",
			p.ReplicasPerHost, p.WithinBytesPerMS, p.WithinLatencyMS)
	case p.MemoryLimit < 0:
		return nil, fmt.Errorf("plan: memory limit must be >= 0, got %d", p.MemoryLimit)
	case p.InputBytes < 0:
		return nil, fmt.Errorf("plan: input bytes must be >= 0, got %d", p.InputBytes)
	case !finite(p.Cores) || !finite(p.Margin):
		return nil, fmt.Errorf("plan: cores and margin must be finite and >= 0, got %v and %v", p.Cores, p.Margin)
	case p.Threads < 0:
		return nil, fmt.Errorf("plan: threads must be >= 0, got %d", p.Threads)
	}
	d := &model{p: p, n: n, out: make([]float64, n)}
	for _, s := range []*[]float64{&d.f, &d.b, &d.i, &d.w, &d.fwdBack, &d.fwdInpt} {
		*s = make([]float64, n+1)
	}
	d.act, d.param, d.grad = make([]int64, n+1), make([]int64, n+1), make([]int64, n+1)
	d.fixed, d.splitAct, d.splitFixed = make([]int64, n+1), make([]int64, n+1), make([]int64, n+1)
	const maxBytes = 1 << 53 // keeps every byte count exact in a float64
	for k, l := range p.Layers {
		if !finite(l.F) || !finite(l.B) || !finite(l.I) || !finite(l.W) {
			return nil, fmt.Errorf("plan: layer %d (%s): costs must be finite and >= 0, got F=%v B=%v I=%v W=%v", k, l.Name, l.F, l.B, l.I, l.W)
		}
		if l.ActBytes < 0 || l.FixedActBytes < 0 || l.SplitActBytes < 0 || l.ParamBytes < 0 || l.OutBytes < 0 || l.GradBytes < 0 {
			return nil, fmt.Errorf("plan: layer %d (%s): byte counts must be >= 0", k, l.Name)
		}
		in, wt := l.I, l.W
		switch {
		case in == 0 && wt == 0:
			in, wt = l.B/2, l.B/2
		case in == 0:
			in = max(l.B-wt, 0)
		case wt == 0:
			wt = max(l.B-in, 0)
		}
		d.f[k+1] = d.f[k] + l.F
		d.b[k+1] = d.b[k] + l.B
		d.i[k+1] = d.i[k] + in
		d.w[k+1] = d.w[k] + wt
		d.fwdBack[k+1] = d.fwdBack[k] + l.F + l.B
		d.fwdInpt[k+1] = d.fwdInpt[k] + l.F + in
		d.act[k+1] = d.act[k] + l.ActBytes
		d.fixed[k+1] = d.fixed[k] + l.FixedActBytes
		d.splitAct[k+1] = d.splitAct[k] + cmp.Or(l.SplitActBytes, l.ActBytes)
		d.splitFixed[k+1] = d.splitFixed[k]
		if l.SplitActBytes == 0 {
			d.splitFixed[k+1] += l.FixedActBytes
		}
		d.param[k+1] = d.param[k] + l.ParamBytes
		d.grad[k+1] = d.grad[k] + l.GradBytes
		if d.act[k+1] > maxBytes || d.fixed[k+1] > maxBytes || d.splitAct[k+1] > maxBytes || d.param[k+1] > maxBytes || d.grad[k+1] > maxBytes {
			return nil, fmt.Errorf("plan: layer byte counts sum past %d", int64(maxBytes))
		}
		d.out[k] = float64(l.OutBytes)
	}
	if p.Algorithm == "ps" {
		if err := d.serve(p.Layers); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// serve sets the prefix sums of the bytes each server holds of the layers.
func (d *model) serve(layers []Layer) error {
	servers := len(layers[0].ServerBytes)
	if servers == 0 {
		return errors.New("plan: parameter servers, but layer 0 gives no bytes held by a server (Layer.ServerBytes)")
	}
	d.served = make([][]int64, servers)
	for k := range d.served {
		d.served[k] = make([]int64, len(layers)+1)
	}
	for j, l := range layers {
		if len(l.ServerBytes) != servers {
			return fmt.Errorf("plan: layer %d (%s): bytes held by %d servers, layer 0 by %d", j, l.Name, len(l.ServerBytes), servers)
		}
		for k, b := range l.ServerBytes {
			if b < 0 {
				return fmt.Errorf("plan: layer %d (%s): byte counts must be >= 0", j, l.Name)
			}
			d.served[k][j+1] = d.served[k][j] + b
		}
	}
	return nil
}

// reduction is the step's reduction of a stage holding layers [i, j): its
// all-reduce, or its push and pull with parameter servers.
func (d *model) reduction(i, j int) float64 {
	if ps := d.p.servers(); ps != nil {
		bytes := make([]int64, len(d.served))
		for k, sums := range d.served {
			bytes[k] = sums[j] - sums[i]
		}
		return ps.Time(bytes)
	}
	return d.p.ring().Time(d.grad[j] - d.grad[i])
}

// candidate is one (schedule, micro-batch count) to plan for.
type candidate struct {
	*model
	name  string
	m     int
	sched *schedule.Schedule // without recomputation: what the search's bounds know
	// recompute: every stage recomputes its forwards, and run is sched
	// with them, what is simulated. Recomputing only adds work to a fixed
	// order, and the simulator is monotone in it, so the bounds that hold
	// for sched hold for run.
	recompute bool
	run       *schedule.Schedule
	peak      []int
	split     bool    // the schedule runs I and W instead of B
	scale     float64 // micro-batch size / measured size
	mbs       float64 // micro-batch size
	actions   int     // in the schedule, all stages
	// vshape marks a V-shaped schedule (see vshape.go), whose stages' chunks
	// hold at most the counts of one of chunkStates[stage] at once; with
	// needExact, need is the smallest limit that fits, not only one.
	vshape      bool
	chunkStates [][][]int
	needExact   bool
	vKinds      [][][schedule.Recompute + 1]float64 // per stage and chunk, its actions of each kind (vBusiest)

	// Set by prepare, see there and bnb.
	shape   []shape
	back    []float64 // prefix sums of the measured K (B, or I when split)
	fk      []float64 // prefix sums of the measured F+K
	rest    [][]float64
	chain   [][]float64
	maxF    [][]float64
	tmin    [][]float64
	alone0  [][]float64
	minPost [][3]float64
	seed    *Plan
	need    float64
}

func (d *model) candidate(name string, m int, recompute bool) (*candidate, error) {
	chunks := 1
	vshape := slices.Contains(VSchedules(), name)
	if vshape {
		chunks = 2
		if d.n < 2*d.p.Stages {
			return nil, fmt.Errorf("plan: %d layers cannot fill the %d model stages of %s on %d stages (every model stage needs a layer)", d.n, 2*d.p.Stages, name, d.p.Stages)
		}
	}
	s, err := schedule.Build(name, d.p.Stages, m, chunks)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	mbs := float64(d.p.Batch / d.p.replicas() / m)
	c := &candidate{model: d, name: name, m: m, sched: s, run: s, recompute: recompute, peak: s.PeakInFlight(),
		split: s.SplitsBackward(), scale: mbs / float64(d.p.MicroBatch), mbs: mbs, vshape: vshape}
	if recompute {
		c.run = s.WithRecompute(func(int, int) bool { return true })
	}
	if vshape {
		c.chunkStates = chunkStates(s)
	}
	for _, list := range s.Actions {
		c.actions += len(list)
	}
	return c, nil
}

// cost is one stage's per-micro-batch action durations, and its all-reduce.
type cost struct {
	F, B, I, W float64
	work       float64 // all of one micro-batch's actions: F+B, or F+I+W when split
	back       float64 // the pass the previous stage waits for: B, or I when split
	AR         float64 // the step's reduction of the stage's gradients; 0 with one replica and no servers
}

// stage returns the costs of a stage holding layers [i, j).
func (c *candidate) stage(i, j int) cost {
	ov, k := c.p.OverheadMS, c.scale
	x := cost{F: k*(c.f[j]-c.f[i]) + ov, B: k*(c.b[j]-c.b[i]) + ov, I: k*(c.i[j]-c.i[i]) + ov, W: k*(c.w[j]-c.w[i]) + ov,
		AR: c.reduction(i, j)}
	x.work, x.back = x.F+x.B, x.B
	if c.split {
		x.work, x.back = x.F+x.I+x.W, x.I
	}
	return x
}

// layered reports whether the candidate's buckets start per layer
// (Problem.PerLayer): the ring's, under a schedule whose weight passes run
// apart.
func (c *candidate) layered() bool {
	return c.p.PerLayer && c.split && c.p.replicas() > 1 && (c.p.Algorithm == "" || c.p.Algorithm == "ring")
}

// buckets is the per-layer buckets of a stage holding layers [i, j), each
// layer's share of the weight pass its W.
func (c *candidate) buckets(i, j int) []schedule.Bucket {
	bytes, work := make([]int64, j-i), make([]float64, j-i)
	for k := i; k < j; k++ {
		bytes[k-i], work[k-i] = c.grad[k+1]-c.grad[k], c.w[k+1]-c.w[k]
	}
	return c.p.ring().LayerBuckets(bytes, work)
}

// memory returns the bytes stage s needs holding layers [i, j), as a float64
// (exact: byte sums are kept below 2^53).
func (c *candidate) memory(s, i, j int) float64 {
	sums, fixed := c.act, c.fixed
	if c.split {
		sums, fixed = c.splitAct, c.splitFixed
	}
	act := math.Ceil(float64(sums[j]-sums[i])*c.mbs/float64(c.p.MicroBatch)) + float64(fixed[j]-fixed[i])
	mem := float64(c.param[j]-c.param[i]) + float64(c.peak[s])*act
	if c.recompute {
		// One micro-batch's activations, and the inputs of the others in
		// flight: the machine holds the newest input (schedule.ChunkMemory).
		mem = float64(c.param[j]-c.param[i]) + act + float64(c.peak[s]-1)*c.input(i)
	}
	if c.p.replicas() > 1 {
		mem += float64(c.grad[j] - c.grad[i]) // the all-reduce's flat copy
	}
	return mem
}

// input is what a recomputing stage starting at layer i keeps of one
// micro-batch: its input, the model's or layer i-1's output.
func (c *candidate) input(i int) float64 {
	in := float64(c.p.InputBytes)
	if i > 0 {
		in = c.out[i-1]
	}
	return math.Ceil(in * c.mbs / float64(c.p.MicroBatch))
}

func (c *candidate) fits(s, i, j int) bool {
	return c.p.MemoryLimit == 0 || c.memory(s, i, j) <= float64(c.p.MemoryLimit)
}

// transfer returns the cost of the boundary before layer j (layer j-1's
// output), 0 < j < n.
func (c *candidate) transfer(j int) float64 {
	t := c.p.LatencyMS
	if c.p.TransferBytesPerMS > 0 {
		t += c.out[j-1] * c.scale / c.p.TransferBytesPerMS
	}
	return t
}

// simulate builds the simulator's costs for the split and plays it.
func (c *candidate) simulate(bounds []int) (*Plan, error) {
	if c.vshape {
		pl, err := c.simulateV(bounds)
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		return pl, nil
	}
	p := len(bounds)
	costs := schedule.Costs{F: make([]float64, p), B: make([]float64, p), I: make([]float64, p), W: make([]float64, p),
		Cores: c.p.cores(), ReduceAtStepEnd: c.p.servers() != nil}
	replicated := c.p.reduces()
	if replicated {
		costs.AllReduce = make([][]float64, p)
	}
	mem := make([]int64, p)
	for s := range p {
		end := c.n
		if s+1 < p {
			end = bounds[s+1]
			costs.Transfer = max(costs.Transfer, c.transfer(end))
		}
		x := c.stage(bounds[s], end)
		costs.F[s], costs.B[s], costs.I[s], costs.W[s] = x.F, x.B, x.I, x.W
		if replicated {
			costs.AllReduce[s] = []float64{x.AR}
		}
		if c.layered() {
			costs.Buckets = append(costs.Buckets, [][]schedule.Bucket{c.buckets(bounds[s], end)})
		}
		mem[s] = int64(c.memory(s, bounds[s], end))
	}
	tl, err := schedule.Simulate(c.run, costs)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	pl := &Plan{Boundaries: slices.Clone(bounds), Schedule: c.name, Recompute: c.recompute, MicroBatches: c.m,
		StepMS: tl.Makespan, Bubble: tl.Bubble, MemoryBytes: mem, Replicas: c.p.replicas()}
	if tl.Makespan > 0 {
		pl.SamplesPerSecond = 1000 * float64(c.p.Batch) / tl.Makespan
	}
	if replicated {
		pl.ExposedMS = tl.Exposed
		for s := range p {
			pl.AllReduceMS = append(pl.AllReduceMS, tl.AllReduce(s))
		}
	}
	return pl, nil
}
