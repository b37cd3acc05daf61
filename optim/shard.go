package optim

import (
	"fmt"

	"gorgonia.org/tensor"
)

// Sharded optimizer state (ZeRO stage 1). Data-parallel replicas that sum
// their gradients hold the same parameters and gradients, so each may
// update only its share of the elements and keep the state (momentum,
// Adam's moments) of that share alone, then pass the updated elements
// round. Every element's update reads that element and the step's scalars
// alone, so the shard's elements get the bits the whole update gives them.

// shard is the part of the parameters an optimizer owns.
type shard struct {
	// pieces are, per parameter, the owned element ranges in order.
	pieces [][]piece
	// state holds, per slot and parameter, the owned elements' state
	// ([]float32 or []float64) packed in piece order.
	state map[string][]any
}

// piece is elements [lo, hi) of a parameter, whose state is at [at, at+hi-lo).
type piece struct{ lo, hi, at int }

// Shard makes the optimizer keep state for, and update, only the elements
// in own: half-open ranges over every parameter's elements flattened in
// order (as the replicas' all-reduce flattens the gradients), ascending and
// disjoint. Step then still zeroes every gradient. It must come before the
// first step. The whole state is never allocated then.
func (o *Optimizer) Shard(own [][2]int) error {
	if o.steps != 0 || o.shard != nil {
		return fmt.Errorf("optimizer %s: sharded after %d steps (sharded before: %v)", o.cfg.Name, o.steps, o.shard != nil)
	}
	total := 0
	for _, s := range o.shapes {
		total += s.TotalSize()
	}
	prev := 0
	for k, r := range own {
		if r[0] < prev || r[1] < r[0] || r[1] > total {
			return fmt.Errorf("optimizer %s: shard range %d [%d, %d) is not ascending within the %d elements", o.cfg.Name, k, r[0], r[1], total)
		}
		prev = r[1]
	}
	sh := &shard{pieces: make([][]piece, len(o.shapes)), state: map[string][]any{}}
	owned := make([]int, len(o.shapes))
	off := 0
	for i, s := range o.shapes {
		n := s.TotalSize()
		for _, r := range own {
			lo, hi := max(r[0], off), min(r[1], off+n)
			if lo < hi {
				sh.pieces[i] = append(sh.pieces[i], piece{lo: lo - off, hi: hi - off, at: owned[i]})
				owned[i] += hi - lo
			}
		}
		off += n
	}
	for _, name := range o.SlotNames() {
		for i := range o.shapes {
			if o.dt == tensor.Float64 {
				sh.state[name] = append(sh.state[name], make([]float64, owned[i]))
			} else {
				sh.state[name] = append(sh.state[name], make([]float32, owned[i]))
			}
		}
	}
	o.shard, o.slots = sh, nil
	return nil
}

// Sharded says whether the optimizer keeps a shard of the state (Shard).
func (o *Optimizer) Sharded() bool { return o.shard != nil }

// StateBytes is the memory the optimizer's per-parameter state takes: the
// whole slots, or a shard's.
func (o *Optimizer) StateBytes() int64 {
	size := int64(4)
	if o.dt == tensor.Float64 {
		size = 8
	}
	var n int64
	for _, name := range o.SlotNames() {
		for i, s := range o.shapes {
			if o.shard == nil {
				n += int64(s.TotalSize())
				continue
			}
			switch v := o.shard.state[name][i].(type) {
			case []float32:
				n += int64(len(v))
			case []float64:
				n += int64(len(v))
			}
		}
	}
	return n * size
}

// zeroUnowned zeroes the gradients of parameter i that a shard does not
// update (the update zeroes those it does), as Step promises.
func zeroUnowned[T float32 | float64](o *Optimizer, i int, g []T) {
	if o.shard == nil {
		return
	}
	at := 0
	for _, pc := range o.shard.pieces[i] {
		clear(g[at:pc.lo])
		at = pc.hi
	}
	clear(g[at:])
}

// ExportSlot copies the state of slot name for parameter i into dst, a
// tensor of the parameter's shape: the owned elements of a shard (leaving
// the others as they are), or all of them.
func (o *Optimizer) ExportSlot(name string, i int, dst *tensor.Dense) error {
	return o.moveSlot(name, i, dst, true)
}

// ImportSlot sets the state of slot name for parameter i from src, a tensor
// of the parameter's shape: a shard takes its owned elements from it.
func (o *Optimizer) ImportSlot(name string, i int, src *tensor.Dense) error {
	return o.moveSlot(name, i, src, false)
}

func (o *Optimizer) moveSlot(name string, i int, full *tensor.Dense, out bool) error {
	o.allocate()
	if _, err := o.slotCheck(name, i); err != nil {
		return err
	}
	if !full.Shape().Eq(o.shapes[i]) || full.Dtype() != o.dt {
		return fmt.Errorf("optimizer %s: slot %q of parameter %d is %v %v, not %v %v", o.cfg.Name, name, i, o.shapes[i], o.dt, full.Shape(), full.Dtype())
	}
	switch f := full.Data().(type) {
	case []float32:
		moveState(o, name, i, f, out)
	case []float64:
		moveState(o, name, i, f, out)
	}
	return nil
}

func moveState[T float32 | float64](o *Optimizer, name string, i int, full []T, out bool) {
	st := o.slotData(name, i).([]T)
	if o.shard == nil {
		if out {
			copy(full, st)
		} else {
			copy(st, full)
		}
		return
	}
	for _, pc := range o.shard.pieces[i] {
		if out {
			copy(full[pc.lo:pc.hi], st[pc.at:])
		} else {
			copy(st[pc.at:pc.at+pc.hi-pc.lo], full[pc.lo:pc.hi])
		}
	}
}

// slotCheck reports a slot name or parameter index the optimizer does not have.
func (o *Optimizer) slotCheck(name string, i int) (string, error) {
	for _, n := range o.SlotNames() {
		if n == name && i >= 0 && i < len(o.shapes) {
			return n, nil
		}
	}
	return "", fmt.Errorf("optimizer %s has no slot %q for parameter %d", o.cfg.Name, name, i)
}
