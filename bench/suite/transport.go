package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/transport"
)

// transportTarget is the target: gRPC tensor stream throughput over raw
// TCP loopback throughput for 4 MiB tensors.
const transportTarget = 0.80

// endpoint is one direction-agnostic way to move tensors of one shape between
// two ends in this process: a pipetrain link, or a bare TCP connection.
type endpoint interface {
	// sendDown sends one activation from the upstream end; recvDown receives it
	// at the downstream end. sendUp and recvUp are the gradient direction.
	sendDown() error
	recvDown() error
	sendUp() error
	recvUp() error
	close()
}

type streamRow struct {
	size            int
	grpcMB, tcpMB   []float64 // MB/s per repetition
	grpcMed, tcpMed float64   // their medians
	grpcAllocs      float64   // per message, both ends together
	grpcBytes       float64
	tcpAllocs       float64
	tcpBytes        float64
	unixMB          []float64 // the pipetrain link over a Unix socket
	unixMed         float64
}

type latencyRow struct {
	size                int
	grpcRTT, tcpRTT     []float64 // µs, every round trip of every repetition
	grpcMedian, grpcP99 float64
	tcpMedian, tcpP99   float64
	grpcAllocs          float64 // per round trip, both ends together
}

func runTransport(o *options, b *bytes.Buffer) error {
	perRep := int64(512 << 20) // bytes streamed per throughput repetition
	trips := 2000              // round trips per latency repetition
	if o.quick {
		perRep, trips = 128<<20, 500
	}
	var streams []*streamRow
	for _, size := range []int{4 << 20, 16 << 20} {
		r, err := measureStream(o, size, int(perRep/int64(size)))
		if err != nil {
			return fmt.Errorf("%s stream: %w", byteSize(float64(size)), err)
		}
		streams = append(streams, r)
		logf("transport %s: grpc %.0f MB/s, tcp %.0f MB/s (%.0f%%)", byteSize(float64(size)), r.grpcMed, r.tcpMed, 100*r.grpcMed/r.tcpMed)
	}
	var lats []*latencyRow
	for _, size := range []int{1 << 10, 64 << 10} {
		r, err := measureLatency(o, size, trips)
		if err != nil {
			return fmt.Errorf("%s ping-pong: %w", byteSize(float64(size)), err)
		}
		lats = append(lats, r)
		logf("transport %s round trip: grpc %.0f µs (p99 %.0f), tcp %.0f µs (p99 %.0f)", byteSize(float64(size)), r.grpcMedian, r.grpcP99, r.tcpMedian, r.tcpP99)
	}

	fmt.Fprintf(b, "Both ends in this process on 127.0.0.1. **pipetrain** is a real link: `transport.Listen` for stage 1, `transport.Dial` from stage 0 "+
		"with matching `transport.Hello`s, then `Send` of float32 activations on one end and `Recv` on the other (the gRPC stream and its raw codec, "+
		"with the link's send and receive queues). **raw TCP** is the floor under it: a plain `net.Conn`, each message an 8-byte length then the payload, "+
		"the reader filling one reused buffer with `io.ReadFull`. The last columns run the same pipetrain link over a Unix socket (`address: unix:PATH`, for stages on one host).\n\n")
	fmt.Fprintf(b, "### Stream throughput, stage to stage\n\n")
	fmt.Fprintf(b, "One way, %s per repetition, median of %d repetitions; MB/s is 10⁶ bytes of tensor payload per second. Allocations are per message, "+
		"sender and receiver together (`runtime.MemStats`).\n\n", byteSize(float64(perRep)), o.reps)
	fmt.Fprintf(b, "| tensor | pipetrain link | raw TCP | link / TCP | target | met? | link allocs/msg (bytes) | TCP allocs/msg (bytes) | link over a Unix socket | Unix link / TCP |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range streams {
		ratio := r.grpcMed / r.tcpMed
		target, met := "", ""
		if r.size == 4<<20 {
			target, met = "≥ "+pct(transportTarget), yesNo(ratio >= transportTarget)
		}
		fmt.Fprintf(b, "| %s | %.0f MB/s (±%.0f%%) | %.0f MB/s (±%.0f%%) | %s | %s | %s | %.1f (%s) | %.1f (%s) | %.0f MB/s (±%.0f%%) | %s |\n",
			byteSize(float64(r.size)), r.grpcMed, 50*spread(r.grpcMB), r.tcpMed, 50*spread(r.tcpMB), pct(ratio), target, met,
			r.grpcAllocs, byteSize(r.grpcBytes), r.tcpAllocs, byteSize(r.tcpBytes), r.unixMed, 50*spread(r.unixMB), pct(r.unixMed/r.tcpMed))
	}
	fmt.Fprintf(b, "\n### Round-trip latency, small tensors\n\n")
	fmt.Fprintf(b, "Ping-pong: stage 0 sends an activation, stage 1 answers with a gradient of the same size, stage 0 waits for it; %d round trips per repetition, "+
		"%d repetitions, median and 99th percentile over all of them.\n\n", trips, o.reps)
	fmt.Fprintf(b, "| tensor | pipetrain median | pipetrain p99 | raw TCP median | raw TCP p99 | link − TCP (median) | link allocs/round trip |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|\n")
	for _, r := range lats {
		fmt.Fprintf(b, "| %s | %.0f µs | %.0f µs | %.0f µs | %.0f µs | %+.0f µs | %.0f |\n",
			byteSize(float64(r.size)), r.grpcMedian, r.grpcP99, r.tcpMedian, r.tcpP99, r.grpcMedian-r.tcpMedian, r.grpcAllocs)
	}

	r4 := streams[0]
	ratio := r4.grpcMed / r4.tcpMed
	targets = append(targets, targetResult{"gRPC tensor stream / raw TCP loopback, 4 MiB tensors", "≥ " + pct(transportTarget),
		fmt.Sprintf("%s (%.0f / %.0f MB/s)", pct(ratio), r4.grpcMed, r4.tcpMed), ratio >= transportTarget})
	fmt.Fprintf(b, "\nA 4 MiB activation moves at %s of raw TCP's loopback throughput (target %s: %s)",
		pct(ratio), pct(transportTarget), map[bool]string{true: "met", false: "missed"}[ratio >= transportTarget])
	if len(streams) > 1 {
		s1 := streams[1]
		fmt.Fprintf(b, ", a 16 MiB one at %s", pct(s1.grpcMed/s1.tcpMed))
		if t4 := streams[0].tcpMed; s1.tcpMed < 0.85*t4 {
			fmt.Fprintf(b, " (raw TCP itself is slower with 16 MiB messages, %.0f against %.0f MB/s, so part of the higher ratio there is a slower baseline)", s1.tcpMed, t4)
		}
	}
	fmt.Fprintf(b, ". ")
	perMsg := 1e6 / r4.grpcMed * float64(r4.size) / 1e6 // µs per 4 MiB message over the link
	fmt.Fprintf(b, "At that rate a 4 MiB message takes %.1f ms, ", perMsg/1e3)
	fmt.Fprintf(b, "and the link allocates %s per message against the %s of payload: ", byteSize(r4.grpcBytes), byteSize(float64(r4.size)))
	if r4.grpcBytes < 0.25*float64(r4.size) {
		fmt.Fprintf(b, "well under one payload, because the benchmark releases each tensor once it has checked it (`Tensor.Release`, as a stage does after a micro-batch's backward) and the next message is received into the same memory; what is left is gRPC's bookkeeping per 16 KiB frame. ")
	} else if r4.grpcBytes < 1.5*float64(r4.size) {
		fmt.Fprintf(b, "about one buffer, the fresh tensor `Recv` hands its caller (who owns it), so no copy beyond that is made on the way. ")
	} else {
		fmt.Fprintf(b, "%.1f payloads' worth, so the path copies the data more than the one fresh buffer `Recv` must hand its caller. ", r4.grpcBytes/float64(r4.size))
	}
	if len(streams) > 1 {
		s1 := streams[1]
		fmt.Fprintf(b, "Allocations per message grow with its size (%.0f at %s, %.0f at %s), so the receive path allocates per piece of a message, not once per message. ",
			r4.grpcAllocs, byteSize(float64(r4.size)), s1.grpcAllocs, byteSize(float64(s1.size)))
	}
	l0 := lats[0]
	fmt.Fprintf(b, "For small tensors the link adds %.0f µs to a %.0f µs TCP round trip (%s), gRPC's framing, the stream's flow control and the hand-offs through the link's queues and goroutines; ",
		l0.grpcMedian-l0.tcpMedian, l0.tcpMedian, byteSize(float64(l0.size)))
	fmt.Fprintf(b, "against a stage step of milliseconds that is small, but it is paid on every message of every micro-batch.\n")
	return nil
}

