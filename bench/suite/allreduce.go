package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
)

// allReduceTarget is the target: the ring all-reduce's bus bandwidth
// over raw TCP loopback throughput, measured in the same run.
const allReduceTarget = 0.70

// busMBs all-reduces n times and returns the bus bandwidth in MB/s
// (nccl-tests: 2(R-1)/R · S / t).
func busMBs(t *collective.Trial, ranks int, p collective.Plan, n int) (float64, error) {
	return busOf(t.Run, ranks, p, n)
}

// busOf times run(n) and returns the bus bandwidth its traffic gives.
func busOf(run func(context.Context, int) (time.Duration, error), ranks int, p collective.Plan, n int) (float64, error) {
	d, err := run(context.Background(), n)
	if err != nil {
		return 0, err
	}
	R := float64(ranks)
	return 2 * (R - 1) / R * float64(4*p.N) / d.Seconds() / 1e6, nil
}

func runAllReduce(o *options, b *bytes.Buffer) error {
	sizes := []int{1 << 20, 4 << 20, 16 << 20}
	perRep := int64(256 << 20)
	if o.quick {
		perRep = 64 << 20
	}
	fmt.Fprintf(b, "The ring all-reduce the replicas of a stage sum their gradients with (package collective), all ranks in this process on loopback, S bytes of float32 gradients cut into buckets of the default all_reduce.bucket_bytes (1 MiB), as a stage reduces them, ")
	fmt.Fprintf(b, "over each all_reduce.transport: ring streams (framed byte streams beside the replica-ring links, written from the gradient buffers and read into the reduction buffer; the default), on TCP as between hosts, and the gRPC replica-ring links themselves; and last the ring streams as the replicas of one host take them, on Unix stream sockets. ")
	fmt.Fprintf(b, "Bus bandwidth is nccl-tests' figure, 2(R−1)/R · S / t: what each rank's link carried per second. ")
	fmt.Fprintf(b, "The baseline is raw TCP moving the ring's own traffic: R connections in a ring, every rank writing S/R bytes to the next while reading as much from the previous, 2(R−1) times, with no framing, copies or additions, timed and reported as the ring is: what the machine allows for this pattern, its %d cores shared by the R ranks. ", runtime.NumCPU())
	fmt.Fprintf(b, "All are measured in alternating rounds in one run (raw TCP, gRPC, streams, the streams alone and the Unix-socket streams, each round starting with the next of them, %d rounds), so that other processes' load falls on each alike; each figure is the median of its rounds, ± half its spread ((max − min) / median), and each ratio the median of the rounds' own ratios, which pairs figures measured under the same load. ", o.reps)
	fmt.Fprintf(b, "A last figure splits the streams' cost in two: the same streams moving the same messages in the same order with no additions and no waiting for a sum before sending it on is the most a ring over them can carry.\n\n")
	loadStart := loadAvg()
	var rows bytes.Buffer
	fmt.Fprintf(&rows, "| size S | ranks R | raw TCP ring MB/s | ring over streams MB/s | streams / raw | ring over gRPC MB/s | gRPC / raw | streams / gRPC | streams alone MB/s | ring / streams alone | ring over Unix-socket streams MB/s | Unix streams / raw TCP |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var measured, measuredUnix []string
	met, metUnix := true, true
	busAt4MiB := map[int]float64{} // MB/s by ranks over streams, for the grids' predictions
	for _, size := range sizes {
		n := int(max(4, perRep/int64(size)))
		for _, R := range []int{2, 4} {
			reps := max(2, n/(2*R))
			r, err := compareRings(o, size, R, reps)
			if err != nil {
				return fmt.Errorf("%d MiB R=%d: %w", size>>20, R, err)
			}
			raw, str, grpc, alone := stats.Median(r.raw), stats.Median(r.streams), stats.Median(r.grpc), stats.Median(r.alone)
			if size == 4<<20 {
				busAt4MiB[R] = str
			}
			// Ratios are the medians of each round's own ratio: a round's
			// three figures were measured within a second of each other,
			// under the same load, which the medians of separate columns
			// would not pair.
			strRaw, grpcRaw, strGRPC := pairedRatio(r.streams, r.raw), pairedRatio(r.grpc, r.raw), pairedRatio(r.streams, r.grpc)
			unixRaw := pairedRatio(r.unix, r.raw)
			fmt.Fprintf(&rows, "| %d MiB | %d | %.0f ± %s | %.0f ± %s | %s | %.0f ± %s | %s | %s | %.0f | %s | %.0f ± %s | %s |\n", size>>20, R,
				raw, pct(spread(r.raw)/2), str, pct(spread(r.streams)/2), pct(strRaw), grpc, pct(spread(r.grpc)/2), pct(grpcRaw), ratio(strGRPC), alone, pct(pairedRatio(r.streams, r.alone)),
				stats.Median(r.unix), pct(spread(r.unix)/2), pct(unixRaw))
			logf("all-reduce %d MiB R=%d: raw TCP ring %.0f MB/s, streams %.0f (%s of raw), gRPC %.0f (%s of raw), streams alone %.0f, Unix-socket streams %.0f (%s of raw)",
				size>>20, R, raw, str, pct(strRaw), grpc, pct(grpcRaw), alone, stats.Median(r.unix), pct(unixRaw))
			if size <= 4<<20 {
				measured = append(measured, fmt.Sprintf("%d MiB R=%d %s", size>>20, R, pct(strRaw)))
				met = met && strRaw >= allReduceTarget
				measuredUnix = append(measuredUnix, fmt.Sprintf("%d MiB R=%d %s", size>>20, R, pct(unixRaw)))
				metUnix = metUnix && unixRaw >= allReduceTarget
			}
		}
	}
	b.Write(rows.Bytes())
	fmt.Fprintf(b, "\nLoad average (1 min) %.2f when these rounds began and %.2f when they ended, this benchmark's own threads included.\n", loadStart, loadAvg())
	targets = append(targets, targetResult{"all-reduce bus bandwidth over ring streams on TCP (as between hosts) / raw TCP moving the same ring traffic, 1 and 4 MiB", "≥ " + pct(allReduceTarget), strings.Join(measured, ", "), met},
		targetResult{"the same over ring streams on Unix sockets (replicas of one host, as launch connects them) / raw TCP, 1 and 4 MiB", "≥ " + pct(allReduceTarget), strings.Join(measuredUnix, ", "), metUnix})
	return runGrids(o, b, busAt4MiB)
}

// pairedRatio is the median over rounds of a[i] / b[i].
func pairedRatio(a, b []float64) float64 {
	r := make([]float64, min(len(a), len(b)))
	for i := range r {
		r[i] = a[i] / b[i]
	}
	return stats.Median(r)
}

// ringRounds are one size and rank count's bus bandwidths in MB/s, round
// by round: the raw TCP ring, the ring over gRPC links, over ring streams,
// and the streams moving the ring's messages alone.
type ringRounds struct{ raw, grpc, streams, alone, unix []float64 }

// compareRings times the raw TCP ring and the ring over each transport in
// alternating rounds of reps all-reduces of size bytes among R ranks.
func compareRings(o *options, size, R, reps int) (ringRounds, error) {
	var out ringRounds
	p, err := collective.NewPlan(size/4, configs.DefaultBucketBytes/4, R)
	if err != nil {
		return out, err
	}
	tr, err := newTCPRing(R)
	if err != nil {
		return out, err
	}
	defer tr.close()
	var trials [3]*collective.Trial // gRPC, streams on TCP, streams on Unix sockets
	for i := range trials {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		join := func() ([]*collective.Ring, func(), error) { return collective.Loopback(ctx, R, p, false) }
		switch i {
		case 1:
			// On TCP, as between hosts, and as the raw baseline moves its
			// bytes.
			join = func() ([]*collective.Ring, func(), error) { return collective.LoopbackOverTCP(ctx, R, p) }
		case 2:
			// As the replicas of one host take them: on Unix stream sockets.
			join = func() ([]*collective.Ring, func(), error) { return collective.Loopback(ctx, R, p, true) }
		}
		rings, cleanup, err := join()
		cancel()
		if err != nil {
			return out, err
		}
		defer cleanup()
		trials[i] = collective.NewTrial(rings, p)
	}
	warm := max(1, reps/4)
	if _, err := tr.allReduceOnce(size, warm); err != nil {
		return out, err
	}
	for _, t := range trials {
		if _, err := busMBs(t, R, p, warm); err != nil {
			return out, err
		}
	}
	arms := []struct {
		dst *[]float64
		run func() (float64, error)
	}{
		{&out.raw, func() (float64, error) { return tr.allReduceOnce(size, reps) }},
		{&out.grpc, func() (float64, error) { return busMBs(trials[0], R, p, reps) }},
		{&out.streams, func() (float64, error) { return busMBs(trials[1], R, p, reps) }},
		{&out.alone, func() (float64, error) { return busOf(trials[1].RunLinksOnly, R, p, reps) }},
		{&out.unix, func() (float64, error) { return busMBs(trials[2], R, p, reps) }},
	}
	// Each round starts with the next arm, so none always runs first
	// (after a GC, or as other processes wake).
	for k := range o.reps {
		for i := range arms {
			a := arms[(i+k)%len(arms)]
			runtime.GC()
			mb, err := a.run()
			if err != nil {
				return out, err
			}
			*a.dst = append(*a.dst, mb)
		}
	}
	return out, nil
}

// runGrids trains one model on the same number of processes laid out as
// stages × replicas three ways, each with its global batch unchanged.
func runGrids(o *options, b *bytes.Buffer, bus map[int]float64) error {
	const base = "configs/bench-mlp-4stage.yaml"
	grids := []struct {
		label    string
		layers   []string
		replicas int
	}{
		{"4 × 1 (pipeline only)", nil, 1},
		{"2 × 2", []string{"0-3", "4-7"}, 2},
		{"1 × 4 (data parallel only)", []string{"0-7"}, 4},
	}
	steps := o.pipeSteps
	type result struct{ sps, predicted []float64 }
	res := make([]result, len(grids))
	for rep := range o.runReps {
		for i, g := range grids {
			rc := runConfig{base: base, steps: steps, layers: g.layers, replicas: g.replicas, micro: 4,
				env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
			sps, pred, err := gridRun(o, rc, bus[g.replicas])
			if err != nil {
				return fmt.Errorf("%s: %w", g.label, err)
			}
			res[i].sps, res[i].predicted = append(res[i].sps, sps), append(res[i].predicted, pred)
			logf("grids rep %d: %s: %.0f samples/s, simulated %.0f", rep+1, g.label, sps, pred)
		}
	}
	fmt.Fprintf(b, "\n### Stages × replicas on four processes\n\n")
	fmt.Fprintf(b, "`%s` (an 8-layer MLP, batch 512, 1F1B with 4 micro-batches per replica, Adam, one BLAS thread per process) on four processes, %d steps, laid out three ways; ", base, steps)
	fmt.Fprintf(b, "every replica takes batch_size / R examples a step. On this %d-core machine the four processes share the cores, so the ratios say what the layout costs in work and traffic, not what four dedicated cores would give. ", runtime.NumCPU())
	fmt.Fprintf(b, "The prediction is `pipetrain simulate --costs RUN_DIR` on the run's own action costs (measured while the processes shared the cores), with the all-reduce charged at the bus bandwidth measured above for 4 MiB and R replicas.\n\n")
	fmt.Fprintf(b, "| grid (stages × replicas) | samples/s | against 4 × 1 | simulated samples/s | measured / simulated |\n|---|---|---|---|---|\n")
	first := stats.Median(res[0].sps)
	for i, g := range grids {
		med, pred := stats.Median(res[i].sps), stats.Median(res[i].predicted)
		fmt.Fprintf(b, "| %s | %.0f | %s | %.0f | %s |\n", g.label, med, ratio(med/first), pred, pct(med/pred))
	}
	return nil
}

func ratio(x float64) string { return fmt.Sprintf("%.2f×", x) }

// tcpRing is the raw-TCP baseline for the ring: R ranks in this process,
// rank r writing to rank r+1 over one loopback connection and reading from
// rank r-1, in the all-reduce's pattern (2(R-1) turns of S/R bytes each,
// every rank sending and receiving at once), with no framing, copying or
// arithmetic beyond the kernel's.
type tcpRing struct {
	next, prev []net.Conn
}

func newTCPRing(ranks int) (*tcpRing, error) {
	t := &tcpRing{next: make([]net.Conn, ranks), prev: make([]net.Conn, ranks)}
	for r := range ranks {
		p, err := newTCPPair(8)
		if err != nil {
			t.close()
			return nil, err
		}
		t.next[r], t.prev[(r+1)%ranks] = p.up, p.down
	}
	return t, nil
}

func (t *tcpRing) close() {
	for _, c := range append(t.next, t.prev...) {
		if c != nil {
			c.Close()
		}
	}
}

// allReduceOnce moves the ring's bytes n times and returns the bus
// bandwidth it reached in MB/s, as the ring's figure is computed.
func (t *tcpRing) allReduceOnce(size, n int) (float64, error) {
	R := len(t.next)
	chunk := size / R
	t0 := time.Now()
	errs := make([]error, 2*R)
	var wg sync.WaitGroup
	for r := range R {
		out, in := make([]byte, chunk), make([]byte, chunk)
		wg.Go(func() {
			for range n * 2 * (R - 1) {
				if _, errs[2*r] = t.next[r].Write(out); errs[2*r] != nil {
					return
				}
			}
		})
		wg.Go(func() {
			for range n * 2 * (R - 1) {
				if _, errs[2*r+1] = io.ReadFull(t.prev[r], in); errs[2*r+1] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	per := time.Since(t0).Seconds() / float64(n)
	return 2 * float64(R-1) / float64(R) * float64(size) / per / 1e6, nil
}

var (
	simulatedStep     = regexp.MustCompile(`(?m)^  \d+ stages? × \d+ replicas: step ([0-9.]+) ms`)
	simulatedMakespan = regexp.MustCompile(`(?m)^1f1b: makespan ([0-9.]+) ms`)
)

// gridRun launches rc and returns its samples/s and the simulator's
// prediction for it from the run's own costs, the ring charged at busMBs.
func gridRun(o *options, rc runConfig, busMBs float64) (sps, predicted float64, err error) {
	dir, cfgPath, err := pipetrain(o, "launch", rc)
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return 0, 0, err
	}
	runDir := filepath.Join(dir, "run")
	ms, _, err := stepTimes(runDir, cfg.Data.BatchSize, o.skip)
	if err != nil {
		return 0, 0, err
	}
	sps = float64(cfg.Data.BatchSize) / stats.Median(ms) * 1e3
	args := []string{"simulate", "--config", cfgPath, "--costs", runDir, "--schedule", "1f1b"}
	if busMBs > 0 {
		args = append(args, "--allreduce-bandwidth", fmt.Sprintf("%.0fMB/s", busMBs))
	}
	cmd := exec.Command(o.bin, args...)
	cmd.Env = append(os.Environ(), runEnv(rc)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("simulate: %v\n%s", err, tail(out, 2000))
	}
	m := simulatedStep.FindSubmatch(out)
	if m == nil {
		m = simulatedMakespan.FindSubmatch(out)
	}
	if m == nil {
		return 0, 0, fmt.Errorf("simulate printed no step time:\n%s", tail(out, 2000))
	}
	step, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil || step <= 0 {
		return 0, 0, fmt.Errorf("simulate's step time %q", m[1])
	}
	return sps, float64(cfg.Data.BatchSize) / step * 1e3, nil
}
