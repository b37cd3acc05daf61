package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

// Loopback joins ranks rings in this process by gRPC replica-ring links on
// 127.0.0.1, the links a stage's replicas use, with p's tags in their
// handshakes, and with streams also by the ring streams beside them
// (all_reduce.transport: stream), which then carry the all-reduces. close
// closes every link, stream and server; it is also what an error return
// has already done. Benchmarks and `simulate --allreduce-bandwidth
// measure` time the ring over it.
//
// The ranks share one host, so their streams run on the listeners' Unix
// stream sockets; LoopbackOverTCP keeps them on TCP.
func Loopback(ctx context.Context, ranks int, p Plan, streams bool) (rings []*Ring, close func(), err error) {
	return loopbackWith(ctx, ranks, p, loopbackOptions{streams: streams, dt: transport.Float32})
}

// LoopbackOverTCP is Loopback with ring streams whose bytes cross the TCP
// stack although the ranks share this host (transport.Options.
// StreamsOverTCP), as between hosts: to measure one against the other.
func LoopbackOverTCP(ctx context.Context, ranks int, p Plan) (rings []*Ring, close func(), err error) {
	return loopbackWith(ctx, ranks, p, loopbackOptions{streams: true, dt: transport.Float32, overTCP: true})
}

// loopback is Loopback with links of wire dtype dt.
func loopback(ctx context.Context, ranks int, p Plan, streams bool, dt transport.DType) (rings []*Ring, close func(), err error) {
	return loopbackWith(ctx, ranks, p, loopbackOptions{streams: streams, dt: dt})
}

// loopbackOptions say how loopbackWith joins its ranks.
type loopbackOptions struct {
	streams bool
	dt      transport.DType
	// overTCP keeps the streams off the stream sockets.
	overTCP bool
	// hosts[r], if set, is the loopback address rank r listens on
	// (127.0.0.1 otherwise): ranks on different ones are on different
	// hosts to the streams, as to the hierarchical all-reduce.
	hosts []string
}

