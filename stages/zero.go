package stages

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/optim"
)

// Sharded optimizer state (all_reduce.shard_optimizer, ZeRO stage 1). The
// gradients are reduce-scattered with the ring's first half, so each
// replica holds the whole sum of its own chunks (collective.Owned), folded
// as the all-reduce folds it. Each replica updates only those elements,
// keeping optimizer state for them alone, and the ring's all-gather half
// passes the updated elements round (shareWeights). Every element's update
// is the optimizer's elementwise arithmetic on the same sum, state and
// weight, so the weights keep the unsharded run's bits, and the replicas'
// weight digests still agree. The finiteness check reads each replica's
// own sums and the replicas share their verdicts (checkSummedGradients).
// Clipping by the global norm and tied weights read whole sums: with
// either, the gradients are all-reduced whole as unsharded, and the
// weights all-gathered besides. A checkpoint gathers the shards into the
// whole state (gatherState), so its part is the unsharded one's.

// shardOptimizers makes each chunk's optimizer keep the state of this
// replica's share of the chunk's elements, when the config shards it.
func (rs *replicaSync) shardOptimizers(optims []*optim.Optimizer) error {
	if rs == nil || rs.ring == nil || !rs.layout.Config.AllReduce.ShardOptimizer {
		return nil
	}
	for c, o := range optims {
		own := collective.Owned(rs.layout.Plans[c], rs.replica)
		if err := o.Shard(own); err != nil {
			return fmt.Errorf("chunk %d: %w", c, err)
		}
		rs.owned = append(rs.owned, own)
	}
	rs.sharded = true
	cfg := rs.layout.Config
	rs.reducer.scatter = cfg.Train.ClipGradNorm == 0 && len(rs.layout.Model.Tied) == 0
	return nil
}

// reduceChunk sums a chunk's gradients over the ring: all-reduced, or
// reduce-scattered alone when a sharded optimizer needs only its own sums.
func reduceChunk[T float32 | float64](ctx context.Context, rd *reducer, step int64, chunk, lo, hi int, v []T) error {
	p, base := rd.plans[chunk].Slice(lo, hi), rd.bases[chunk]+lo*rd.ring.Size
	if rd.scatter {
		return collective.ReduceScatter(ctx, rd.ring, step, base, p, v)
	}
	return collective.AllReduce(ctx, rd.ring, step, base, p, v)
}

// unflattenSums puts a finished reduction's sums in place of the chunk's
// gradients. After a reduce-scatter only this replica's own chunks are
// sums: the rest are running sums no one may read, and are zeroed (the
// optimizer step zeroes them anyway).
func (rs *replicaSync) unflattenSums(j *reduction, grads []*tensor.Dense) {
	if !rs.reducer.scatter {
		unflatten(j.flat, grads)
		return
	}
	switch v := j.flat.(type) {
	case []float32:
		keepOwned(v, rs.owned[j.chunk], grads)
	case []float64:
		keepOwned(v, rs.owned[j.chunk], grads)
	}
}

func keepOwned[T float32 | float64](flat []T, own [][2]int, grads []*tensor.Dense) {
	off := 0
	for _, g := range grads {
		d := g.Data().([]T)
		clear(d)
		for _, o := range own {
			if lo, hi := max(o[0], off), min(o[1], off+len(d)); lo < hi {
				copy(d[lo-off:hi-off], flat[lo:hi])
			}
		}
		off += len(d)
	}
}

// verdictBytes is a replica's verdict on its summed gradients: a flag, and
// the value found.
const verdictBytes = 16

// checkSummedGradients runs the finiteness check on the step's summed
// gradients. With a sharded optimizer the replicas then share their
// verdicts: after a reduce-scatter each has checked its own sums only, and
// all of them must stop at the step a NaN or an infinity reached any
// share of. The round also frees the step's gradient buffers for the
// weights' all-gather (shareWeights), so it runs after an all-reduce too.
func (r *Runtime) checkSummedGradients(ctx context.Context, step int) error {
	err := r.checkGradients(step)
	rs := r.replicas
	if rs == nil || !rs.sharded {
		return err
	}
	mine := make([]byte, verdictBytes)
	if nf := asNonFinite(err); nf != nil {
		mine[0] = 1
		binary.LittleEndian.PutUint64(mine[8:], math.Float64bits(nf.value))
	} else if err != nil {
		return err
	}
	all, gerr := rs.gather(ctx, int64(step), finiteTag, mine)
	if err != nil || gerr != nil {
		return cmp.Or(err, fmt.Errorf("sharing the replicas' verdicts on their gradients: %w", gerr))
	}
	for k, v := range all {
		if v[0] == 1 {
			return &nonFiniteError{what: fmt.Sprintf("a gradient in replica %d's share", k), value: math.Float64frombits(binary.LittleEndian.Uint64(v[8:])), step: step + 1, stage: r.name()}
		}
	}
	return nil
}

