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
