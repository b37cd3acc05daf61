package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/schedule"
)

// ringFlags are --allreduce-bandwidth and --allreduce-latency, which simulate
// and plan share: the figures the ring all-reduce is charged at.
type ringFlags struct {
	bandwidth  string // bytes per second, "measure", or "" for the default
	latency    time.Duration
	latencySet bool
	prefix     string // of the flags' names: "" for allreduce, or within-host
}

// flag names the flag of what ("bandwidth" or "latency") in errors.
func (f ringFlags) flag(what string) string {
	if f.prefix == "" {
		return "--allreduce-" + what
	}
	return "--" + f.prefix + "-" + what
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
		return r, fmt.Errorf("%s %v: must be 0 or more", f.flag("latency"), f.latency)
	}
	switch f.bandwidth {
	case "":
	case "measure":
		ranks = max(ranks, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		m, err := collective.MeasureLoopback(ctx, ranks, bucketBytes, 5, streams)
		if err != nil {
			return r, fmt.Errorf("%s measure: %w", f.flag("bandwidth"), err)
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
			return r, fmt.Errorf("%s: %w", f.flag("bandwidth"), err)
		}
		r.bytesPerSecond, r.bwKnown = v, true
	}
	return r, nil
}

// link is the figures as a schedule.Link.
func (r ringFigures) link() schedule.Link {
	return schedule.Link{BytesPerSecond: r.bytesPerSecond, Latency: r.latency}
}

// addHostFlags adds the flags of the hosts' layout that simulate and plan
// share: the links within a host and the replicas each holds, which the
// hierarchical all-reduce is charged with.
func addHostFlags(c *cobra.Command, within *ringFlags, perHost *int) {
	c.Flags().StringVar(&within.bandwidth, "within-host-bandwidth", "", "bytes per second one replica sends to another of its host, for the hierarchical all-reduce, e.g. 5GB/s, or measure: time the ring here on loopback (default: --allreduce-bandwidth's figure, said so)")
	c.Flags().DurationVar(&within.latency, "within-host-latency", 0, "cost of each message between replicas of one host (default: --allreduce-latency's figure, said so)")
	c.Flags().IntVar(perHost, "replicas-per-host", 0, "lay the replicas out on hosts, this many consecutive replicas each, for the hierarchical all-reduce (default: the hosts of the stages' addresses)")
}

// resolveWithin is the figures of the links within a host: those the flags
// give, or measure (needed only when hierarchical is charged), the rest
// taken from across, the figures of the links between hosts, and marked as
// not known.
func resolveWithin(f ringFlags, across ringFigures, needed bool, bucketBytes int, streams bool) (ringFigures, error) {
	f.prefix = "within-host"
	if f.latency < 0 {
		return ringFigures{}, fmt.Errorf("%s %v: must be 0 or more", f.flag("latency"), f.latency)
	}
	if f.bandwidth == "measure" && !needed {
		f.bandwidth = "" // nothing to charge it to, so nothing to measure
	}
	r := ringFigures{bytesPerSecond: across.bytesPerSecond, latency: across.latency}
	if f.bandwidth != "" {
		m, err := f.resolve(2, bucketBytes, streams)
		if err != nil {
			return r, err
		}
		r = m
	}
	if f.latencySet {
		r.latency, r.latKnown = f.latency, true
	} else if f.bandwidth != "measure" {
		r.latency, r.latKnown = across.latency, false
	}
	return r, nil
}
