package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/affinity"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func stageCmd() *cobra.Command {
	var f runFlags
	var index, replica int
	var resume, controlled bool
	c := &cobra.Command{
		Use:   "stage --config FILE [--stage N [--replica R]]",
		Short: "Run one pipeline stage (launch runs these for you; use it directly for one stage per host)",
		Example: `  # one stage per host: on the second host of a 4-stage run
  pipetrain stage --config configs/fmnist-mlp-4stage.yaml --stage 1 --run-dir runs/mlp4

  # under Slurm or torchrun, the rank comes from RANK and WORLD_SIZE
  srun pipetrain stage --config run.yaml --run-dir /local/runs/gpt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Installed first: a status query must never end the process,
			// whatever it is doing when the query comes.
			queries := make(chan os.Signal, 1)
			signal.Notify(queries, syscall.SIGUSR1)
			defer signal.Stop(queries)
			// Served from the start too: a launch interrupted while this
			// stage connects must still hear that it may start no step.
			pause := stages.NewPause()
			if controlled {
				go launcher.ServePauses(os.Stdin, os.Stdout, pause.Ask, pause.StopAfter)
			}
			cfg, err := f.load()
			if err != nil {
				return refusedConfig{err}
			}
			if !cmd.Flags().Changed("stage") {
				if index, replica, err = rankFromEnv(cfg, cmd.Flags().Changed("replica")); err != nil {
					return err
				}
			}
			if index < 0 || index >= len(cfg.Stages) {
				return fmt.Errorf("--stage %d: %s has stages 0-%d", index, cfg.Path, len(cfg.Stages)-1)
			}
			if replica < 0 || replica >= cfg.Replicas() {
				return fmt.Errorf("--replica %d: %s has data_parallel %d, so replicas 0-%d", replica, cfg.Path, cfg.Replicas(), cfg.Replicas()-1)
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
			var bound net.Listener
			var job *joined
			if cfg.UsesRendezvous() {
				if job, err = rendezvous(cmd.Context(), cfg, index, replica, f.runDir); err != nil {
					return err
				}
				defer job.stop()
				bound = job.lis
			}
			layout, err := stages.NewReplicaLayout(cfg, index, replica)
			if err != nil {
				if bound != nil {
					bound.Close()
				}
				return err
			}
			layout.Listener = bound
			links, err := stages.Connect(cmd.Context(), layout)
			if err != nil {
				return err
			}
			defer links.Close()
			o := stages.Options{Layout: layout, Config: cfg, Stage: index, RunDir: f.runDir, Prev: links.Prev, Next: links.Next,
				ReplicaPrev: links.ReplicaPrev, ReplicaNext: links.ReplicaNext, Log: os.Stdout, Resume: resume, Pause: pause}
			if job != nil {
				o.Coordinator = job.coord
			}
			rt, err := stages.New(o)
			if err != nil {
				return err
			}
			if addr := cfg.Stages[index].MetricsAddress; addr != "" {
				// The metrics require the links' token or certificate, if any.
				auth, err := stages.MetricsAuthFor(cfg, index)
				if err != nil {
					return err
				}
				stop, _, err := stages.ServeMetricsAuth(addr, rt.Metrics(), auth)
				if err != nil {
					return fmt.Errorf("stages[%d].metrics_address: %w", index, err)
				}
				defer stop()
				fmt.Printf("stage %d: Prometheus metrics on %s://%s/metrics\n", index, auth.Scheme(), addr)
			}
			go answerStatusQueries(queries, rt)
			if err := rt.Run(cmd.Context()); err != nil {
				if errors.Is(err, stages.ErrPaused) {
					return interruptedStage{err}
				}
				if cmd.Context().Err() == nil {
					// The launcher reads what the stage was waiting for when
					// it gave up, to follow the chain to the stage that hung.
					fmt.Println(statusLine(rt))
				}
				return err
			}
			if job != nil {
				return job.gather(cmd.Context(), cfg, f.runDir)
			}
			return nil
		},
	}
	f.register(c, "runs/latest")
	c.Flags().IntVar(&index, "stage", -1, "index of the stage in the config's stages list (default: from the rank the environment gives: "+strings.Join(cluster.Variables(), ", ")+")")
	c.Flags().IntVar(&replica, "replica", 0, "which replica of the stage (data_parallel > 1): 0 to data_parallel-1")
	c.Flags().BoolVar(&resume, "resume", false, "continue from the newest complete checkpoint in --run-dir (every stage must be given it)")
	c.Flags().BoolVar(&controlled, strings.TrimPrefix(launcher.ControlFlag, "--"), false, "standard input carries the launcher's pause and stop requests (launch sets it)")
	c.Flags().MarkHidden(strings.TrimPrefix(launcher.ControlFlag, "--"))
	return c
}

// interruptedStage is the error of a stage that stopped at the step its
// launcher named: it exits with the interrupted status (130), which the
// launcher takes for a stop as asked, not a failure.
type interruptedStage struct{ error }

func (e interruptedStage) Is(target error) bool { return target == launcher.ErrInterrupted }
func (e interruptedStage) Unwrap() error        { return e.error }

// rankFromEnv places a stage started without --stage by the rank a cluster
// engine gave it (RANK, SLURM_PROCID, ...) on the config's grid.
func rankFromEnv(cfg *configs.Config, replicaGiven bool) (stage, replica int, err error) {
	r, ok, err := cluster.FromEnv(os.Getenv, cfg.Processes())
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("%s: %w", cfg.Path, err)
	case !ok:
		return 0, 0, fmt.Errorf("no --stage given and no rank in the environment (%s): give --stage, or start the stage under a launcher that sets one", strings.Join(cluster.Variables(), ", "))
	case replicaGiven:
		return 0, 0, fmt.Errorf("--replica needs --stage; with a rank from %s the grid places the process", r.Source)
	}
	stage, replica = cfg.Position(r.Rank)
	fmt.Printf("pipetrain: rank %d of %d from %s: %s\n", r.Rank, r.World, r.Source, cfg.ProcessName(stage, replica))
	return stage, replica, nil
}

// answerStatusQueries prints the stage's status line for each SIGUSR1 (see
// launcher.Status) until queries is closed or no longer notified.
func answerStatusQueries(queries <-chan os.Signal, rt *stages.Runtime) {
	for range queries {
		fmt.Println(statusLine(rt))
	}
}

func statusLine(rt *stages.Runtime) string {
	a := rt.Activity()
	return launcher.FormatStatus(launcher.Status{Stage: a.Stage, Replica: a.Replica, Action: a.Action, Peer: a.Peer, Ring: a.PeerReplica >= 0, PeerReplica: a.PeerReplica, For: a.For})
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
