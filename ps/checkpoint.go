package ps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
)

// GroupState is what a checkpoint keeps of one stage's group: everything
// the group carries from one update to the next. Version is the updates
// made, the step the checkpoint is of (in sync mode, and async with
// max_staleness 0, one update per step).
type GroupState struct {
	Stage   int
	Version int64
	Names   []string
	Params  []*tensor.Dense
	// Slots are the optimizer's buffers by slot name, one per tensor, and
	// OptSteps its update count (Adam's bias corrections).
	Slots    map[string][]*tensor.Dense
	OptSteps int64
	// Dropped (by worker) and Staleness are the counters the server's
	// summary reports, carried over so that a resumed run's add up.
	Dropped   []int64
	Staleness map[int64]int64
}

// state copies g's state; under the server's lock, right after an update,
// so that the workers' next pushes do not change the copy.
func (g *group) state(stage int) (GroupState, error) {
	st := GroupState{Stage: stage, Version: g.m.Version(), Names: slices.Clone(g.names), Slots: map[string][]*tensor.Dense{},
		OptSteps: g.opt.Steps(), Dropped: slices.Clone(g.m.dropped), Staleness: maps.Clone(g.staleness)}
	for _, p := range g.params {
		st.Params = append(st.Params, p.Clone().(*tensor.Dense))
	}
	for _, slot := range g.opt.SlotNames() {
		for i := range g.params {
			v, err := g.opt.Slot(slot, i)
			if err != nil {
				return GroupState{}, err
			}
			st.Slots[slot] = append(st.Slots[slot], v.Clone().(*tensor.Dense))
		}
	}
	return st, nil
}

// keep copies g's state for the checkpoint of its version, when the run
// checkpoints there (Settings.CheckpointAt).
func (s *Server) keep(stage int, g *group) error {
	v := g.m.Version()
	if s.set.CheckpointAt == nil || !s.set.CheckpointAt(v) {
		return nil
	}
	st, err := g.state(stage)
	if err != nil {
		return fmt.Errorf("keeping stage %d's state for the checkpoint of step %d: %w", stage, v, err)
	}
	if s.snaps[v] == nil {
		s.snaps[v] = map[int]GroupState{}
	}
	s.snaps[v][stage] = st
	return nil
}

// Snapshot waits until groups groups have made update version (a step
// Settings.CheckpointAt names) and returns their states then, by stage,
// forgetting them. It returns nil when the run ends (every worker of every
// group gone) before they all get there: a stopped run's last steps.
func (s *Server) Snapshot(ctx context.Context, version int64, groups int) ([]GroupState, error) {
	for {
		s.mu.Lock()
		if err := s.err; err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if got := s.snaps[version]; len(got) >= groups {
			delete(s.snaps, version)
			s.mu.Unlock()
			out := slices.Collect(maps.Values(got))
			sort.Slice(out, func(i, j int) bool { return out[i].Stage < out[j].Stage })
			return out, nil
		}
		finished, changed := s.finished(groups), s.changed
		s.mu.Unlock()
		if finished {
			return nil, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Restore starts the server from a checkpoint's states, before it serves:
// each group at the checkpoint's version, with its weights, optimizer
// state and counters. The workers' hellos then check their tensors' names
// and shapes against it and pull its weights.
func (s *Server) Restore(states []GroupState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.groups) > 0 {
		return errors.New("restoring a server that already holds weights")
	}
	for _, st := range states {
		if err := s.restoreGroup(st); err != nil {
			return fmt.Errorf("stage %d: %w", st.Stage, err)
		}
	}
	return nil
}

func (s *Server) restoreGroup(st GroupState) error {
	if len(st.Names) != len(st.Params) || len(st.Dropped) > s.set.Rule.Workers {
		return fmt.Errorf("%d names for %d tensors and %d workers' counts for %d workers", len(st.Names), len(st.Params), len(st.Dropped), s.set.Rule.Workers)
	}
	ws := make([]engine.Weight, len(st.Params))
	for i, p := range st.Params {
		ws[i] = engine.Weight{Name: st.Names[i], Value: p.Clone().(*tensor.Dense)}
	}
	g, err := s.newGroup(ws, st.Version)
	if err != nil {
		return err
	}
	for _, slot := range g.opt.SlotNames() {
		vals := st.Slots[slot]
		if len(vals) != len(g.params) {
			return fmt.Errorf("the optimizer's %s buffers: %d for %d tensors", slot, len(vals), len(g.params))
		}
		for i, v := range vals {
			dst, err := g.opt.Slot(slot, i)
			if err != nil {
				return err
			}
			if !dst.Shape().Eq(v.Shape()) || dst.Dtype() != v.Dtype() {
				return fmt.Errorf("the optimizer's %s buffer of %s is %v %v; the tensor's is %v %v", slot, g.names[i], v.Shape(), v.Dtype(), dst.Shape(), dst.Dtype())
			}
			copyValues(dst, v)
		}
	}
	g.opt.SetSteps(st.OptSteps)
	copy(g.m.dropped, st.Dropped)
	if st.Staleness != nil {
		g.staleness = maps.Clone(st.Staleness)
	}
	s.groups[st.Stage] = g
	return nil
}

// copyValues copies src's values into dst, of the same shape and dtype.
func copyValues(dst, src *tensor.Dense) {
	switch d := dst.Data().(type) {
	case []float32:
		copy(d, src.Data().([]float32))
	case []float64:
		copy(d, src.Data().([]float64))
	}
}
