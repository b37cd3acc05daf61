package engine

import (
	"fmt"
	"math/rand/v2"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
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

// MeasureCosts times each stage's chunks on this machine: forward, fused backward,
// and the split input and weight gradients, on random micro-batches of the
// configured shapes. Each figure is the median of reps runs after one warm-up.
// The result is indexed [stage][chunk].
func MeasureCosts(c *configs.Config, reps int) ([][]Cost, error) {
	blas.SetThreads(c.Threads(0))
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	out := make([][]Cost, len(c.Stages))
	for s := range c.Stages {
		for chunk := 0; chunk < c.VirtualStages; chunk++ {
			first, last := c.ChunkLayers(s, chunk)
			cost, err := measureRange(model, first, last, c.MicroBatchSize(), c.Train.Seed, reps)
			if err != nil {
				return nil, fmt.Errorf("stage %d chunk %d: %w", s, chunk, err)
			}
			out[s] = append(out[s], cost)
		}
	}
	return out, nil
}

// MeasureLayers times each layer of the model alone, for planners that choose the
// stage boundaries.
func MeasureLayers(spec models.Spec, batch int, seed uint64, reps int) ([]Cost, error) {
	model, err := models.Build(spec)
	if err != nil {
		return nil, err
	}
	var out []Cost
	for l := range model.Layers {
		cost, err := measureRange(model, l, l+1, batch, seed, reps)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		out = append(out, cost)
	}
	return out, nil
}

func measureRange(model *models.Model, first, last, batch int, seed uint64, reps int) (Cost, error) {
	fused, err := NewEngine(model, first, last, batch, seed, Options{})
	if err != nil {
		return Cost{}, err
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
	var fs, bs, is, ws []time.Duration
	for rep := 0; rep <= reps; rep++ {
		t0 := time.Now()
		if _, err := fused.Forward(0, input, targets); err != nil {
			return Cost{}, err
		}
		t1 := time.Now()
		if _, err := fused.Backward(0, grad); err != nil {
			return Cost{}, err
		}
		t2 := time.Now()
		if split != nil {
			if _, err := split.Forward(0, input, targets); err != nil {
				return Cost{}, err
			}
			t3 := time.Now()
			if _, err := split.Input(0, grad); err != nil {
				return Cost{}, err
			}
			t4 := time.Now()
			if err := split.Weight(0); err != nil {
				return Cost{}, err
			}
			if rep > 0 {
				is, ws = append(is, t4.Sub(t3)), append(ws, time.Since(t4))
			}
		}
		if rep > 0 { // the first run warms caches and allocators
			fs, bs = append(fs, t1.Sub(t0)), append(bs, t2.Sub(t1))
		}
	}
	var params int64
	for _, p := range fused.Params() {
		params += int64(p.Shape().TotalSize())
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
	cost := Cost{F: stats.Median(fs), B: stats.Median(bs), I: stats.Median(is), W: stats.Median(ws), StashBytes: mem.Machine, StashFixedBytes: fixed,
		ParamBytes: 4 * params * size, OutBytes: int64(model.ShapeAt(last, batch).TotalSize()) * size}
	if split == nil {
		cost.I, cost.W = cost.B/2, cost.B/2
	} else {
		m, err := MeasureMemory(model, first, last, batch, seed, Options{Split: true})
		if err != nil {
			return Cost{}, err
		}
		cost.SplitStashBytes = m.Machine + m.Stash
	}
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

// EstimateTransfer is the time to move the largest activation between stages over
// gRPC on loopback: its size at 2 GB/s plus 100us per message, as measured here.
func EstimateTransfer(c *configs.Config, m *models.Model) time.Duration {
	var largest int
	for k := 1; k < c.ModelStages(); k++ {
		s, ch := c.Place(k)
		first, _ := c.ChunkLayers(s, ch)
		largest = max(largest, m.ShapeAt(first, c.MicroBatchSize()).TotalSize()*int(m.DType.Size()))
	}
	return 100*time.Microsecond + time.Duration(float64(largest)/2e9*float64(time.Second))
}