// shareWeights passes each replica's updated elements round after the
// optimizer step, so every replica holds the step's whole weights.
func (rs *replicaSync) shareWeights(ctx context.Context, step int) error {
	if rs == nil || !rs.sharded {
		return nil
	}
	for c, chunk := range rs.chunks {
		ws := chunk.Weights()
		vals := weightValues(ws)
		// The weights travel in the step's gradient buffer, which no
		// message still reads: the verdicts' round after the reductions
		// (checkSummedGradients) has shown that the next replica took every
		// message of them. It is the next step's other buffer, so the
		// gathered weights may be sent from it until the step after.
		buf := &rs.reducer.buffers[c][step%2]
		*buf = flatten(vals, *buf)
		if err := rs.gatherOwned(ctx, int64(step), c, *buf); err != nil {
			return fmt.Errorf("sharing chunk %d's updated weights: %w", c, err)
		}
		unflatten(*buf, vals)
		if err := chunk.LoadWeights(ws); err != nil {
			return err
		}
	}
	return nil
}

// gatherOwned runs chunk c's plan's all-gather half over flat, marking the
// wait on the ring.
func (rs *replicaSync) gatherOwned(ctx context.Context, step int64, c int, flat any) error {
	rd := rs.reducer
	rs.waitOnRing()
	before := rs.ring.Sent
	var err error
	switch v := flat.(type) {
	case []float32:
		err = collective.AllGatherOwned(ctx, rs.ring, step, rd.bases[c], rd.plans[c], v)
	case []float64:
		err = collective.AllGatherOwned(ctx, rs.ring, step, rd.bases[c], rd.plans[c], v)
	}
	if err != nil {
		return err
	}
	rs.act.resumed()
	rs.live.sentOn("replicas", rs.ring.Sent-before)
	return nil
}

func weightValues(ws []compute.Weight) []*tensor.Dense {
	out := make([]*tensor.Dense, len(ws))
	for i, w := range ws {
		out[i] = w.Value
	}
	return out
}

// slotState is the whole optimizer state of a stage: per chunk, per slot
// name (SlotNames' order), per parameter.
type slotState [][][]*tensor.Dense

// gatherState assembles the replicas' shards of every chunk's optimizer
// state into the whole state, on every replica, for a checkpoint of step.
// Each slot travels as the weights do: a replica exports its owned
// elements into a zeroed vector and the ring's all-gather fills the rest.
func (rs *replicaSync) gatherState(ctx context.Context, step int, optims []*optim.Optimizer) (slotState, error) {
	out := make(slotState, len(rs.chunks))
	for c, chunk := range rs.chunks {
		o := optims[c]
		ws := chunk.Weights()
		for _, name := range o.SlotNames() {
			full := make([]*tensor.Dense, len(ws))
			for i, w := range ws {
				full[i] = tensor.New(tensor.Of(w.Value.Dtype()), tensor.WithShape(w.Value.Shape().Clone()...))
				if err := o.ExportSlot(name, i, full[i]); err != nil {
					return nil, err
				}
			}
			// A fresh vector: the ring may send from it after this returns.
			flat := flatten(full, nil)
			if err := rs.gatherOwned(ctx, int64(step), c, flat); err != nil {
				return nil, fmt.Errorf("gathering chunk %d's optimizer state %q: %w", c, name, err)
			}
			unflatten(flat, full)
			out[c] = append(out[c], full)
		}
	}
	return out, nil
}

// shardLine says how much optimizer state this replica keeps against the
// whole, for the stage's log ("" unsharded): what sharding saves, measured.
func (rs *replicaSync) shardLine(optims []*optim.Optimizer) string {
	if rs == nil || !rs.sharded {
		return ""
	}
	var mine, whole int64
	for c, o := range optims {
		mine += o.StateBytes()
		whole += int64(rs.layout.Plans[c].N*len(o.SlotNames())) * int64(dtypeSize(rs.layout.Model))
	}
	return fmt.Sprintf("optimizer state %d bytes, this replica's share of %d (all_reduce.shard_optimizer)", mine, whole)
}
