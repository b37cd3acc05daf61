package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Grid is one way to lay out a number of processes: Stages pipeline stages,
// each run by Replicas data-parallel replicas, with the fastest plan for it,
// or why there is none.
type Grid struct {
	Stages, Replicas int
	Plan             *Plan // nil when Err is set
	Err              error
}

// SolveGrids plans every grid (p, R) with p × R = processes: for each, Solve
// on the problem with p stages and R replicas (Problem.Stages and Replicas
// are ignored), the micro-batch counts narrowed to those that divide the
// replicas' batch, Batch/R. A grid is left without a plan when it has more
// stages than layers, R does not divide the batch, no micro-batch count
// fits, or no split fits the memory limit. The grids come in order of
// increasing R; best is the plan with the most samples per second (all
// grids share the batch, so the shortest step), a grid with more replicas
// chosen only when it is faster by more than Problem.Margin (by anything
// without one). The error, when no grid has a plan, gives each grid's reason.
func SolveGrids(p Problem, processes int) (best *Plan, grids []Grid, err error) {
	if processes < 1 {
		return nil, nil, fmt.Errorf("plan: %d processes: need at least 1", processes)
	}
	for r := 1; r <= processes; r++ {
		if processes%r != 0 {
			continue
		}
		g := Grid{Stages: processes / r, Replicas: r}
		q := p
		q.Stages, q.Replicas = g.Stages, r
		g.Plan, g.Err = solveGrid(q)
		grids = append(grids, g)
		// A grid with more replicas must beat the best so far by the
		// margin, as a later candidate must in Solve.
		if g.Plan != nil && (best == nil || p.band(g.Plan.StepMS) < best.StepMS) {
			best = g.Plan
		}
	}
	if best == nil {
		var why []string
		for _, g := range grids {
			why = append(why, fmt.Sprintf("%d×%d: %s", g.Stages, g.Replicas, strings.TrimPrefix(g.Err.Error(), "plan: ")))
		}
		return nil, grids, fmt.Errorf("plan: no grid of %d processes has a plan (stages × replicas): %s", processes, strings.Join(why, "; "))
	}
	return best, grids, nil
}

// solveGrid solves one grid, first saying plainly why it cannot be run.
func solveGrid(p Problem) (*Plan, error) {
	r := p.replicas()
	switch {
	case len(p.Layers) < p.Stages:
		return nil, fmt.Errorf("plan: %d stages for %d layers", p.Stages, len(p.Layers))
	case p.Batch%r != 0:
		return nil, fmt.Errorf("plan: %d replicas do not divide the batch of %d", r, p.Batch)
	case p.MicroBatches > 0:
		if p.Batch%(r*p.MicroBatches) != 0 {
			return nil, fmt.Errorf("plan: %d micro-batches do not divide the replicas' batch of %d", p.MicroBatches, p.Batch/r)
		}
	default:
		p.Candidates = slices.DeleteFunc(slices.Clone(p.Candidates), func(m int) bool { return m < 1 || p.Batch%(r*m) != 0 })
		if len(p.Candidates) == 0 {
			return nil, errors.New("plan: no micro-batch count to try divides the replicas' batch")
		}
	}
	return Solve(p)
}

// Reduction is a plan simulated with one way of summing its gradients.
type Reduction struct {
	Algorithm string // one of Algorithms
	Plan      *Plan  // nil when Err is set
	Err       error
}

// CompareReductions simulates pl, a plan of p's (Solve's, or a grid's of
// SolveGrids, whose stages and replicas it takes), under each of
// algorithms in turn: the same split, schedule, micro-batches and
// recomputation, only the reduction charged otherwise. The results come in
// the order given; best is the index of the shortest step (the first of
// equals), -1 when none could be simulated.
func CompareReductions(p Problem, pl *Plan, algorithms []string) (out []Reduction, best int) {
	best = -1
	p.Stages, p.Replicas = pl.Stages(), pl.Replicas
	for _, a := range algorithms {
		q := p
		// all_reduce.overlap layer runs with the ring alone.
		q.Algorithm, q.PerLayer = a, p.PerLayer && a == "ring"
		r := Reduction{Algorithm: a}
		r.Plan, r.Err = Evaluate(q, pl.Boundaries, pl.Schedule, pl.MicroBatches, pl.Recompute)
		if r.Err == nil && (best < 0 || r.Plan.StepMS < out[best].Plan.StepMS) {
			best = len(out)
		}
		out = append(out, r)
	}
	return out, best
}
