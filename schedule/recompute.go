package schedule

import "slices"

// Activation recomputation trades compute for memory: a chunk that
// recomputes keeps only each micro-batch's input between its forward and its
// backward, and runs the forward again (RF) right before the backward or
// input-gradient pass needs the activations. Like lowering, it is a pass over
// a compute-only schedule, so that every schedule gains it the same way and
// the simulator charges it (an RF costs a forward) and PeakMemory counts it.

// WithRecompute returns a copy of s in which every chunk for which recomputes
// reports true runs an RF of each micro-batch right before that
// micro-batch's B or I. s itself is unchanged; chunks already recomputing
// are left as they are.
func (s *Schedule) WithRecompute(recomputes func(stage, chunk int) bool) *Schedule {
	out := *s
	out.Actions = make([][]Action, len(s.Actions))
	for st, list := range s.Actions {
		chunks := make([]bool, max(s.Chunks, 1))
		for c := range chunks {
			chunks[c] = recomputes(st, c) && !RecomputesChunk(list, c)
		}
		next := make([]Action, 0, len(list))
		for _, a := range list {
			if (a.Kind == Backward || a.Kind == Input) && a.Chunk < len(chunks) && chunks[a.Chunk] {
				r := a
				r.Kind = Recompute
				next = append(next, r)
			}
			next = append(next, a)
		}
		out.Actions[st] = next
	}
	return &out
}

// RecomputesChunk reports whether a stage's actions recompute chunk's
// forwards (RF), for which the stage builds that chunk's engine to keep only
// its inputs.
func RecomputesChunk(actions []Action, chunk int) bool {
	for _, a := range actions {
		if a.Chunk == chunk && a.Kind == Recompute {
			return true
		}
	}
	return false
}

// Recomputes reports whether any stage recomputes a forward (RF).
func (s *Schedule) Recomputes() bool {
	for _, list := range s.Actions {
		if slices.ContainsFunc(list, func(a Action) bool { return a.Kind == Recompute }) {
			return true
		}
	}
	return false
}
