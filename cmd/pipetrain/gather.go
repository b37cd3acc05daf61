package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/stages"
)

func gatherCmd() *cobra.Command {
	var config, runDir string
	var share bool
	c := &cobra.Command{
		Use:   "gather --config FILE --run-dir DIR",
		Short: "Collect every rank's logs and weights into rank 0's run directory (run one per rank, as the stages were)",
		Long: `A run whose ranks each keep a run directory of their own (no shared disk)
gathers their logs into rank 0's at its end. gather does it again on demand,
for a run that ended early: start it once per rank, under the same engine and
environment as the stages (RANK, SLURM_PROCID, JOB_COMPLETION_INDEX, ...),
with the run's config; rank 0 serves the rendezvous and receives, the others
send the files they wrote (event logs, clocks, weights, metrics and
evaluation; not checkpoints). profile, plot
and the weights then work from rank 0's directory.`,
		Example: `  # under Slurm, one task per rank, as the training job ran
  srun pipetrain gather --config run.yaml --run-dir /local/runs/gpt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadShared(config, share)
			if err != nil {
				return err
			}
			r, ok, err := cluster.FromEnv(os.Getenv, cfg.World())
			switch {
			case err != nil:
				return fmt.Errorf("%s: %w", cfg.Path, err)
			case !ok:
				return fmt.Errorf("gather runs once per rank, and no rank is in the environment (%s)", strings.Join(cluster.Variables(), ", "))
			}
			addr, from, err := cluster.ResolveRendezvous(cfg.Rendezvous, os.Getenv)
			if err != nil {
				return fmt.Errorf("%s: %w", cfg.Path, err)
			}
			host, _ := os.Hostname()
			j, err := stages.Join(cmd.Context(), cfg, r.Rank, "gather@"+host, runDir, addr, from, os.Stdout)
			if err != nil {
				return fmt.Errorf("rank %d: %w", r.Rank, err)
			}
			defer j.Stop()
			return j.Gather(cmd.Context(), cfg, runDir, os.Stdout)
		},
	}
	c.Flags().StringVarP(&config, "config", "c", "", "the run's config (YAML)")
	c.Flags().StringVar(&runDir, "run-dir", "runs/latest", "this rank's run directory")
	registerShare(c, &share)
	c.MarkFlagRequired("config")
	return c
}
