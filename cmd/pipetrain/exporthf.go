package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/stages"
)

// exportHF is export --format hf: the run's weights as a Hugging Face
// checkpoint directory at out.
func exportHF(cmd *cobra.Command, cfg *configs.Config, runDir string, step int, out, shardSize string, list bool) error {
	limit, err := parseBytes(shardSize)
	if err != nil || limit < 1 {
		return fmt.Errorf("--shard-size: %q is not a size like 500MB or 2GB", shardSize)
	}
	e, err := stages.ExportHF(cfg, runDir, step, out, limit)
	if err != nil {
		return err
	}
	values, bytes := 0, 0
	for _, t := range e.Tensors {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		values += n
		bytes += len(t.Data)
	}
	shards := 0
	for _, f := range e.Files {
		if strings.HasSuffix(f, ".safetensors") {
			shards++
		}
	}
	w := cmd.OutOrStdout()
	warnUnchecked(cmd.ErrOrStderr(), e.Unchecked)
	fmt.Fprintf(w, "exported model %s, step %d: %s, %d parameters, %s in %s, from %s to the Hugging Face checkpoint %s\n",
		cfg.Model.Name, e.Step, words.Count(len(e.Tensors), "tensor"), values, human(int64(bytes)), words.Count(shards, "safetensors file"), e.From, out)
	if list {
		for _, t := range e.Tensors {
			fmt.Fprintf(w, "  %-48s %-4s %v\n", t.Name, t.DType, t.Shape)
		}
	}
	return nil
}
