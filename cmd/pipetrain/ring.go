package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/schedule"
)

// ringFlags are --allreduce-bandwidth and --allreduce-latency, which simulate
// and plan share: the figures the ring all-reduce is charged at.
type ringFlags struct {
	bandwidth  string // bytes per second, "measure", or "" for the default
	latency    time.Duration
	latencySet bool
}

// The ring's figures when not given: those EstimateTransfer takes for a
// message over gRPC on loopback, which the ring's links are too.
var (
	defaultAllReduceBandwidth = schedule.Loopback.BytesPerSecond
	defaultAllReduceLatency   = schedule.Loopback.Latency
)

const ringBandwidthUsage = "bytes per second one replica sends on the all-reduce ring, e.g. 1.2GB/s, or measure: time the ring here on loopback (default 2GB/s, gRPC on loopback)"

// ringFigures is what the ring is charged at and where each figure came
// from.
type ringFigures struct {
	bytesPerSecond    float64
	latency           time.Duration
	bwKnown, latKnown bool   // given or measured, not assumed
	measured          string // how they were measured; "" when not
}

// resolve reads the flags; "measure" times ranks ranks here over loopback
// links, in buckets of bucketBytes (the latency is measured too unless
// --allreduce-latency was given).
func (f ringFlags) resolve(ranks, bucketBytes int, streams bool) (ringFigures, error) {
	r := ringFigures{bytesPerSecond: defaultAllReduceBandwidth, latency: f.latency, latKnown: f.latencySet}
	if f.latency < 0 {
		return r, fmt.Errorf("--allreduce-latency %v: must be 0 or more", f.latency)
	}
	switch f.bandwidth {
	case "":
	case "measure":
		ranks = max(ranks, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m, err := collective.MeasureLoopback(ctx, ranks, bucketBytes, 5, streams)
		if err != nil {
			return r, fmt.Errorf("--allreduce-bandwidth measure: %w", err)
		}
		r.bytesPerSecond, r.bwKnown = m.BytesPerSecond, true
		if !f.latencySet {
			r.latency, r.latKnown = m.Latency, true
		}
		over := "gRPC links"
		if streams {
			over = "ring streams"
		}
		r.measured = fmt.Sprintf("measured here: %d ranks in one process over %s on loopback, median of 5 at two sizes", ranks, over)
	default:
		v, err := parseBandwidth(f.bandwidth)
		if err != nil {
			return r, fmt.Errorf("--allreduce-bandwidth: %w", err)
		}
		r.bytesPerSecond, r.bwKnown = v, true
	}
	return r, nil
}
