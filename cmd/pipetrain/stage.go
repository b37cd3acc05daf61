package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func stageCmd() *cobra.Command {
	var f runFlags
	var index, replica, rejoin int
	var resume, controlled bool
	c := &cobra.Command{
		Use:   "stage --config FILE [--stage N [--replica R]]",
		Short: "Run one pipeline stage (launch runs these for you; use it directly for one stage per host)",
		Example: `  # one stage per host: on the second host of a 4-stage run
  pipetrain stage --config configs/fmnist-mlp-4stage.yaml --stage 1 --run-dir runs/mlp4

  # under Slurm or torchrun, the rank comes from RANK and WORLD_SIZE
  srun pipetrain stage --config run.yaml --run-dir /local/runs/gpt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			// A token beyond the vocabulary, met in a window the checks
			// before the run did not sample, stops the stage as bad data.
			defer data.CatchBadData(&err)
			// Installed first: a status query must never end the process,
			// whatever it is doing when the query comes.
			queries := make(chan os.Signal, 1)
			signal.Notify(queries, syscall.SIGUSR1)
			defer signal.Stop(queries)
			// Served from the start too: a launch interrupted while this
			// stage connects must still hear that it may start no step.
			pause := stages.NewPause()
			if controlled {
				go launcher.ServePauses(os.Stdin, os.Stdout, pause.Ask, pause.StopAfter, pause.Lose, pause.Rejoin)
			}
			cfg, err := f.load()
			if err != nil {
				return refusedConfig{err}
			}
			if !cmd.Flags().Changed("stage") {
				rank, err := rankFromEnv(cfg, cmd.Flags().Changed("replica"))
				if err != nil {
					return err
				}
				// The ranks after the stage processes' run the parameter
				// servers, with the same binary and command line.
				if server, ok := cfg.ServerAt(rank); ok {
					return stages.ServePS(cmd.Context(), cfg, server, f.runDir, resume, os.Stdout)
				}
				index, replica = cfg.Position(rank)
			}
			if index < 0 || index >= len(cfg.Stages) {
				return fmt.Errorf("--stage %d: %s has stages 0-%d", index, cfg.Path, len(cfg.Stages)-1)
			}
			if replica < 0 || replica >= cfg.Replicas() {
				return fmt.Errorf("--replica %d: %s has data_parallel %d, so replicas 0-%d", replica, cfg.Path, cfg.Replicas(), cfg.Replicas()-1)
			}
			if cmd.Flags().Changed("rejoin") && rejoin < 0 {
				return fmt.Errorf("--rejoin %d: a step is 0 or more", rejoin)
			}
			var askRejoin func(context.Context) (int, error)
			if controlled {
				// Launch reads the step again once the replica's links are up.
				askRejoin = func(ctx context.Context) (int, error) {
					fmt.Println(launcher.RejoinAsk)
					return pause.RejoinStep(ctx)
				}
			}
			err = stages.RunProcess(cmd.Context(), stages.ProcessOptions{Config: cfg, Stage: index, Replica: replica, RunDir: f.runDir, Resume: resume, Pause: pause,
				Rejoin: cmd.Flags().Changed("rejoin"), RejoinAt: rejoin, AskRejoin: askRejoin,
				Started: func(rt *stages.Runtime) { go answerStatusQueries(queries, rt) },
				// The launcher reads what the stage was waiting for when it
				// gave up, to follow the chain to the stage that hung.
				Failed: func(rt *stages.Runtime) { fmt.Println(statusLine(rt)) },
			})
			if errors.Is(err, stages.ErrPaused) {
				return interruptedStage{err}
			}
			return err
		},
	}
	f.register(c, "runs/latest")
	c.Flags().IntVar(&index, "stage", -1, "index of the stage in the config's stages list (default: from the rank the environment gives: "+strings.Join(cluster.Variables(), ", ")+")")
	c.Flags().IntVar(&replica, "replica", 0, "which replica of the stage (data_parallel > 1): 0 to data_parallel-1")
	c.Flags().BoolVar(&resume, "resume", false, "continue from the newest complete checkpoint in --run-dir (every stage must be given it)")
	c.Flags().IntVar(&rejoin, strings.TrimPrefix(launcher.RejoinFlag, "--"), 0, "async parameter servers: this worker's processes were restarted after it left the run; train from STEP (the steps done before it) on with the servers' current weights (launch sets it, and gives a fresher step once the worker's links are up)")
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

// rankFromEnv reads the rank a cluster engine gave a stage process started
// without --stage (RANK, SLURM_PROCID, ...), checked against the job's
// world (stages × replicas, and the parameter servers when they are ranks).
func rankFromEnv(cfg *configs.Config, replicaGiven bool) (int, error) {
	r, ok, err := cluster.FromEnv(os.Getenv, cfg.World())
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: %w", cfg.Path, err)
	case !ok:
		return 0, fmt.Errorf("no --stage given and no rank in the environment (%s): give --stage, or start the stage under a launcher that sets one", strings.Join(cluster.Variables(), ", "))
	case replicaGiven:
		return 0, fmt.Errorf("--replica needs --stage; with a rank from %s the grid places the process", r.Source)
	}
	fmt.Printf("pipetrain: rank %d of %d from %s: %s\n", r.Rank, r.World, r.Source, rankName(cfg, r.Rank))
	return r.Rank, nil
}

// rankName names what a rank runs: a stage process, or a parameter server.
func rankName(cfg *configs.Config, rank int) string {
	if server, ok := cfg.ServerAt(rank); ok {
		return configs.PSName(server)
	}
	return cfg.ProcessName(cfg.Position(rank))
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
