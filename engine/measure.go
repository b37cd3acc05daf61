package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// Cost is the measured time of one micro-batch's actions on one model piece, and
// the bytes of activations it keeps per stashed micro-batch: StashBytes is the
// registers of one tape machine of the piece (MeasureMemory), which a stage
// keeps per micro-batch it has in flight at once. StashFixedBytes is the part
// of it that does not grow with the micro-batch.
type Cost struct {
	F, B, I, W                  time.Duration
	StashBytes, StashFixedBytes int64
	// SplitStashBytes is what one micro-batch keeps under a schedule that
	// splits the backward: a split machine's registers and its stash for the
	// weight pass (MeasureMemory); 0 when the piece cannot split.
	SplitStashBytes int64
	// ParamBytes counts the parameters with their gradients and two optimizer
	// moments (Adam's), the memory a piece keeps whatever the schedule.
	ParamBytes int64
	// OutBytes is one micro-batch's output, what crosses a stage boundary.
	OutBytes int64
}

// MeasureCosts times each stage's chunks of p on this machine: forward, fused
// backward, and the split input and weight gradients, on random micro-batches
// of p's shapes, with the BLAS threads the process has set. Each figure is
// the median of reps runs after one warm-up, the chunks taking turns (see
// measureAll). The result is indexed [stage][chunk], as p.Chunks.
func MeasureCosts(spec models.Spec, p Pipeline, reps int) ([][]Cost, error) {
	model, err := models.Build(spec)
	if err != nil {
		return nil, err
	}
	var ranges [][2]int
	var places [][2]int // the stage and chunk of each range
	for s, chunks := range p.Chunks {
		for chunk, r := range chunks {
			ranges, places = append(ranges, r), append(places, [2]int{s, chunk})
		}
	}
	costs, err := measureAll(model, ranges, p.Batch, p.Seed, reps, stats.Median[time.Duration])
	if err != nil {
		if i := len(costs); i < len(places) {
			return nil, fmt.Errorf("stage %d chunk %d: %w", places[i][0], places[i][1], err)
		}
		return nil, err
	}
	out := make([][]Cost, len(p.Chunks))
	for i, cost := range costs {
		s := places[i][0]
		out[s] = append(out[s], cost)
	}
	return out, nil
}

// MeasureLayers times each layer of the model alone, for planners that choose the
// stage boundaries. Each figure is the fastest of reps runs after one warm-up,
// the layers taking turns (see measureAll): a stage runs on a core of its own,
// so the run least disturbed by whatever else this machine is doing is the
// one to plan with.
func MeasureLayers(spec models.Spec, batch int, seed uint64, reps int) ([]Cost, error) {
	model, err := models.Build(spec)
	if err != nil {
		return nil, err
	}
	ranges := make([][2]int, len(model.Layers))
	for l := range ranges {
		ranges[l] = [2]int{l, l + 1}
	}
	costs, err := measureAll(model, ranges, batch, seed, reps, slices.Min[[]time.Duration])
	if err != nil {
		return nil, fmt.Errorf("layer %d: %w", len(costs), err)
	}
	return costs, nil
}

// measureAll times each layer range [first, last) of ranges reps times after
// one warm-up and keeps the figure pick chooses among each action's times.
// The ranges take turns, one run of each per round, so that a burst of load
// on a busy machine slows one run of every range rather than every run of
// one range: the planner compares ranges, and a range measured slow by
// chance moves its boundaries. On error, the costs of the ranges before the
// failing one are returned with it, so the caller can name the range.
func measureAll(model *models.Model, ranges [][2]int, batch int, seed uint64, reps int, pick func([]time.Duration) time.Duration) ([]Cost, error) {
	if reps < 1 {
		return nil, fmt.Errorf("%d runs per measurement: need at least 1", reps)
	}
	probes := make([]*probe, len(ranges))
	for i, r := range ranges {
		p, err := newProbe(model, r[0], r[1], batch, seed)
		if err != nil {
			return make([]Cost, i), err
		}
		probes[i] = p
	}
	if i, err := rounds(len(probes), reps, func(i int, keep bool) error { return probes[i].run(keep) }); err != nil {
		return make([]Cost, i), err
	}
	costs := make([]Cost, len(probes))
	for i, p := range probes {
		cost, err := p.cost(pick)
		if err != nil {
			return costs[:i], err
		}
		costs[i] = cost
	}
	return costs, nil
}

// rounds calls run for each of n items once per round, item after item, for
// a warm-up round whose times are not kept (keep false: it warms caches and
// allocators) and then reps rounds. On error it stops and returns the item
// that failed.
func rounds(n, reps int, run func(i int, keep bool) error) (int, error) {
	for rep := 0; rep <= reps; rep++ {
		for i := range n {
			if err := run(i, rep > 0); err != nil {
				return i, err
			}
		}
	}
	return 0, nil
}

// probe is one layer range's engines and random inputs, and the times of the
// runs measured so far.
type probe struct {
	model          *models.Model
	first, last    int
	batch          int
	seed           uint64
	fused, split   *Engine // split is nil for layers that cannot split
	input          *tensor.Dense
	targets        []int
	grad           *tensor.Dense
	fs, bs, is, ws []time.Duration
}

