package predict

import (
	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// Replication is the cost model of the data-parallel replicas: the ring
// with which each stage's replicas sum its gradients after their last
// backward of each chunk, and the gradient bytes each chunk reduces.
type Replication struct {
	Replicas int
	Ring     schedule.RingAllReduce // in ms
	Grads    [][]int64              // per stage, per chunk of the config; nil with one replica
}

// BucketBytes is the largest all-reduce bucket of cfg in bytes: whole
// elements of the model's dtype, as the replicas' plans cut them
// (collective.BucketElems).
func BucketBytes(cfg *configs.Config, model *models.Model) int {
	size := int(model.DType.Size())
	return collective.BucketElems(cfg.BucketBytes(), size) * size
}

// NewReplication charges the all-reduces of cfg's replicas at link's
// figures (a message's latency and the bytes a rank sends per second).
func NewReplication(cfg *configs.Config, model *models.Model, link schedule.Link) (*Replication, error) {
	r := &Replication{Replicas: cfg.Replicas()}
	r.Ring = schedule.RingAllReduce{Replicas: r.Replicas, Bandwidth: link.BytesPerMS(), Latency: link.LatencyMS(), BucketBytes: int64(BucketBytes(cfg, model)),
		ReduceToOne: cfg.ReduceAlgorithm() == "reduce-to-one"}
	if r.Replicas == 1 {
		return r, nil
	}
	size := int(model.DType.Size())
	for s := range cfg.Stages {
		var chunks []int64
		for chunk := 0; chunk < cfg.VirtualStages; chunk++ {
			first, last := cfg.ChunkLayers(s, chunk)
			n, err := models.ParamCount(model, first, last)
			if err != nil {
				return nil, err
			}
			chunks = append(chunks, int64(n*size))
		}
		r.Grads = append(r.Grads, chunks)
	}
	return r, nil
}

// Costs returns c with the all-reduces of a schedule of the given chunks per
// stage. A schedule with other chunks than the config's (interleaved as a
// what-if) has the stage's gradients spread evenly over its chunks.
func (r *Replication) Costs(c schedule.Costs, chunks int) schedule.Costs {
	if r == nil || r.Replicas <= 1 {
		return c
	}
	c.AllReduce = make([][]float64, len(r.Grads))
	for s, g := range r.Grads {
		bytes := g
		if len(g) != chunks {
			var total int64
			for _, b := range g {
				total += b
			}
			bytes = make([]int64, chunks)
			for k := range bytes {
				bytes[k] = total / int64(chunks)
			}
			bytes[0] += total % int64(chunks)
		}
		for _, b := range bytes {
			c.AllReduce[s] = append(c.AllReduce[s], r.Ring.Time(b))
		}
	}
	return c
}