// linkPair is a connected pipetrain link: up (stage 0, dialer) and down (stage 1).
type linkPair struct {
	srv      *transport.Server
	up, down transport.Link
	act, grd *transport.Tensor
}

func newLinkPair(size int) (*linkPair, error) { return newLinkPairAt(size, "127.0.0.1:0") }

// newLinkPairAt is newLinkPair listening on addr (a Unix socket: "unix:PATH").
func newLinkPairAt(size int, addr string) (*linkPair, error) {
	shape := []int{size / 4}
	up := transport.Hello{Stage: 0, Stages: 2, ConfigDigest: "bench-suite", DType: transport.Float32, Shapes: [][]int{shape}}
	down := up
	down.Stage = 1
	srv, err := transport.Listen(addr, down, transport.Options{})
	if err != nil {
		return nil, err
	}
	up.Address = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		l   transport.Link
		err error
	}
	acc := make(chan res, 1)
	go func() { l, err := srv.Accept(ctx); acc <- res{l, err} }()
	ul, err := transport.Dial(ctx, srv.Addr(), up, transport.Options{})
	if err != nil {
		srv.Close()
		return nil, err
	}
	a := <-acc
	if a.err != nil {
		ul.Close()
		srv.Close()
		return nil, a.err
	}
	p := &linkPair{srv: srv, up: ul, down: a.l}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 31)
	}
	// Never modified, so they may be sent again and again.
	p.act = &transport.Tensor{Kind: transport.Activation, DType: transport.Float32, Shape: shape, Data: payload}
	p.grd = &transport.Tensor{Kind: transport.Gradient, DType: transport.Float32, Shape: shape, Data: payload}
	return p, nil
}

