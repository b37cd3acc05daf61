package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

func validateCmd() *cobra.Command {
	var path string
	c := &cobra.Command{
		Use:   "validate --config FILE",
		Short: "Check a config and explain every problem found",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configs.Load(path)
			if err != nil {
				return err
			}
			m, err := models.Build(cfg.Model)
			if err != nil {
				return err
			}
			// Data that contradicts the model is refused here as launch,
			// reference and every stage refuse it. Data absent from this
			// machine is only noted: the config may be meant for hosts that
			// have it, and each stage checks it when it starts.
			dataErr := cfg.CheckData()
			if dataErr != nil && !errors.Is(dataErr, fs.ErrNotExist) {
				return dataErr
			}
			out := cmd.OutOrStdout()
			theory, _ := schedule.TheoreticalBubble(cfg.Schedule, len(cfg.Stages), cfg.Data.MicroBatches, cfg.VirtualStages)
			fmt.Fprintf(out, "%s: ok\n  model %s, %d layers, %s\n  %s schedule, %d stages, %d micro-batches of %d, theoretical bubble %.1f%%\n",
				cfg.Path, cfg.Model.Name, len(m.Layers), cfg.Model.DType, cfg.Schedule, len(cfg.Stages), cfg.Data.MicroBatches, cfg.MicroBatchSize(), 100*theory)
			for i, s := range cfg.Stages {
				for chunk := range s.Layers {
					first, last := cfg.ChunkLayers(i, chunk)
					name := fmt.Sprintf("stage %d", i)
					if cfg.VirtualStages > 1 {
						name += fmt.Sprintf(" chunk %d", chunk)
					}
					recompute := ""
					if s.Recompute != "" && s.Recompute != "none" {
						recompute = ", recompute " + s.Recompute
					}
					fmt.Fprintf(out, "  %-16s %-21s layers %-5s in %v -> out %v%s\n", name, s.Address, s.Layers[chunk], m.ShapeAt(first, cfg.MicroBatchSize()), m.ShapeAt(last, cfg.MicroBatchSize()), recompute)
					printUnits(out, m, first, last)
				}
			}
			if r := cfg.Replicas(); r > 1 {
				printGrid(out, cfg)
			}
			if env := cfg.Overrides(); len(env) > 0 {
				fmt.Fprintf(out, "  from the environment: %s\n", strings.Join(env, ", "))
			}
			for i, s := range cfg.Stages {
				if s.CPUs != "" && !cfg.CPUsCheckedHere(i) {
					fmt.Fprintf(out, "  note: stages[%d].cpus %q not checked: %s is not this machine; the stage checks them when it starts\n", i, s.CPUs, s.Address)
				}
			}
			if dataErr != nil {
				fmt.Fprintf(out, "  note: data not checked against the model: %v; launch, reference and stage refuse to start without it\n", dataErr)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&path, "config", "c", "", "config to check")
	c.Example = "  pipetrain validate --config configs/fmnist-mlp-2x2.yaml"

	c.MarkFlagRequired("config")
	return c
}

// printGrid lists every process of a config with replicas: its rank, stage,
// replica and address.
func printGrid(out io.Writer, cfg *configs.Config) {
	r := cfg.Replicas()
	fmt.Fprintf(out, "  grid: %d stages × %d replicas = %d processes, rank = stage × %d + replica; each replica takes %d examples a step\n",
		len(cfg.Stages), r, cfg.Processes(), r, cfg.Data.BatchSize/r)
	fmt.Fprintf(out, "    %-5s %-6s %-8s %s\n", "rank", "stage", "replica", "address")
	for rank := range cfg.Processes() {
		s, rep := cfg.Position(rank)
		fmt.Fprintf(out, "    %-5d %-6d %-8d %s\n", rank, s, rep, cfg.Address(s, rep))
	}
	printPS(out, cfg)
}

// printUnits lists layers [first, last) that describe themselves (a
// sequential model's units: their stack entries and example shapes).
func printUnits(out io.Writer, m *models.Model, first, last int) {
	for i := first; i < last; i++ {
		if d, ok := m.Layers[i].(models.Described); ok {
			fmt.Fprintf(out, "    layer %-3d %s\n", i, d.Describe())
		}
	}
}
