package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/stages"
)

func exportCmd() *cobra.Command {
	var f runFlags
	var out, which, format, shardSize string
	var list, force bool
	c := &cobra.Command{
		Use:   "export RUN_DIR --out FILE|DIR",
		Short: "Write a run's weights as one safetensors file with PyTorch's names and layouts",
		Long: `Merges the run's stage files (its final weights, or a checkpoint's) into one
safetensors file that a PyTorch module of the same model loads with
load_state_dict: dense weights transposed to nn.Linear's [out, in], the GPT's
parameters renamed (tok_emb.weight, blocks.0.attn.q.weight, ...), a tied
embedding written once. The file keeps the run's dtype; its metadata names the
model, its sizes and the run's config digest. Its checksum is written beside
it, and the run's files are checked against theirs first. An existing --out
is replaced only with --force. train.init_from reads it back.
The name map and the PyTorch modules: docs/weights.md.

With --format hf (models llama and gpt) --out is a Hugging Face checkpoint
directory instead: config.json and model.safetensors, sharded beyond
--shard-size with model.safetensors.index.json, under LlamaForCausalLM's or
GPT2LMHeadModel's names, each tensor in the dtype of the Hugging Face
checkpoint the run started from (else F32), written to a temporary folder
renamed into place.`,
		Example: `  # the final weights of a launched run
  pipetrain export runs/mlp4 --out mlp4.safetensors

  # a run's newest checkpoint, listing each tensor written
  pipetrain export runs/gpt --out gpt.safetensors --checkpoint latest --list

  # a reference run, which records no launch.json: name its config
  pipetrain export runs/mlp4-ref --config configs/fmnist-mlp-4stage.yaml --out ref.safetensors

  # a Llama as a Hugging Face checkpoint directory, in shards of 1 GB
  pipetrain export runs/llama --format hf --out llama-hf --shard-size 1GB`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runDir := args[0]
			step, err := parseCheckpointFlag(which)
			if err != nil {
				return err
			}
			if _, _, err := f.resumeFrom(runDir); err != nil {
				return err
			}
			if _, err := os.Stat(out); err == nil && !force {
				return fmt.Errorf("--out %s exists: give --force to replace it", out)
			}
			// The model is all export needs of the config: its data, TLS
			// files or init_from need not be on this machine any more.
			cfg, err := configs.LoadUnchecked(f.config)
			if err != nil {
				return err
			}
			if format == "hf" {
				return exportHF(cmd, cfg, runDir, step, out, shardSize, list)
			}
			if format != "pt" {
				return fmt.Errorf("--format %q: want pt (one safetensors file) or hf (a Hugging Face checkpoint directory)", format)
			}
			e, err := stages.Export(cfg, runDir, step, out)
			if err != nil {
				return err
			}
			values := 0
			for _, t := range e.Tensors {
				values += len(t.F32) + len(t.F64)
			}
			w := cmd.OutOrStdout()
			warnUnchecked(cmd.ErrOrStderr(), e.Unchecked)
			fmt.Fprintf(w, "exported model %s, step %d: %s, %d parameters, %s, from %s to %s\n",
				cfg.Model.Name, e.Step, words.Count(len(e.Tensors), "tensor"), values, dtypeName(e), e.From, out)
			if list {
				for _, t := range e.Tensors {
					fmt.Fprintf(w, "  %-32s %v\n", t.Name, t.Shape)
				}
			}
			return nil
		},
	}
	c.Flags().StringVarP(&out, "out", "o", "", "the safetensors `FILE` to write, and its checksum beside it (FILE.sha256, or NAME.sha256 for NAME.safetensors); with --format hf, the directory")
	c.Flags().StringVarP(&f.config, "config", "c", "", "the run's config (default: the one in RUN_DIR/launch.json)")
	c.Flags().StringVar(&which, "checkpoint", "", "export the checkpoint of `STEP`, or latest, instead of the final weights")
	c.Flags().BoolVar(&list, "list", false, "list every tensor written, with its shape")
	c.Flags().BoolVar(&force, "force", false, "replace --out if it exists")
	c.Flags().StringVar(&format, "format", "pt", "pt: one safetensors file with PyTorch's names; hf: a Hugging Face checkpoint directory")
	c.Flags().StringVar(&shardSize, "shard-size", "2GB", "with --format hf, the most tensor data per shard (`SIZE`, e.g. 500MB, 2GB)")
	c.MarkFlagRequired("out")
	return c
}

// parseCheckpointFlag reads --checkpoint: "" for the final weights, "latest",
// or a step.
func parseCheckpointFlag(s string) (int, error) {
	switch s {
	case "":
		return stages.FinalWeights, nil
	case "latest":
		return stages.LatestCheckpoint, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--checkpoint %q: want a step (1 or more) or latest", s)
	}
	return n, nil
}

func dtypeName(e *stages.Exported) string {
	for _, t := range e.Tensors {
		if t.F64 != nil {
			return "float64"
		}
	}
	return "float32"
}
