package schedule

import "slices"

// ChunkMemory is what one chunk of a stage holds for activations, in bytes,
// as the runtime keeps it: a machine per micro-batch between its forward and
// its backward (or input-gradient pass), kept in a pool once made; a stash
// per micro-batch between its input-gradient and weight passes, also kept
// in a pool once made (the next input pass copies into it); and the
// weight program's registers once it has run. A chunk that recomputes (RF)
// hands its machine back at the end of each forward and keeps only the
// micro-batch's input, Input bytes, until the recomputation takes a machine
// again: its pool holds one machine, and that machine, which counts its
// input in Machine, still points at the input of the last forward it ran,
// so the newest stashed input costs nothing more until a recomputation
// takes the machine.
type ChunkMemory struct {
	Machine, Stash, Weight, Input int64
}

// PeakMemory is, per stage, the most activation memory the stage holds at
// any point of a step, walking its actions in order (memory changes only at
// its own actions, so no timing is needed): every chunk's pools hold as many
// machines as that chunk ever had micro-batches in flight at once, and as
// many stashes as it ever had micro-batches between I and W, so they only
// grow. mem gives each (stage, chunk)'s sizes. The walk covers two steps:
// the second starts with the pools the first grew, which may hold more at
// its early actions than the first did (a stash pool that reached its size
// late in the first step is whole while the second's forwards keep their
// inputs); later steps repeat the second. A full backward on a chunk whose other
// backwards are split (dualpipev) runs on the split engine as its
// input-gradient and weight passes back to back, so it leaves the weight
// program's registers behind as a weight pass does.
func (s *Schedule) PeakMemory(mem func(stage, chunk int) ChunkMemory) []int64 {
	return s.peakMemory(mem, 2)
}

// peakMemory is PeakMemory over the given number of steps.
func (s *Schedule) peakMemory(mem func(stage, chunk int) ChunkMemory, steps int) []int64 {
	out := make([]int64, s.Stages)
	for st, list := range s.Actions {
		chunks := max(s.Chunks, 1)
		inUse, pool, stashed, stashes, inputs := make([]int, chunks), make([]int, chunks), make([]int, chunks), make([]int, chunks), make([]int, chunks)
		weighed, recomputes, shared, split := make([]bool, chunks), make([]bool, chunks), make([]bool, chunks), make([]bool, chunks)
		sizes := make([]ChunkMemory, chunks)
		for c := range chunks {
			sizes[c] = mem(st, c)
			recomputes[c] = RecomputesChunk(list, c)
			split[c] = SplitsChunk(list, c)
		}
		held := func() int64 {
			var n int64
			for c, m := range sizes {
				n += int64(pool[c])*m.Machine + int64(stashes[c])*m.Stash + int64(inputs[c])*m.Input
				if shared[c] && inputs[c] > 0 {
					n -= m.Input
				}
				if weighed[c] {
					n += m.Weight
				}
			}
			return n
		}
		for _, a := range slices.Repeat(list, steps) {
			c := a.Chunk
			switch a.Kind {
			case Forward:
				pool[c] = max(pool[c], inUse[c]+1)
				if recomputes[c] {
					inputs[c]++
					shared[c] = true
				} else {
					inUse[c]++
				}
			case Recompute:
				inputs[c]--
				inUse[c]++
				shared[c] = false
				pool[c] = max(pool[c], inUse[c])
			case Backward:
				inUse[c]--
				if split[c] {
					weighed[c], stashes[c] = true, max(stashes[c], 1)
				}
			case Input:
				inUse[c]--
				stashed[c]++
				stashes[c] = max(stashes[c], stashed[c])
			case Weight:
				stashed[c]--
				weighed[c] = true
			}
			out[st] = max(out[st], held())
		}
	}
	return out
}
