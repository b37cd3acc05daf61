package main

import (
	"bytes"
	"fmt"
	"os"
	"runtime"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/stages"
)

// runZero compares the replicas' optimizer state with and without
// all_reduce.shard_optimizer on one model laid out as 2 × 2 and 1 × 4: the
// bytes each replica's optimizers hold (their own report, and the heap a
// replica's optimizers take after a step, measured here), and the step
// rate of a launch of each, which pays for the updated weights' all-gather.
func runZero(o *options, b *bytes.Buffer) error {
	const base = "configs/bench-mlp-4stage.yaml"
	grids := []struct {
		label    string
		layers   []string
		replicas int
	}{
		{"2 × 2", []string{"0-3", "4-7"}, 2},
		{"1 × 4", []string{"0-7"}, 4},
	}
	fmt.Fprintf(b, "`%s` (Adam: two moments per weight) laid out as stages × replicas. The optimizer state is each process's largest stage's: the bytes its optimizers report (optim's StateBytes) and the growth of the Go heap when they are built and take a step, measured in this process; with `all_reduce.shard_optimizer` each replica keeps the moments of the elements its ring's reduce-scatter leaves it, 1/R of each bucket. ", base)
	fmt.Fprintf(b, "samples/s are of `pipetrain launch`, %d steps, one BLAS thread per process, the same run alternating sharded and unsharded; sharded, the gradients are reduce-scattered and the updated weights all-gathered (the same bytes as the all-reduce; no clipping or tied weights here), each replica does 1/R of the optimizer's work, and the all-gather runs after the optimizer step, where the unsharded all-reduce's second half overlapped the backward.\n\n", o.pipeSteps)
	fmt.Fprintf(b, "| grid | optimizer state per replica, unsharded | sharded | sharded / unsharded | heap, unsharded | heap, sharded | samples/s unsharded | samples/s sharded | sharded / unsharded |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range grids {
		rc := runConfig{base: base, steps: o.pipeSteps, layers: g.layers, replicas: g.replicas, micro: 4,
			env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
		cfg, err := gridConfig(rc)
		if err != nil {
			return err
		}
		whole, wholeHeap, err := replicaState(cfg, false)
		if err != nil {
			return fmt.Errorf("%s: %w", g.label, err)
		}
		shard, shardHeap, err := replicaState(cfg, true)
		if err != nil {
			return fmt.Errorf("%s: %w", g.label, err)
		}
		var plain, sharded []float64
		for rep := range o.runReps {
			for _, on := range []bool{false, true} {
				r := rc
				r.env = append(append([]string(nil), rc.env...), fmt.Sprintf("PIPETRAIN_ALL_REDUCE_SHARD_OPTIMIZER=%v", on))
				sps, _, err := gridRun(o, r, 0)
				if err != nil {
					return fmt.Errorf("%s (sharded %v): %w", g.label, on, err)
				}
				if on {
					sharded = append(sharded, sps)
				} else {
					plain = append(plain, sps)
				}
				logf("zero rep %d: %s sharded %v: %.0f samples/s", rep+1, g.label, on, sps)
			}
		}
		p, s := stats.Median(plain), stats.Median(sharded)
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %.0f | %.0f | %s |\n", g.label, mib(whole), mib(shard), pct(float64(shard)/float64(whole)),
			mib(wholeHeap), mib(shardHeap), p, s, ratio(s/p))
	}
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// gridConfig loads the config rc derives, as a launch of it would.
func gridConfig(rc runConfig) (*configs.Config, error) {
	dir, err := os.MkdirTemp("", "pipetrain-suite-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path, err := rc.write(dir)
	if err != nil {
		return nil, err
	}
	return configs.Load(path)
}

// replicaState builds replica 0's optimizers of every stage of cfg, sharded
// or not, takes a step with each and returns the largest stage's state:
// the bytes the optimizers report, and how much the heap grew.
func replicaState(cfg *configs.Config, sharded bool) (reported, heap int64, err error) {
	spec := cfg.Train.Optimizer
	for s := range cfg.Stages {
		l, err := stages.NewReplicaLayout(cfg, s, 0)
		if err != nil {
			return 0, 0, err
		}
		var params, grads []*tensor.Dense
		for _, p := range l.Plans {
			params = append(params, tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(p.N)))
			grads = append(grads, tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(p.N)))
		}
		before := heapAlloc()
		var opts []*optim.Optimizer
		var bytes int64
		for c, p := range l.Plans {
			opt, err := optim.New(spec, tensor.Float32, []tensor.Shape{{p.N}})
			if err != nil {
				return 0, 0, err
			}
			if sharded {
				if err := opt.Shard(collective.Owned(p, 0)); err != nil {
					return 0, 0, err
				}
			}
			if err := opt.Step(params[c:c+1], grads[c:c+1]); err != nil {
				return 0, 0, err
			}
			bytes += opt.StateBytes()
			opts = append(opts, opt)
		}
		grew := heapAlloc() - before
		runtime.KeepAlive(opts)
		runtime.KeepAlive(params) // live across both measurements: only the optimizers' growth counts
		runtime.KeepAlive(grads)
		reported, heap = max(reported, bytes), max(heap, grew)
	}
	return reported, heap, nil
}

func heapAlloc() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