func (p *linkPair) sendDown() error { return p.up.Send(context.Background(), p.act) }
func (p *linkPair) sendUp() error   { return p.down.Send(context.Background(), p.grd) }
func (p *linkPair) recvDown() error { return recvCheck(p.down, len(p.act.Data)) }
func (p *linkPair) recvUp() error   { return recvCheck(p.up, len(p.grd.Data)) }

func recvCheck(l transport.Link, size int) error {
	t, err := l.Recv(context.Background())
	if err != nil {
		return err
	}
	defer t.Release() // done with it, as a stage is after its backward
	if len(t.Data) != size {
		return fmt.Errorf("received %d bytes, want %d", len(t.Data), size)
	}
	return nil
}

func (p *linkPair) close() {
	p.up.Close()
	p.down.Close()
	p.srv.Close()
}

// tcpPair is a bare TCP connection carrying length-prefixed messages both ways.
type tcpPair struct {
	up, down         net.Conn
	payload, rbufUp  []byte
	rbufDown, header []byte
	hUp, hDown       []byte
}

func newTCPPair(size int) (*tcpPair, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		acc <- c
	}()
	up, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	down := <-acc
	if down == nil {
		up.Close()
		return nil, errors.New("accept failed")
	}
	p := &tcpPair{up: up, down: down, payload: make([]byte, size), rbufUp: make([]byte, size), rbufDown: make([]byte, size),
		header: make([]byte, 8), hUp: make([]byte, 8), hDown: make([]byte, 8)}
	for i := range p.payload {
		p.payload[i] = byte(i * 31)
	}
	binary.LittleEndian.PutUint64(p.header, uint64(size))
	return p, nil
}

// send writes header and payload with one writev.
func (p *tcpPair) send(c net.Conn) error {
	bufs := net.Buffers{p.header, p.payload}
	_, err := bufs.WriteTo(c)
	return err
}

func (p *tcpPair) recv(c net.Conn, h, buf []byte) error {
	if _, err := io.ReadFull(c, h); err != nil {
		return err
	}
	if n := binary.LittleEndian.Uint64(h); n != uint64(len(buf)) {
		return fmt.Errorf("length prefix %d, want %d", n, len(buf))
	}
	_, err := io.ReadFull(c, buf)
	return err
}

func (p *tcpPair) sendDown() error { return p.send(p.up) }
func (p *tcpPair) sendUp() error   { return p.send(p.down) }
func (p *tcpPair) recvDown() error { return p.recv(p.down, p.hDown, p.rbufDown) }
func (p *tcpPair) recvUp() error   { return p.recv(p.up, p.hUp, p.rbufUp) }
func (p *tcpPair) close()          { p.up.Close(); p.down.Close() }

