package main

import (
	"fmt"
	"path/filepath"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/generate"
	"github.com/spf13/cobra"
)

func sampleCmd() *cobra.Command {
	var f runFlags
	var prompt string
	var tokens int
	var temperature float64
	var seed uint64
	var tokenizer string
	c := &cobra.Command{
		Use:   "sample --run-dir DIR --prompt TEXT",
		Short: "Generate text from a trained language model's weights (final, or the newest checkpoint)",
		Example: `  # 200 bytes from the newest weights of a GPT run
  pipetrain sample --run-dir runs/gpt --prompt "func Index(" --tokens 200
  # a run on token shards whose folder holds no tokenizer.json
  pipetrain sample --run-dir runs/fineweb --prompt "The" --tokenizer gpt2/tokenizer.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.runDir == "" {
				return fmt.Errorf(`required flag "run-dir" not set`)
			}
			if _, _, err := f.resumeFrom(f.runDir); err != nil {
				return err
			}
			cfg, err := f.load()
			if err != nil {
				return err
			}
			g, err := generate.New(cfg, f.runDir, tokenizer)
			if err != nil {
				return err
			}
			files, _ := filepath.Glob(filepath.Join(g.From, "*.safetensors"))
			warnUnchecked(cmd.ErrOrStderr(), checkpoint.MissingSums(files))
			out, err := g.Generate([]byte(prompt), tokens, temperature, seed)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pipetrain: %d tokens from %s, temperature %g, seed %d\n", tokens, g.From, temperature, seed)
			fmt.Println(string(out))
			return nil
		},
	}
	c.Flags().StringVar(&f.runDir, "run-dir", "", "the trained run (a directory written by launch or reference)")
	c.Flags().StringVarP(&f.config, "config", "c", "", "the run's config (default: the one in RUN_DIR/launch.json)")
	c.Flags().StringVar(&prompt, "prompt", "", "text to continue")
	c.Flags().IntVar(&tokens, "tokens", 200, "tokens to generate")
	c.Flags().Float64Var(&temperature, "temperature", 0.8, "sampling temperature; 0 takes the most likely token each time")
	c.Flags().Uint64Var(&seed, "seed", 1, "seed of the sampling, so a sample can be repeated")
	c.Flags().StringVar(&tokenizer, "tokenizer", "", "byte, or a tokenizer.json (Hugging Face's, or the one data tokenize writes); default: the data's (a text corpus's, or the tokenizer.json beside a tokens run's train_shards)")
	c.MarkFlagRequired("prompt")
	return c
}