// loopbackWith is Loopback as o says.
func loopbackWith(ctx context.Context, ranks int, p Plan, o loopbackOptions) (rings []*Ring, close func(), err error) {
	dt, streams := o.dt, o.streams
	hello := func(r int) transport.Hello {
		return transport.Hello{Group: transport.ReplicaGroup, Stage: 0, Stages: 1, Replica: r, Replicas: ranks,
			ConfigDigest: "loopback", DType: dt, Shapes: p.Shapes()}
	}
	rings = make([]*Ring, ranks)
	servers := make([]*transport.Server, ranks)
	close = func() {
		for _, r := range rings {
			if r != nil && r.Out != nil {
				r.Out.Close()
			}
			if r != nil && r.In != nil {
				r.In.Close()
			}
			if r != nil && r.Next != nil {
				r.Next.Close()
			}
			if r != nil && r.Prev != nil {
				r.Prev.Close()
			}
		}
		for _, s := range servers {
			if s != nil {
				s.Close()
			}
		}
	}
	for r := range ranks {
		host := "127.0.0.1"
		if r < len(o.hosts) {
			host = o.hosts[r]
		}
		s, err := transport.Listen(host+":0", hello(r), transport.Options{Streams: streams})
		if err != nil {
			close()
			return nil, nil, err
		}
		servers[r] = s
		rings[r] = &Ring{Rank: r, Size: ranks, DType: dt}
	}
	errs := make([]error, 2*ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() { rings[r].Prev, errs[2*r] = servers[r].AcceptGroup(ctx, transport.ReplicaGroup) })
		wg.Go(func() {
			h := hello(r)
			h.Address = servers[r].Addr()
			rings[r].Next, errs[2*r+1] = transport.Dial(ctx, servers[(r+1)%ranks].Addr(), h, transport.Options{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		close()
		return nil, nil, err
	}
	if streams {
		for r := range ranks {
			wg.Go(func() { rings[r].In, errs[2*r] = servers[r].AcceptStream(ctx, transport.ReplicaGroup) })
			wg.Go(func() {
				h := hello(r)
				h.Address = servers[r].Addr()
				rings[r].Out, errs[2*r+1] = transport.DialStream(ctx, servers[(r+1)%ranks].Addr(), h, rings[r].Next.Peer(), transport.Options{StreamsOverTCP: o.overTCP})
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			close()
			return nil, nil, err
		}
	}
	return rings, close, nil
}

// Trial all-reduces one plan over rings again and again, every rank at
// once, as a stage's replicas do step after step, to time it. Each rank
// alternates two buffers (AllReduce's contract), allocated once: fresh
// memory per all-reduce would add its page faults to the time.
type Trial struct {
	rings []*Ring
	plan  Plan
	bufs  [][2][]float32
	step  int64
}

// NewTrial readies all-reduces of p over rings.
func NewTrial(rings []*Ring, p Plan) *Trial {
	t := &Trial{rings: rings, plan: p, bufs: make([][2][]float32, len(rings))}
	for r := range t.bufs {
		t.bufs[r] = [2][]float32{make([]float32, p.N), make([]float32, p.N)}
	}
	return t
}

// Run all-reduces n times and returns the wall time of one.
func (t *Trial) Run(ctx context.Context, n int) (time.Duration, error) {
	return t.time(n, func(r int, step int64) error {
		return AllReduce(ctx, t.rings[r], step, 0, t.plan, t.bufs[r][step%2])
	})
}

// RunLinksOnly moves an all-reduce's messages n times, the same sizes in
// the same order, without the additions and without waiting for a chunk's
// sum before sending it on, and returns the wall time of one: what the
// links alone cost, the ceiling of a ring over them.
func (t *Trial) RunLinksOnly(ctx context.Context, n int) (time.Duration, error) {
	return t.time(n, func(r int, step int64) error {
		return moveOnly(ctx, t.rings[r], step, t.plan, t.bufs[r][step%2])
	})
}

// time runs one(rank, step) n times on every rank at once.
func (t *Trial) time(n int, one func(r int, step int64) error) (time.Duration, error) {
	errs := make([]error, len(t.rings))
	t0 := time.Now()
	var wg sync.WaitGroup
	for r := range t.rings {
		wg.Go(func() {
			for i := range n {
				if errs[r] = one(r, t.step+int64(i)); errs[r] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	t.step += int64(n)
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return time.Since(t0) / time.Duration(max(n, 1)), nil
}

// Figures are a ring's two costs as the simulator charges an all-reduce of
// S bytes in b buckets among R ranks: 2(R-1)/R · S / BytesPerSecond +
// 2(R-1) · b · Latency.
type Figures struct {
	BytesPerSecond float64
	Latency        time.Duration
}

// MeasureLoopback fits Figures to all-reduces among ranks ranks over
// Loopback links, in buckets of bucketBytes (as the config cuts a stage's
// gradients), timed at two sizes: one small bucket, whose time is mostly
// the messages' cost, and a vector of several buckets, mostly bandwidth.
// Each size is timed in reps batches (the median is used) after a warm-up.
// The ranks share this machine's cores, as replicas on one host do. With
// streams the all-reduces travel on ring streams (Loopback).
func MeasureLoopback(ctx context.Context, ranks, bucketBytes, reps int, streams bool) (Figures, error) {
	if ranks < 2 {
		return Figures{}, fmt.Errorf("collective: measuring a ring of %d ranks; it needs 2 or more", ranks)
	}
	if bucketBytes <= 0 {
		return Figures{}, fmt.Errorf("collective: measuring with buckets of %d bytes", bucketBytes)
	}
	small := min(bucketBytes, 256<<10)
	large := min(max(4<<20, 4*bucketBytes), 64<<20)
	var xs, ms, ts [2]float64 // per size: bus bytes 2(R-1)/R·S, messages, seconds
	for i, size := range []int{small, large} {
		p, err := NewPlan(max(size/4, ranks), max(bucketBytes/4, 1), ranks)
		if err != nil {
			return Figures{}, err
		}
		t, err := medianTime(ctx, ranks, p, reps, streams)
		if err != nil {
			return Figures{}, err
		}
		R := float64(ranks)
		xs[i] = 2 * (R - 1) / R * float64(4*p.N)
		ms[i] = 2 * (R - 1) * float64(len(p.Buckets))
		ts[i] = t.Seconds()
	}
	return fitFigures(xs, ms, ts), nil
}

// fitFigures solves t = x/bw + m·lat through both points; where noise
// makes either figure negative, the latency is taken as 0 and the
// bandwidth from the larger point alone, which then charges its messages'
// cost as bandwidth.
func fitFigures(xs, ms, ts [2]float64) Figures {
	det := xs[0]*ms[1] - xs[1]*ms[0]
	if det != 0 {
		inv := (ts[0]*ms[1] - ts[1]*ms[0]) / det // 1/bw
		lat := (xs[0]*ts[1] - xs[1]*ts[0]) / det
		if inv > 0 && lat >= 0 {
			return Figures{BytesPerSecond: 1 / inv, Latency: time.Duration(lat * 1e9)}
		}
	}
	return Figures{BytesPerSecond: xs[1] / ts[1]}
}

// medianTime times plan p among ranks fresh loopback ranks: the median
// over reps batches of all-reduces, each batch about batchTime long, after
// warming the links up (their pools and flow-control windows start cold).
func medianTime(ctx context.Context, ranks int, p Plan, reps int, streams bool) (time.Duration, error) {
	const warmUp, batchTime = 4, 25 * time.Millisecond
	rings, close, err := Loopback(ctx, ranks, p, streams)
	if err != nil {
		return 0, err
	}
	defer close()
	trial := NewTrial(rings, p)
	one, err := trial.Run(ctx, warmUp)
	if err != nil {
		return 0, err
	}
	n := int(max(1, batchTime/max(one, time.Microsecond)))
	times := make([]time.Duration, max(reps, 1))
	for i := range times {
		if times[i], err = trial.Run(ctx, n); err != nil {
			return 0, err
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}
