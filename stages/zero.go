package stages

import (
	"context"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/optim"
)

// Sharded optimizer state (all_reduce.shard_optimizer, ZeRO stage 1). The
// gradients are all-reduced as without it, so the finiteness check, the
// gradient norm and the tied weights' sums read whole sums, as they do
// unsharded. Each replica then updates only the elements its ring's
// reduce-scatter left it the whole sum of (collective.Owned), keeping
// optimizer state for those alone, and the ring's all-gather half passes
// the updated elements round (shareWeights). Every element's update is the
// optimizer's elementwise arithmetic on the same sum, state and weight, so
// the weights keep the unsharded run's bits, and the replicas' weight
// digests still agree. A checkpoint gathers the shards into the whole
// state (gatherState), so its part is the unsharded one's.

// shardOptimizers makes each chunk's optimizer keep the state of this
// replica's share of the chunk's elements, when the config shards it.
func (rs *replicaSync) shardOptimizers(optims []*optim.Optimizer) error {
	if rs == nil || rs.ring == nil || !rs.layout.Config.AllReduce.ShardOptimizer {
		return nil
	}
	for c, o := range optims {
		if err := o.Shard(collective.Owned(rs.layout.Plans[c], rs.replica)); err != nil {
			return fmt.Errorf("chunk %d: %w", c, err)
		}
	}
	rs.sharded = true
	return nil
}

// shareWeights passes each replica's updated elements round after the
// optimizer step, so every replica holds the step's whole weights.
func (rs *replicaSync) shareWeights(ctx context.Context, step int) error {
	if rs == nil || !rs.sharded {
		return nil
	}
	if rs.weightBufs == nil {
		rs.weightBufs = make([][2]any, len(rs.chunks))
	}
	for c, chunk := range rs.chunks {
		ws := chunk.Weights()
		vals := weightValues(ws)
		// Alternate buffers: the ring may still be sending the last step's.
		buf := &rs.weightBufs[c][step%2]
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
