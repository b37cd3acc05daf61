package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/transport"
)

// allReduceTarget is the target: the ring all-reduce's bus bandwidth
// over raw TCP loopback throughput, measured in the same run.
const allReduceTarget = 0.70

// ringOfLinks joins ranks ranks in this process by gRPC replica-ring links
// over loopback, as the replicas of one stage are joined, with the plan's
// tags in the handshake.
func ringOfLinks(ranks int, p collective.Plan) ([]*collective.Ring, func(), error) {
	hello := func(r int) transport.Hello {
		return transport.Hello{Group: transport.ReplicaGroup, Stage: 0, Stages: 1, Replica: r, Replicas: ranks,
			ConfigDigest: "bench-suite", DType: transport.Float32, Shapes: p.Shapes()}
	}
	rings := make([]*collective.Ring, ranks)
	servers := make([]*transport.Server, ranks)
	var links []transport.Link
	cleanup := func() {
		for _, l := range links {
			l.Close()
		}
		for _, s := range servers {
			if s != nil {
				s.Close()
			}
		}
	}
	for r := range ranks {
		s, err := transport.Listen("127.0.0.1:0", hello(r), transport.Options{})
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		servers[r] = s
		rings[r] = &collective.Ring{Rank: r, Size: ranks, DType: transport.Float32}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, 2*ranks)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			l, err := servers[r].AcceptGroup(ctx, transport.ReplicaGroup)
			errs[2*r] = err
			mu.Lock()
			rings[r].Prev = l
			if l != nil {
				links = append(links, l)
			}
			mu.Unlock()
		})
		wg.Go(func() {
			h := hello(r)
			h.Address = servers[r].Addr()
			l, err := transport.Dial(ctx, servers[(r+1)%ranks].Addr(), h, transport.Options{})
			errs[2*r+1] = err
			mu.Lock()
			rings[r].Next = l
			if l != nil {
				links = append(links, l)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	return rings, cleanup, nil
}

// allReduceOnce all-reduces size bytes n times on every rank at once and
// returns the bus bandwidth in MB/s (nccl-tests: 2(R-1)/R · S / t).
func allReduceOnce(rings []*collective.Ring, p collective.Plan, bufs [][]float32, n int, step *int64) (float64, error) {
	R := len(rings)
	t0 := time.Now()
	errs := make([]error, R)
	var wg sync.WaitGroup
	for r := range rings {
		wg.Go(func() {
			for i := range n {
				if errs[r] = collective.AllReduce(context.Background(), rings[r], *step+int64(i), 0, p, bufs[r]); errs[r] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	*step += int64(n)
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	size := float64(4 * p.N)
	t := time.Since(t0).Seconds() / float64(n)
	return 2 * float64(R-1) / float64(R) * size / t / 1e6, nil
}

func runAllReduce(o *options, b *bytes.Buffer) error {
	sizes := []int{1 << 20, 4 << 20, 16 << 20}
	perRep := int64(256 << 20)
	if o.quick {
		perRep = 64 << 20
	}
	fmt.Fprintf(b, "The ring all-reduce the replicas of a stage sum their gradients with (package collective), over pipetrain's gRPC replica-ring links on loopback, ")
	fmt.Fprintf(b, "all ranks in this process, one bucket per all-reduce (all_reduce.bucket_bytes at least the size). ")
	fmt.Fprintf(b, "Bus bandwidth is nccl-tests' figure, 2(R−1)/R · S / t: what each rank's link carried per second. ")
	fmt.Fprintf(b, "The baseline is raw TCP loopback throughput for messages of the same size, measured in the same run (as in Transport). ")
	fmt.Fprintf(b, "On %d cores, R ranks share the CPUs with the links' goroutines, so more ranks than cores measure the machine's limit, not the ring's.\n\n", runtime.NumCPU())
	fmt.Fprintf(b, "| size S | ranks R | bus bandwidth MB/s | raw TCP MB/s | ratio |\n|---|---|---|---|---|\n")
	var measured []string
	met := true
	for _, size := range sizes {
		tp, err := newTCPPair(size)
		if err != nil {
			return err
		}
		n := int(max(4, perRep/int64(size)))
		if _, _, _, err := streamOnce(tp, max(2, n/4), size); err != nil {
			tp.close()
			return err
		}
		var tcp []float64
		for range o.reps {
			runtime.GC()
			mb, _, _, err := streamOnce(tp, n, size)
			if err != nil {
				tp.close()
				return err
			}
			tcp = append(tcp, mb)
		}
		tp.close()
		tcpMed := stats.Median(tcp)
		for _, R := range []int{2, 4} {
			p, err := collective.NewPlan(size/4, 0, R)
			if err != nil {
				return err
			}
			rings, cleanup, err := ringOfLinks(R, p)
			if err != nil {
				return err
			}
			bufs := make([][]float32, R)
			for r := range bufs {
				bufs[r] = make([]float32, p.N)
				for i := range bufs[r] {
					bufs[r][i] = float32(i%97) * 1e-3
				}
			}
			var step int64
			reps := max(2, n/(2*R))
			if _, err := allReduceOnce(rings, p, bufs, max(1, reps/4), &step); err != nil {
				cleanup()
				return err
			}
			var bus []float64
			for range o.reps {
				runtime.GC()
				mb, err := allReduceOnce(rings, p, bufs, reps, &step)
				if err != nil {
					cleanup()
					return err
				}
				bus = append(bus, mb)
			}
			cleanup()
			med := stats.Median(bus)
			ratio := med / tcpMed
			fmt.Fprintf(b, "| %d MiB | %d | %.0f | %.0f | %s |\n", size>>20, R, med, tcpMed, pct(ratio))
			logf("all-reduce %d MiB R=%d: bus %.0f MB/s, raw TCP %.0f MB/s (%s)", size>>20, R, med, tcpMed, pct(ratio))
			if R == 2 {
				measured = append(measured, fmt.Sprintf("%d MiB %s", size>>20, pct(ratio)))
				met = met && ratio >= allReduceTarget
			}
		}
	}
	targets = append(targets, targetResult{"all-reduce bus bandwidth / raw TCP, R = 2, 1-16 MiB", "≥ " + pct(allReduceTarget), strings.Join(measured, ", "), met})
	return runGrids(o, b)
}

// runGrids trains one model on the same number of processes laid out as
// stages × replicas three ways, each with its global batch unchanged.
func runGrids(o *options, b *bytes.Buffer) error {
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
	type result struct{ sps []float64 }
	res := make([]result, len(grids))
	for rep := range o.runReps {
		for i, g := range grids {
			rc := runConfig{base: base, steps: steps, layers: g.layers, replicas: g.replicas, micro: 4,
				env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
			sps, _, err := samplesPerSec(o, "launch", rc)
			if err != nil {
				return fmt.Errorf("%s: %w", g.label, err)
			}
			res[i].sps = append(res[i].sps, sps)
			logf("grids rep %d: %s: %.0f samples/s", rep+1, g.label, sps)
		}
	}
	fmt.Fprintf(b, "\n### Stages × replicas on four processes\n\n")
	fmt.Fprintf(b, "`%s` (an 8-layer MLP, batch 512, 1F1B with 4 micro-batches per replica, Adam, one BLAS thread per process) on four processes, %d steps, laid out three ways; ", base, steps)
	fmt.Fprintf(b, "every replica takes batch_size / R examples a step. On this %d-core machine the four processes share the cores, so the ratios say what the layout costs in work and traffic, not what four dedicated cores would give.\n\n", runtime.NumCPU())
	fmt.Fprintf(b, "| grid (stages × replicas) | samples/s | against 4 × 1 |\n|---|---|---|\n")
	first := stats.Median(res[0].sps)
	for i, g := range grids {
		med := stats.Median(res[i].sps)
		fmt.Fprintf(b, "| %s | %.0f | %s |\n", g.label, med, ratio(med/first))
	}
	return nil
}

func ratio(x float64) string { return fmt.Sprintf("%.2f×", x) }