// streamOnce sends n messages down and returns payload MB/s, timed at the
// receiver from the start of sending to the last message received, with the
// allocations per message of both ends.
func streamOnce(e endpoint, n, size int) (mbps, allocs, bytes float64, err error) {
	errc := make(chan error, 1)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	go func() {
		for range n {
			if err := e.sendDown(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range n {
		if err := e.recvDown(); err != nil {
			return 0, 0, 0, err
		}
	}
	el := time.Since(t0)
	if err := <-errc; err != nil {
		return 0, 0, 0, err
	}
	runtime.ReadMemStats(&after)
	return float64(n*size) / el.Seconds() / 1e6, float64(after.Mallocs-before.Mallocs) / float64(n), float64(after.TotalAlloc-before.TotalAlloc) / float64(n), nil
}

func measureStream(o *options, size, n int) (*streamRow, error) {
	lp, err := newLinkPair(size)
	if err != nil {
		return nil, err
	}
	defer lp.close()
	tp, err := newTCPPair(size)
	if err != nil {
		return nil, err
	}
	defer tp.close()
	sockDir, err := os.MkdirTemp("", "pipetrain-suite-sock-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)
	up, err := newLinkPairAt(size, "unix:"+filepath.Join(sockDir, "link.sock"))
	if err != nil {
		return nil, err
	}
	defer up.close()
	r := &streamRow{size: size}
	// Warm up all: connection windows, buffers, the allocator.
	for _, e := range []endpoint{lp, tp, up} {
		if _, _, _, err := streamOnce(e, max(4, n/4), size); err != nil {
			return nil, err
		}
	}
	var ga, gb, ta, tb []float64
	for range o.reps {
		runtime.GC()
		mb, a, by, err := streamOnce(lp, n, size)
		if err != nil {
			return nil, fmt.Errorf("link: %w", err)
		}
		r.grpcMB, ga, gb = append(r.grpcMB, mb), append(ga, a), append(gb, by)
		runtime.GC()
		mb, a, by, err = streamOnce(tp, n, size)
		if err != nil {
			return nil, fmt.Errorf("tcp: %w", err)
		}
		r.tcpMB, ta, tb = append(r.tcpMB, mb), append(ta, a), append(tb, by)
		runtime.GC()
		if mb, _, _, err = streamOnce(up, n, size); err != nil {
			return nil, fmt.Errorf("unix socket link: %w", err)
		}
		r.unixMB = append(r.unixMB, mb)
	}
	r.unixMed = stats.Median(r.unixMB)
	r.grpcMed, r.tcpMed = stats.Median(r.grpcMB), stats.Median(r.tcpMB)
	r.grpcAllocs, r.grpcBytes, r.tcpAllocs, r.tcpBytes = stats.Median(ga), stats.Median(gb), stats.Median(ta), stats.Median(tb)
	return r, nil
}

// pingPong runs n round trips (activation down, gradient up) and returns each
// round trip in µs, with allocations per round trip.
func pingPong(e endpoint, n int) (rtt []float64, allocs float64, err error) {
	errc := make(chan error, 1)
	go func() { // stage 1: answer each activation with a gradient
		for range n {
			if err := e.recvDown(); err != nil {
				errc <- err
				return
			}
			if err := e.sendUp(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	rtt = make([]float64, 0, n)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		t0 := time.Now()
		if err := e.sendDown(); err != nil {
			return nil, 0, err
		}
		if err := e.recvUp(); err != nil {
			return nil, 0, err
		}
		rtt = append(rtt, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	runtime.ReadMemStats(&after)
	if err := <-errc; err != nil {
		return nil, 0, err
	}
	return rtt, float64(after.Mallocs-before.Mallocs) / float64(n), nil
}

func measureLatency(o *options, size, trips int) (*latencyRow, error) {
	lp, err := newLinkPair(size)
	if err != nil {
		return nil, err
	}
	defer lp.close()
	tp, err := newTCPPair(size)
	if err != nil {
		return nil, err
	}
	defer tp.close()
	r := &latencyRow{size: size}
	for _, e := range []endpoint{lp, tp} {
		if _, _, err := pingPong(e, 100); err != nil {
			return nil, err
		}
	}
	var ga []float64
	for range o.reps {
		rtt, a, err := pingPong(lp, trips)
		if err != nil {
			return nil, fmt.Errorf("link: %w", err)
		}
		r.grpcRTT, ga = append(r.grpcRTT, rtt...), append(ga, a)
		if rtt, _, err = pingPong(tp, trips); err != nil {
			return nil, fmt.Errorf("tcp: %w", err)
		}
		r.tcpRTT = append(r.tcpRTT, rtt...)
	}
	r.grpcMedian, r.grpcP99 = stats.Median(r.grpcRTT), quantile(r.grpcRTT, 0.99)
	r.tcpMedian, r.tcpP99 = stats.Median(r.tcpRTT), quantile(r.tcpRTT, 0.99)
	r.grpcAllocs = stats.Median(ga)
	return r, nil
}
