package predict

import (
	"fmt"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// Replication is the cost model of the data-parallel replicas: how each
// stage's replicas sum its gradients after their last backward of each
// chunk (the config's all_reduce.algorithm, or its parameter servers), and
// the gradient bytes each chunk reduces.
type Replication struct {
	Replicas int
	Ring     schedule.RingAllReduce // in ms; hierarchical's hosts are each stage's (Hosts)
	Grads    [][]int64              // per stage, per chunk of the config; nil with one replica and no servers
	// Algorithm is what is charged: all_reduce.algorithm, or
	// "parameter servers" with parameter_servers.
	Algorithm string
	// Hosts is, per stage, how many consecutive replicas each host holds
	// (hierarchical only; nil otherwise).
	Hosts [][]int
	// Servers charges the parameter servers' push and pull instead of an
	// all-reduce (nil without servers); ServerBytes is, per stage, the
	// bytes of its tensors each server holds.
	Servers     *schedule.ParameterServers
	ServerBytes [][]int64
	// PerLayer is all_reduce.overlap layer: each bucket starts when the
	// chunk's last weight pass has finished the layers it lies in.
	// LayerBytes is, per stage and chunk, its layers' gradient bytes in
	// layer order, which place the buckets.
	PerLayer   bool
	LayerBytes [][][]int64
}

// Links are the figures the replicas' reductions are charged at.
type Links struct {
	// Across is the links between hosts: every link of the ring and
	// reduce-to-one, the hosts' ring of hierarchical, and the parameter
	// servers' links.
	Across schedule.Link
	// Within is the links between replicas of one host (hierarchical).
	Within schedule.Link
	// ReplicasPerHost lays the replicas out on hosts, that many
	// consecutive replicas each (the last host may hold fewer), for
	// hierarchical; 0 takes the hosts of the config's addresses.
	ReplicasPerHost int
}

// ParameterServersAlgorithm is Replication.Algorithm with parameter servers.
const ParameterServersAlgorithm = "parameter servers"

// BucketBytes is the largest all-reduce bucket of cfg in bytes: whole
// elements of the model's dtype, as the replicas' plans cut them
// (collective.BucketElems).
func BucketBytes(cfg *configs.Config, model *models.Model) int {
	size := int(model.DType.Size())
	return collective.BucketElems(cfg.BucketBytes(), size) * size
}

// NewReplication charges the reductions of cfg's replicas at links' figures
// (a message's latency and the bytes a rank sends per second).
func NewReplication(cfg *configs.Config, model *models.Model, links Links) (*Replication, error) {
	r := &Replication{Replicas: cfg.Replicas(), Algorithm: cfg.ReduceAlgorithm(), PerLayer: cfg.AllReduce.Overlap == "layer"}
	r.Ring = schedule.RingAllReduce{Replicas: r.Replicas, Bandwidth: links.Across.BytesPerMS(), Latency: links.Across.LatencyMS(), BucketBytes: int64(BucketBytes(cfg, model)),
		ReduceToOne: r.Algorithm == "reduce-to-one"}
	if r.Algorithm == "hierarchical" {
		r.Ring.Within = links.Within.Figures()
	}
	if cfg.PSEnabled() {
		r.Algorithm, r.PerLayer = ParameterServersAlgorithm, false
		r.Servers = &schedule.ParameterServers{Workers: r.Replicas, Link: links.Across.Figures()}
	} else if r.Replicas == 1 {
		return r, nil
	}
	size := int64(model.DType.Size())
	layers, err := layerBytes(model, size)
	if err != nil {
		return nil, err
	}
	var perServer [][]int64
	if r.Servers != nil {
		if perServer, err = stages.PSLayerBytes(cfg, model); err != nil {
			return nil, err
		}
	}
	for s := range cfg.Stages {
		var chunks []int64
		var chunkLayers [][]int64
		var served []int64
		for chunk := 0; chunk < cfg.VirtualStages; chunk++ {
			first, last := cfg.ChunkLayers(s, chunk)
			chunks = append(chunks, sum(layers[first:last]))
			chunkLayers = append(chunkLayers, layers[first:last])
			if perServer != nil {
				served = addEach(served, perServer[first:last])
			}
		}
		r.Grads, r.LayerBytes = append(r.Grads, chunks), append(r.LayerBytes, chunkLayers)
		if perServer != nil {
			r.ServerBytes = append(r.ServerBytes, served)
		}
		if r.Algorithm == "hierarchical" {
			hosts, err := ReplicaHosts(cfg, s, links.ReplicasPerHost)
			if err != nil {
				return nil, err
			}
			r.Hosts = append(r.Hosts, hosts)
		}
	}
	return r, nil
}

// ReplicaHosts is how many consecutive replicas of stage s each host holds:
// perHost each (the last host the rest), or with perHost 0 the hosts of the
// config's addresses (configs.Config.ReplicaHosts).
func ReplicaHosts(cfg *configs.Config, s, perHost int) ([]int, error) {
	r := cfg.Replicas()
	if perHost > 0 {
		var hosts []int
		for left := r; left > 0; left -= perHost {
			hosts = append(hosts, min(left, perHost))
		}
		return hosts, nil
	}
	if n := len(cfg.Stages[s].Addresses); n != r {
		return nil, fmt.Errorf("stages[%d].addresses: %d addresses lay out %d replicas on hosts, not %d: give the replicas per host (--replicas-per-host)", s, n, n, r)
	}
	return cfg.ReplicaHosts(s)
}

// layerBytes is each layer's parameter bytes: the gradient it reduces.
func layerBytes(model *models.Model, size int64) ([]int64, error) {
	out := make([]int64, len(model.Layers))
	for j := range out {
		n, err := models.ParamCount(model, j, j+1)
		if err != nil {
			return nil, err
		}
		out[j] = int64(n) * size
	}
	return out, nil
}

func sum(xs []int64) int64 {
	var t int64
	for _, x := range xs {
		t += x
	}
	return t
}

// addEach adds each row of rows to acc, element by element.
func addEach(acc []int64, rows [][]int64) []int64 {
	for _, row := range rows {
		if acc == nil {
			acc = make([]int64, len(row))
		}
		for k, x := range row {
			acc[k] += x
		}
	}
	return acc
}

// StageRing is the all-reduce of stage s: the config's algorithm, with the
// stage's hosts under hierarchical.
func (r *Replication) StageRing(s int) schedule.RingAllReduce {
	ring := r.Ring
	if r.Hosts != nil {
		ring.Hosts = r.Hosts[s]
	}
	return ring
}

// StageTime is stage s's reduction of a step, all its chunks: its
// all-reduces, or its push and pull with parameter servers.
func (r *Replication) StageTime(s int) float64 {
	if r.Servers != nil {
		return r.Servers.Time(r.ServerBytes[s])
	}
	var t float64
	for _, b := range r.Grads[s] {
		t += r.StageRing(s).Time(b)
	}
	return t
}

// Costs returns c with the reductions of a schedule of the given chunks per
// stage. A schedule with other chunks than the config's (interleaved as a
// what-if) has the stage's gradients spread evenly over its chunks (and
// under all_reduce.overlap layer its buckets start at the chunk's end: its
// layers are not the config's). Parameter servers are charged the stage's
// push and pull when its step ends.
func (r *Replication) Costs(c schedule.Costs, chunks int) schedule.Costs {
	if r == nil || r.Grads == nil {
		return c
	}
	c.AllReduce = make([][]float64, len(r.Grads))
	if r.Servers != nil {
		c.ReduceAtStepEnd = true
		for s := range r.Grads {
			c.AllReduce[s] = make([]float64, chunks)
			c.AllReduce[s][0] = r.StageTime(s)
		}
		return c
	}
	layered := r.PerLayer && len(r.Grads) > 0 && len(r.Grads[0]) == chunks
	if layered {
		c.Buckets = make([][][]schedule.Bucket, len(r.Grads))
	}
	for s, g := range r.Grads {
		for _, b := range spread(g, chunks) {
			c.AllReduce[s] = append(c.AllReduce[s], r.StageRing(s).Time(b))
		}
		if layered {
			for ch := range g {
				// A layer's share of the weight pass taken as its share
				// of the bytes: per-layer costs are not known here.
				c.Buckets[s] = append(c.Buckets[s], r.StageRing(s).LayerBuckets(r.LayerBytes[s][ch], nil))
			}
		}
	}
	return c
}

// spread is a stage's chunks' gradient bytes over the given chunks: its own
// where they are as many, else the total evenly, the remainder on the first.
func spread(g []int64, chunks int) []int64 {
	if len(g) == chunks {
		return g
	}
	total := sum(g)
	bytes := make([]int64, chunks)
	for k := range bytes {
		bytes[k] = total / int64(chunks)
	}
	bytes[0] += total % int64(chunks)
	return bytes
}
