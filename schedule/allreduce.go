package schedule

import "math"

// RingAllReduce is the cost model of the ring all-reduce with which the
// data-parallel replicas of a stage sum its gradients (package collective):
// the gradient is cut into buckets reduced one after another, and each
// bucket is a reduce-scatter then an all-gather, each R-1 steps in which
// every rank sends a 1/R share of the bucket to the next. A rank thus sends
// 2(R-1)/R of the bytes, in 2(R-1) messages per bucket, and the all-reduce
// of S bytes takes 2(R-1)/R · S / Bandwidth + 2(R-1) · buckets · Latency.
// Bandwidth and Latency are in the simulator's units (bytes per ms and ms,
// say). The model leaves out what the ring shares with the pipeline: the
// cores that add the shares and the links' capacity, both of which the
// stage's compute and transfers use at the same time.
type RingAllReduce struct {
	Replicas    int     // ranks in the ring; with 1 there is nothing to reduce
	Bandwidth   float64 // bytes per unit of time one rank sends; 0: latency alone
	Latency     float64 // per message
	BucketBytes int64   // largest bucket; 0: the whole gradient at once
	// ReduceToOne costs all_reduce.algorithm reduce-to-one instead of the
	// ring: each bucket travels whole along 2(R-1) hops, buckets a hop
	// apart, so B buckets take B+2R-3 steps of a message's latency; the
	// busiest rank sends every bucket twice (once with two replicas), and
	// the last bucket's hops after the first add 2R-3 buckets' transfers.
	ReduceToOne bool
	// Hosts costs all_reduce.algorithm hierarchical instead: how many
	// consecutive replicas each host holds, in replica order, as the
	// collective's plan groups them (configs.Config.ReplicaHosts). Within
	// is then the links between replicas of one host, and Bandwidth and
	// Latency those across hosts. nil costs the ring or reduce-to-one.
	Hosts  []int
	Within LinkFigures
}

// LinkFigures are a link's costs in the simulator's units: the bytes a rank
// sends per unit of time (0: latency alone) and the latency of a message.
type LinkFigures struct {
	Bandwidth, Latency float64
}

// Time returns how long the all-reduce of bytes takes: 0 with one replica or
// nothing to reduce.
func (r RingAllReduce) Time(bytes int64) float64 {
	if r.Replicas <= 1 || bytes <= 0 {
		return 0
	}
	n := float64(r.Replicas)
	buckets := 1.0
	if r.BucketBytes > 0 {
		buckets = math.Ceil(float64(bytes) / float64(r.BucketBytes))
	}
	if r.Hosts != nil {
		return r.hierarchicalTime(float64(bytes), buckets)
	}
	if r.ReduceToOne {
		return r.reduceToOneTime(float64(bytes), n, buckets)
	}
	t := 2 * (n - 1) * buckets * r.Latency
	if r.Bandwidth > 0 {
		t += 2 * (n - 1) / n * float64(bytes) / r.Bandwidth
	}
	return t
}

func (r RingAllReduce) reduceToOneTime(bytes, n, buckets float64) float64 {
	hops := 2 * (n - 1)
	t := (buckets + hops - 1) * r.Latency
	if r.Bandwidth > 0 {
		bucket := bytes
		if r.BucketBytes > 0 {
			bucket = min(bytes, float64(r.BucketBytes))
		}
		t += (min(2, n-1)*bytes + (hops-1)*bucket) / r.Bandwidth
	}
	return t
}

