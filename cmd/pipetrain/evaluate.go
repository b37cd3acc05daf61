package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/stages"
)

func evaluateCmd() *cobra.Command {
	var f runFlags
	var weights, which string
	var sets []string
	var threads int
	var asJSON bool
	c := &cobra.Command{
		Use:   "evaluate --config FILE --weights RUN_DIR|FILE|DIR",
		Short: "Evaluate weights without training: the loss, and accuracy or perplexity, on the config's evaluation split",
		Long: `Evaluates weights on the config's evaluation split (the test images; the
validation text or token files) in one process, as a run's final evaluation
does: the same micro-batches of data.batch_size / data.micro_batches, in the
same order, no training step, no optimizer, nothing written. The weights are
a run directory (its final weights, every stage's file; or --checkpoint STEP
or latest), a safetensors file (pipetrain export's, or PyTorch's with the
same names), a Hugging Face checkpoint directory (with a config whose
model.from names it), or another folder train.init_from reads; they are checked against the
config's model first, every tensor by name and shape, the errors naming the
file and the tensor. The final weights of a run give its eval.json's figures
bit for bit at the run's BLAS threads (run.json's, the default for a run
directory). For a language model the validation tokens are cut into windows
of context+1 tokens, window i being tokens [i*T, i*T+T] for T = context,
the last partial window dropped, and the loss is the mean cross-entropy over
every predicted token: docs/weights.md, "Evaluating weights".`,
		Example: `  # a run's final weights, with the config it was launched with
  pipetrain evaluate --weights runs/gpt

  # an exported file on another corpus's last 20%
  pipetrain evaluate --config configs/gpt-small-4stage.yaml --weights gpt.safetensors --data data.corpus=go:bytes --data data.val_fraction=0.2

  # a run's newest checkpoint, as JSON
  pipetrain evaluate --weights runs/mlp4 --checkpoint latest --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			defer data.CatchBadData(&err) // a token beyond the vocabulary is bad data
			step, err := parseCheckpointFlag(which)
			if err != nil {
				return err
			}
			st, err := os.Stat(weights)
			if err != nil {
				return fmt.Errorf("--weights: %w", err)
			}
			runDir := st.IsDir() && stages.IsRunDir(weights)
			if which != "" && !runDir {
				return fmt.Errorf("--checkpoint %s: --weights %s is no run directory", which, weights)
			}
			if runDir {
				// The run's config and PIPETRAIN_* settings, as export and sample take them.
				if _, _, err := f.resumeFrom(weights); err != nil {
					return err
				}
			}
			if f.config == "" {
				return errors.New(`required flag "config" not set (only a run directory written by launch names its own)`)
			}
			cfg, err := loadForEvaluation(f.config, sets)
			if err != nil {
				return err
			}
			path := weights
			if runDir {
				var files []string
				if path, _, files, err = stages.RunWeights(cfg, weights, step); err != nil {
					return err
				}
				if step == stages.FinalWeights {
					warnUnchecked(cmd.ErrOrStderr(), checkpoint.MissingSums(files))
				}
			}
			if threads < 1 {
				threads = cfg.Threads(0)
				if n := stages.RunThreads(weights); runDir && n > 0 {
					threads = n // what the run evaluated with, for its own figures bit for bit
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pipetrain: evaluating %s with the model of %s, %s\n", path, shortPath(cfg.Path), words.Count(threads, "BLAS thread"))
			stages.SetProcessThreads(threads)
			res, err := stages.EvaluateWeights(cmd.Context(), stages.Options{Config: cfg, Threads: threads}, path)
			if err != nil {
				return err
			}
			if asJSON {
				b, err := json.MarshalIndent(res, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), evaluationLine(cfg, res))
			return nil
		},
	}
	c.Flags().StringVarP(&f.config, "config", "c", "", "the config whose model and evaluation data to use (default: a run directory's own, from its launch.json)")
	c.Flags().StringVarP(&weights, "weights", "w", "", "a run directory, a safetensors `FILE`, a Hugging Face checkpoint directory, or a folder of safetensors files")
	c.Flags().StringVar(&which, "checkpoint", "", "with a run directory: its checkpoint of `STEP`, or latest, instead of its final weights")
	c.Flags().StringArrayVar(&sets, "data", nil, "set a key of the config's data section, `data.KEY=VALUE` as in the file (repeatable; paths from the config's folder), e.g. data.val_shards=val.bin")
	c.Flags().IntVar(&threads, "threads", 0, "BLAS threads (default: the run's, from its run.json, else a stage's share as compute.blas_threads gives it)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the result as eval.json holds it")
	c.MarkFlagRequired("weights")
	return c
}

// loadForEvaluation reads the config at path with the --data settings,
// checked as a run's would be, evaluating (train.evaluate) whatever the file
// says and with its own train.init_from left out: the weights evaluated
// are --weights.
func loadForEvaluation(path string, sets []string) (*configs.Config, error) {
	cfg, err := configs.LoadUnchecked(path)
	if err != nil {
		return nil, err
	}
	if err := cfg.SetData(sets); err != nil {
		return nil, err
	}
	cfg.Train.InitFrom, cfg.Train.Evaluate = "", true
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := blas.Reload(cfg.Compute.BLASKernels); err != nil {
		return nil, err
	}
	if err := cfg.CheckData(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// evaluationLine says what an evaluation found, as a run's last line does.
func evaluationLine(cfg *configs.Config, res *stages.EvalResult) string {
	if res.Perplexity != 0 {
		return fmt.Sprintf("pipetrain: validation loss %.4f, perplexity %.2f, next-token accuracy %.2f%% on %d tokens", res.Loss, res.Perplexity, 100*res.Accuracy, res.Examples)
	}
	what := "test examples"
	if cfg.Data.Dataset == "fashion-mnist" {
		what = "test images"
	}
	return fmt.Sprintf("pipetrain: test loss %.4f, accuracy %.2f%% on %d %s", res.Loss, 100*res.Accuracy, res.Examples, what)
}

// shortPath is path relative to the working directory when it lies below
// it (a run's launch.json records its config's absolute path), else path.
func shortPath(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	if rel, err := filepath.Rel(wd, path); err == nil && filepath.IsLocal(rel) {
		return rel
	}
	return path
}