func newProbe(model *models.Model, first, last, batch int, seed uint64) (*probe, error) {
	fused, err := NewEngine(model, first, last, batch, seed, Options{})
	if err != nil {
		return nil, err
	}
	split, err := NewEngine(model, first, last, batch, seed, Options{Split: true})
	if err != nil {
		split = nil // a model whose layers cannot split: I and W stay unmeasured
	}
	r := rand.New(rand.NewPCG(seed, 99))
	input := randomDense(r, model.DType, fused.InShape())
	if first == 0 && model.Targets() > 1 {
		input = randomTokens(r, model.DType, fused.InShape(), model.Classes)
	}
	targets := make([]int, batch*model.Targets())
	for i := range targets {
		targets[i] = r.IntN(model.Classes)
	}
	grad := fused.LossScale(1)
	if !fused.IsLast() {
		grad = randomDense(r, model.DType, fused.OutShape())
	}
	return &probe{model: model, first: first, last: last, batch: batch, seed: seed,
		fused: fused, split: split, input: input, targets: targets, grad: grad}, nil
}

// run runs one micro-batch's forward and fused backward, and its split
// passes where the range can split; keep records their times.
func (p *probe) run(keep bool) error {
	// Training forwards, so that a dropout's draws are timed.
	p.fused.TrainNext(0, 0)
	if p.split != nil {
		p.split.TrainNext(0, 0)
	}
	t0 := time.Now()
	if _, err := p.fused.Forward(0, p.input, p.targets); err != nil {
		return err
	}
	t1 := time.Now()
	if _, err := p.fused.Backward(0, p.grad); err != nil {
		return err
	}
	t2 := time.Now()
	if keep {
		p.fs, p.bs = append(p.fs, t1.Sub(t0)), append(p.bs, t2.Sub(t1))
	}
	if p.split == nil {
		return nil
	}
	if _, err := p.split.Forward(0, p.input, p.targets); err != nil {
		return err
	}
	t3 := time.Now()
	if _, err := p.split.Input(0, p.grad); err != nil {
		return err
	}
	t4 := time.Now()
	if err := p.split.Weight(0); err != nil {
		return err
	}
	if keep {
		p.is, p.ws = append(p.is, t4.Sub(t3)), append(p.ws, time.Since(t4))
	}
	return nil
}

// cost is the range's Cost: pick's figure of each action's times, and the
// memory the range keeps.
func (p *probe) cost(pick func([]time.Duration) time.Duration) (Cost, error) {
	model, first, last, batch, seed := p.model, p.first, p.last, p.batch, p.seed
	var params int64
	for _, n := range p.fused.Params() {
		params += int64(n.Shape().TotalSize())
	}
	size := int64(model.DType.Size())
	// A machine holds tensors that grow with the micro-batch and some that do
	// not (each layer's weight-gradient product); twice the micro-batch tells
	// them apart.
	mem, err := MeasureMemory(model, first, last, batch, seed, Options{})
	if err != nil {
		return Cost{}, err
	}
	mem2, err := MeasureMemory(model, first, last, 2*batch, seed, Options{})
	if err != nil {
		return Cost{}, err
	}
	fixed := min(max(2*mem.Machine-mem2.Machine, 0), mem.Machine)
	cost := Cost{F: pick(p.fs), B: pick(p.bs), StashBytes: mem.Machine, StashFixedBytes: fixed,
		ParamBytes: 4 * params * size, OutBytes: int64(model.ShapeAt(last, batch).TotalSize()) * size}
	if p.split == nil {
		cost.I, cost.W = cost.B/2, cost.B/2
		return cost, nil
	}
	cost.I, cost.W = pick(p.is), pick(p.ws)
	m, err := MeasureMemory(model, first, last, batch, seed, Options{Split: true})
	if err != nil {
		return Cost{}, err
	}
	cost.SplitStashBytes = m.Machine + m.Stash
	return cost, nil
}

func randomDense(r *rand.Rand, dt tensor.Dtype, shape tensor.Shape) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	switch d := t.Data().(type) {
	case []float32:
		for i := range d {
			d[i] = r.Float32()*2 - 1
		}
	case []float64:
		for i := range d {
			d[i] = r.Float64()*2 - 1
		}
	}
	return t
}

// randomTokens is a language model's input: token ids below vocab, as floats.
func randomTokens(r *rand.Rand, dt tensor.Dtype, shape tensor.Shape, vocab int) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	switch d := t.Data().(type) {
	case []float32:
		for i := range d {
			d[i] = float32(r.IntN(vocab))
		}
	case []float64:
		for i := range d {
			d[i] = float64(r.IntN(vocab))
		}
	}
	return t
}

// EstimateTransfer is the time to move the largest activation between the
// chunks of p over gRPC on loopback (schedule.Loopback).
func EstimateTransfer(p Pipeline, m *models.Model) time.Duration {
	return schedule.Loopback.Time(int64(p.largestInput(m)))
}