// hierarchicalTime charges the collective's hierarchical schedule step by
// step, each step as long as its largest message, buckets one after
// another. With G hosts, the largest holding L replicas, a bucket of S
// bytes takes:
//
//   - L-1 steps within hosts, the whole bucket travelling down each host's
//     replicas to its leader (the host's sum);
//   - 2G-1 rounds across hosts, each a chunk of S/G crossing one host link
//     from a leader to the next host, then relayed down that host's L-1
//     other replicas to its leader: 2G-2 rounds of the leaders' ring
//     (reduce-scatter and all-gather), and a last round that brings the
//     relaying replicas the chunks they lack (the broadcast within hosts),
//     which stops one replica short of each leader (with L = 1 it is
//     empty: one replica per host is the ring).
//
// With one host the "host link" joins its leader to its first replica: a
// link within the host. The whole's bytes over the buckets give the
// transfer terms; each bucket pays every step's latency.
func (r RingAllReduce) hierarchicalTime(bytes, buckets float64) float64 {
	g, l := float64(len(r.Hosts)), 0.0
	for _, h := range r.Hosts {
		l = max(l, float64(h))
	}
	across := LinkFigures{Bandwidth: r.Bandwidth, Latency: r.Latency}
	if g == 1 {
		across = r.Within
	}
	crossings := 2*g - 2 // messages over a host link, per bucket
	relays := (2*g - 2) * (l - 1)
	if l > 1 {
		crossings++
		relays += l - 2
	}
	t := buckets * ((l-1+relays)*r.Within.Latency + crossings*across.Latency)
	t += transfer(r.Within, (l-1)*bytes+relays*bytes/g) + transfer(across, crossings*bytes/g)
	return t
}

// transfer is how long the link takes to carry bytes, latency aside.
func transfer(l LinkFigures, bytes float64) float64 {
	if l.Bandwidth <= 0 {
		return 0
	}
	return bytes / l.Bandwidth
}

// ParameterServers is the cost model of a worker stage's exchange with the
// parameter servers (package ps) at the end of its step: it pushes its
// gradients to the servers holding its tensors, then pulls their updated
// weights, each one stream per server. Every worker does the same at the
// same time, so each server's link carries Workers pushes (and then
// pulls) of the bytes it holds of the stage, and each worker's link all the
// stage's bytes: each way takes Latency plus the busier of the two at
// Bandwidth. The model's workers are identical and in step, so it charges
// backup workers (aggregate) and async updates as sync: every worker's
// push still crosses the servers' links each step, and what those modes
// buy, not waiting for a slow or lost worker, needs workers that differ.
// The servers' optimizer step is not charged; nor are several stages
// meeting on one server (they end their steps at different times).
type ParameterServers struct {
	Workers int
	Link    LinkFigures // each server's link, and each worker's
}

// Time returns how long a worker stage's push and pull take, bytes[k] being
// the stage's bytes that server k holds: 0 when it holds none.
func (p ParameterServers) Time(bytes []int64) float64 {
	var total, busiest int64
	for _, b := range bytes {
		total += b
		busiest = max(busiest, b)
	}
	if total <= 0 {
		return 0
	}
	load := max(float64(max(1, p.Workers))*float64(busiest), float64(total))
	return 2 * (p.Link.Latency + transfer(p.Link, load))
}

// LayerBuckets cuts a chunk's all-reduce into its buckets under
// all_reduce.overlap layer (Costs.Buckets), in the order the ring runs
// them: cut from the chunk's first gradient byte on in BucketBytes, handed
// over last first, each once the chunk's last weight pass has finished the
// earliest layer it lies in. bytes are the chunk's layers' gradient bytes,
// in layer order, and work their shares of that pass in any unit (nil: in
// proportion to their bytes, as a dense layer's weight gradient costs); the
// pass runs the layers last to first. Each bucket costs its own Time.
func (r RingAllReduce) LayerBuckets(bytes []int64, work []float64) []Bucket {
	if work == nil {
		work = make([]float64, len(bytes))
		for k, b := range bytes {
			work[k] = float64(b)
		}
	}
	var total int64
	var whole float64
	for k, b := range bytes {
		total += b
		whole += work[k]
	}
	if total <= 0 {
		return nil
	}
	size := r.BucketBytes
	if size <= 0 {
		size = total
	}
	var out []Bucket
	for lo := (total - 1) / size * size; lo >= 0; lo -= size {
		ready := 1.0
		if whole > 0 {
			ready = workFrom(bytes, work, lo) / whole
		}
		out = append(out, Bucket{Ready: ready, Time: r.Time(min(size, total-lo))})
	}
	return out
}

// workFrom is the work of the layers from the one holding byte at to the
// last: what the last weight pass has done when that layer's gradients are
// final.
func workFrom(bytes []int64, work []float64, at int64) float64 {
	from, before := 0, int64(0)
	for from+1 < len(bytes) && before+bytes[from] <= at {
		before += bytes[from]
		from++
	}
	var done float64
	for _, w := range work[from:] {
		done += w
	}
	return done
}
