package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/stages"
)

func referenceCmd() *cobra.Command {
	var f runFlags
	var resume, pipelineThreads, force bool
	c := &cobra.Command{
		Use:   "reference --config FILE",
		Short: "Train the same model in one process, no pipeline: the baseline a pipelined run must equal",
		Example: `  # the baseline a pipelined run must equal, using the whole machine
  pipetrain reference --config configs/fmnist-mlp-4stage.yaml --run-dir runs/mlp4-ref

  # with each stage's threads, to compare bit for bit with a pipelined run
  pipetrain reference --config configs/fmnist-mlp-4stage.yaml --run-dir runs/mlp4-ref --pipeline-threads`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			defer data.CatchBadData(&err) // a token beyond the vocabulary is bad data, as in a stage
			if force && resume {
				return errors.New("--force deletes the run that --resume continues: give one of them")
			}
			// As launch: refused before the config is read, deleted once it has loaded.
			claim := func(force bool) error {
				if resume {
					return nil
				}
				return claimRunDir(f.runDir, force, fmt.Sprintf("pipetrain reference --config %s --run-dir %s --resume", f.config, f.runDir))
			}
			if err := claim(false); !force && err != nil {
				return err
			}
			cfg, err := f.load()
			if err != nil {
				return err
			}
			if err := claim(force); err != nil {
				return err
			}
			threads := cfg.ReferenceThreads()
			if pipelineThreads {
				threads = cfg.Threads(0)
			}
			fmt.Printf("pipetrain: reference run of %s in one process, %s, run directory %s\n", cfg.Path, words.Count(threads, "BLAS thread"), f.runDir)
			stages.SetProcessThreads(threads)
			rt, err := stages.New(stages.Options{Config: cfg, Reference: true, RunDir: f.runDir, Log: os.Stdout, Resume: resume, Threads: threads})
			if err != nil {
				return err
			}
			return rt.Run(cmd.Context())
		},
	}
	f.register(c, "")
	c.Flags().BoolVar(&resume, "resume", false, "continue from the newest complete checkpoint in --run-dir")
	c.Flags().BoolVar(&force, "force", false, "start afresh in a --run-dir that holds another run, deleting its checkpoints, weights, logs, events and metrics first")
	c.Flags().BoolVar(&pipelineThreads, "pipeline-threads", false, "use the BLAS threads a pipelined run's stage 0 gets on this machine instead of the whole machine, so that the two runs are equal bit for bit")
	return c
}
