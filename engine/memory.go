package engine

import (
	"fmt"
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// A micro-batch in flight owns a tape machine from its forward to its
// backward (to its input-gradient pass when split), and a machine keeps its
// registers when it goes back to the pool, to be reused by the next
// micro-batch: so a stage's activation memory is its pool, as large as the
// most micro-batches it ever had in flight at once, times a machine's
// registers, plus a stash for every micro-batch between its input-gradient
// and weight passes, plus the weight program's registers once it has run
// (schedule.ChunkMemory, schedule.PeakMemory).

// HeldBytes is the activation memory e holds now: the registers of every
// machine it has made, in flight or idle, the split stashes, in flight or
// spare, and the weight program's registers. A value several registers share counts once.
func (e *Engine) HeldBytes() int64 {
	// A stage asks after every action: the map is kept between calls.
	if e.seen == nil {
		e.seen = map[uintptr]int64{}
	}
	clear(e.seen)
	seen := e.owned(e.seen)
	var total int64
	machine := func(vm G.VM) {
		regs, _ := registerFile(vm)
		for _, v := range regs {
			total += valueBytes(v, seen)
		}
	}
	for _, f := range e.flights {
		if f.vm != nil {
			machine(f.vm)
		}
		if f.input != nil {
			total += valueBytes(f.input, seen)
		}
		for _, v := range f.stash {
			total += valueBytes(v, seen)
		}
	}
	for _, vm := range e.idle {
		machine(vm)
	}
	for _, vs := range e.spare {
		for _, v := range vs {
			total += valueBytes(v, seen)
		}
	}
	for _, w := range e.weights {
		machine(w.vm)
	}
	return total
}

// owned marks the memory that registers point into without it being
// activations: the parameters and their gradients. A machine's registers
// also point at its micro-batch's input, targets and upstream gradient, which
// stay alive as long as the machine keeps them: they count.
func (e *Engine) owned(seen map[uintptr]int64) map[uintptr]int64 {
	for _, n := range e.params {
		valueBytes(n.Value(), seen)
		if g, ok := e.gradOf(n); ok {
			valueBytes(g, seen)
		}
	}
	for _, g := range e.grads {
		if g != nil {
			valueBytes(g, seen)
		}
	}
	return seen
}

// valueBytes is v's size the first time its memory is seen, else 0.
func valueBytes(v G.Value, seen map[uintptr]int64) int64 {
	if v == nil {
		return 0
	}
	if _, scalar := v.(G.Scalar); scalar {
		return 0 // a few bytes inside the register itself
	}
	d, ok := v.(tensor.Tensor)
	if !ok || d.Uintptr() == 0 {
		return 0
	}
	p, n := d.Uintptr(), int64(d.MemSize())
	if old, dup := seen[p]; dup && old >= n {
		return 0
	}
	old := seen[p]
	seen[p] = n
	return n - old
}

// MeasureMemory runs one micro-batch through fresh engines for layers
// [first, last) built with o and reports the bytes its programs hold:
// Machine from the fused program (or the split input program when split),
// Stash and Weight when split, and Input, the input a recomputing engine
// keeps between forward and recomputation. They depend only on the shapes,
// which fix every register.
func MeasureMemory(model *models.Model, first, last, batch int, seed uint64, o Options) (schedule.ChunkMemory, error) {
	e, err := NewEngine(model, first, last, batch, seed, o)
	if err != nil {
		return schedule.ChunkMemory{}, err
	}
	r := rand.New(rand.NewPCG(seed, 98))
	input := randomDense(r, model.DType, e.InShape())
	if first == 0 && model.Targets() > 1 {
		input = randomTokens(r, model.DType, e.InShape(), model.Classes)
	}
	targets := make([]int, batch*model.Targets())
	grad := e.LossScale(1)
	if !e.IsLast() {
		grad = randomDense(r, model.DType, e.OutShape())
	}
	if _, err := e.Forward(0, input, targets); err != nil {
		return schedule.ChunkMemory{}, err
	}
	var m schedule.ChunkMemory
	if o.Recompute {
		m.Input = int64(input.MemSize())
		if err := e.Recomputation(0); err != nil {
			return schedule.ChunkMemory{}, err
		}
	}
	if !o.Split {
		if _, err := e.Backward(0, grad); err != nil {
			return schedule.ChunkMemory{}, err
		}
		m.Machine = e.HeldBytes()
		return m, nil
	}
	if _, err := e.Input(0, grad); err != nil {
		return schedule.ChunkMemory{}, err
	}
	withStash := e.HeldBytes()
	seen := e.owned(map[uintptr]int64{})
	for _, v := range e.flights[0].stash {
		m.Stash += valueBytes(v, seen)
	}
	m.Machine = withStash - m.Stash
	if err := e.Weight(0); err != nil {
		return schedule.ChunkMemory{}, err
	}
	m.Weight = e.HeldBytes() - m.Machine - m.Stash // the stash stays, for the next input pass
	if m.Machine <= 0 || m.Weight < 0 {
		return schedule.ChunkMemory{}, fmt.Errorf("layers [%d, %d): inconsistent memory %+v", first, last, m)
	}
	return m, nil
}

// OptionsFor is how a stage's engine for chunk is built to run actions, the
// stage's share of the schedule: split where the schedule splits the chunk's
// backward, recomputing where it recomputes the chunk's forwards, and
// selective where the stage asks for it.
func OptionsFor(actions []schedule.Action, chunk int, selective bool) Options {
	return Options{
		Split:     schedule.SplitsChunk(actions, chunk),
		Recompute: schedule.RecomputesChunk(actions, chunk),
		Selective: selective,
	}
}

// PredictMemory is, per stage, the peak activation memory the schedule s
// makes each stage of p hold: every chunk's sizes measured once
// (MeasureMemory), multiplied out along the stage's actions
// (schedule.PeakMemory). Its sizes, per stage and chunk, come back too.
func PredictMemory(p Pipeline, m *models.Model, s *schedule.Schedule) ([]int64, [][]schedule.ChunkMemory, error) {
	sizes := make([][]schedule.ChunkMemory, s.Stages)
	for st := range s.Stages {
		sizes[st] = make([]schedule.ChunkMemory, max(s.Chunks, 1))
		for ch := range sizes[st] {
			first, last, err := p.chunk(st, ch)
			if err != nil {
				return nil, nil, err
			}
			mem, err := MeasureMemory(m, first, last, p.Batch, p.Seed, OptionsFor(s.Actions[st], ch, p.selective(st)))
			if err != nil {
				return nil, nil, fmt.Errorf("stage %d chunk %d: %w", st, ch, err)
			}
			sizes[st][ch] = mem
		}
	}
	return s.PeakMemory(func(st, ch int) schedule.ChunkMemory { return sizes[st][ch] }), sizes, nil
}

// splits reports whether a stage's chunk runs split backwards (as the
