package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/affinity"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/ps"
)

// ProcessOptions say which stage process RunProcess runs. Config, Stage and
// Replica are required; the zero value of every other field is its default.
type ProcessOptions struct {
	Config         *configs.Config
	Stage, Replica int
	// RunDir is where the stage writes its logs, weights and checkpoints.
	RunDir string
	// Resume continues from the newest complete checkpoint in RunDir.
	Resume bool
	// Pause carries the launcher's requests to pause or stop at a step; nil:
	// only ctx stops the stage. Make it before the process starts its slow
	// work, so that a request that comes meanwhile is kept.
	Pause *Pause
	// Log receives the stage's lines: progress, the rendezvous, where the
	// metrics are served. nil: standard output.
	Log io.Writer
	// Started, if set, is called with the runtime once it is built, before
	// it runs: pipetrain stage answers the launcher's status queries
	// (Runtime.Activity) from then on.
	Started func(*Runtime)
	// Failed, if set, is called with the runtime when its run fails while
	// ctx is live, other than by a requested stop (ErrPaused): pipetrain
	// stage then says what the stage was waiting for when it gave up.
	Failed func(*Runtime)
	// Rejoin and RejoinAt restart a worker of async parameter servers
	// that left the run (Options.Rejoin): launch passes pipetrain stage
	// --rejoin STEP to each of the replica's processes.
	Rejoin   bool
	RejoinAt int
	// AskRejoin, if set, gives a rejoining process, once its links are
	// up, the step it rejoins at instead of RejoinAt: launch reads it then,
	// the same for every process of the replica, so that the others wait
	// for none of the steps they made while it started.
	AskRejoin func(ctx context.Context) (int, error)
}

// RunProcess runs one stage process, as pipetrain stage does once it knows
// its stage and replica: it pins the process to the stage's cpus, lowers
// GOMAXPROCS to the stage's share of the cores (schedulerProcs), meets the
// other processes at the rendezvous when the config has one, connects the
// stage's links, gives its BLAS library and kernels the stage's threads
// (SetProcessThreads), builds its Runtime, serves its metrics when the stage has a
// metrics_address, trains, and then, after a rendezvous, gathers the run's
// logs into rank 0's run directory. The pinning and GOMAXPROCS are the
// whole process's, as they are a stage process's.
//
// A stop at the step Pause named returns an error that is ErrPaused.
func RunProcess(ctx context.Context, o ProcessOptions) error {
	cfg, index, replica := o.Config, o.Stage, o.Replica
	log := o.Log
	if log == nil {
		log = os.Stdout
	}
	if index < 0 || index >= len(cfg.Stages) {
		return fmt.Errorf("%s has stages 0-%d, not %d", cfg.Path, len(cfg.Stages)-1, index)
	}
	if replica < 0 || replica >= cfg.Replicas() {
		return fmt.Errorf("%s has data_parallel %d, so no replica %d", cfg.Path, cfg.Replicas(), replica)
	}
	if list := cfg.Stages[index].CPUs; list != "" {
		cpus, _ := affinity.Parse(list) // checked by Validate
		if err := affinity.Pin(cpus); err != nil {
			return fmt.Errorf("stages[%d].cpus: %w", index, err)
		}
	}
	// Set only where it lowers the count: setting GOMAXPROCS at all
	// ends Go's own updates of it (to a container's CPU limit).
	if n := schedulerProcs(cfg, index, os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n != runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
	SetProcessThreads(cfg.Threads(index))
	if o.Rejoin && cfg.UsesRendezvous() {
		// The rendezvous hands out its table once, to the ranks of the
		// run's start.
		return fmt.Errorf("%s: a worker rejoins a run only with fixed addresses, not at a rendezvous", cfg.ProcessName(index, replica))
	}
	var bound net.Listener
	var job *Joined
	if cfg.UsesRendezvous() {
		var err error
		if job, err = rendezvous(ctx, cfg, index, replica, o.RunDir, log); err != nil {
			return err
		}
		defer job.Stop()
		bound = job.lis
		if job.reg != nil && o.Pause != nil {
			o.Pause.onLost(job.reg.Excuse)
		}
	}
	layout, err := NewReplicaLayout(cfg, index, replica)
	if err != nil {
		if bound != nil {
			bound.Close()
		}
		return err
	}
	layout.Listener = bound
	links, err := Connect(ctx, layout)
	if err != nil {
		return err
	}
	defer links.Close()
	if o.Rejoin && o.AskRejoin != nil {
		if o.RejoinAt, err = askRejoin(ctx, cfg, o); err != nil {
			return err
		}
	}
	opts := Options{Layout: layout, Config: cfg, Stage: index, RunDir: o.RunDir, Prev: links.Prev, Next: links.Next,
		ReplicaPrev: links.ReplicaPrev, ReplicaNext: links.ReplicaNext, ReplicaIn: links.ReplicaIn, ReplicaOut: links.ReplicaOut, Log: log, Resume: o.Resume, Pause: o.Pause,
		Rejoin: o.Rejoin, RejoinAt: o.RejoinAt}
	if job != nil {
		opts.Coordinator = job.coord
	}
	rt, err := New(opts)
	if o.Rejoin && errors.Is(err, ps.ErrOver) {
		// Every other worker had finished: nothing is left to train.
		fmt.Fprintf(log, "%s: not rejoining: %v\n", cfg.ProcessName(index, replica), err)
		return nil
	}
	if err != nil {
		return err
	}
	if addr := cfg.Stages[index].MetricsAddress; addr != "" {
		// The metrics require the links' token or certificate, if any.
		auth, err := MetricsAuthFor(cfg, index)
		if err != nil {
			return err
		}
		stop, _, err := ServeMetricsAuth(addr, rt.Metrics(), auth)
		if err != nil {
			return fmt.Errorf("stages[%d].metrics_address: %w", index, err)
		}
		defer stop()
		fmt.Fprintf(log, "stage %d: Prometheus metrics on %s://%s/metrics\n", index, auth.Scheme(), addr)
	}
	if o.Started != nil {
		o.Started(rt)
	}
	if err := rt.Run(ctx); err != nil {
		if !errors.Is(err, ErrPaused) && ctx.Err() == nil && o.Failed != nil {
			o.Failed(rt)
		}
		return err
	}
	if job != nil {
		return job.Gather(ctx, cfg, o.RunDir, log)
	}
	return nil
}

// askRejoin asks, within connect_timeout, for the step a rejoining process
// rejoins at.
func askRejoin(ctx context.Context, cfg *configs.Config, o ProcessOptions) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Transport.ConnectTimeout)
	defer cancel()
	step, err := o.AskRejoin(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: asking the launcher for the step to rejoin at: %w", cfg.ProcessName(o.Stage, o.Replica), err)
	}
	return step, nil
}

// schedulerProcs is the GOMAXPROCS a stage process runs with: its share of
// the machine's cores (configs.CoreShare) where stages share them, unless the
// environment sets GOMAXPROCS (env), and never more than it has (current).
// Go otherwise gives every process as many Ps as the machine has cores, and
// a stage waiting for its neighbour spins on them, taking cycles from the
// stages that compute: four stages of a 1024-wide MLP on two cores trained
// 3% faster with one P each (median of six launches each, 1816 against 1762
// samples/s).
func schedulerProcs(cfg *configs.Config, stage int, env string, current int) int {
	if env != "" {
		return current
	}
	return min(current, cfg.CoreShare(stage))
}

// SetProcessThreads gives the process's matrix products (OpenBLAS's thread
// count) and the engine's elementwise kernels n cores. Both are the whole
// process's, so New leaves them alone: tests and programs build several
// Runtimes in one process, and none should change another's. RunProcess
// calls it with the stage's Config.Threads; a program that builds a Runtime
// itself calls it once before, with the count its Options say (pipetrain
// reference: Config.ReferenceThreads). OpenBLAS's results depend on the
// count in the last bits, so every process of a run and its reference must
// use the same.
func SetProcessThreads(n int) {
	blas.SetThreads(n)
	engine.SetWorkers(n)
}
