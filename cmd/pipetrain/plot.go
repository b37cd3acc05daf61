package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/stages"
)

func plotCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "plot RUN_DIR [--svg FILE]",
		Short:   "Draw a run's training loss and its evaluation loss per step as an SVG",
		Example: `  pipetrain plot runs/gpt --svg gpt-loss.svg`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runDir := args[0]
			ms, err := stages.ReadMetrics(filepath.Join(runDir, "metrics.jsonl"))
			if err != nil {
				return err
			}
			if len(ms) == 0 {
				return fmt.Errorf("%s: no steps logged yet", filepath.Join(runDir, "metrics.jsonl"))
			}
			train := profile.Series{Name: "training loss", Color: "#4e79a7"}
			eval := profile.Series{Name: "evaluation loss", Color: "#e15759", Dots: true}
			for _, m := range ms {
				train.X, train.Y = append(train.X, float64(m.Step)), append(train.Y, m.Loss)
				if m.Eval != nil {
					eval.X, eval.Y = append(eval.X, float64(m.Step)), append(eval.Y, m.Eval.Loss)
				}
			}
			// The final evaluation (eval.json) closes the evaluation line.
			if b, err := os.ReadFile(filepath.Join(runDir, "eval.json")); err == nil {
				var final stages.EvalResult
				if json.Unmarshal(b, &final) == nil && final.Examples > 0 {
					eval.X, eval.Y = append(eval.X, float64(ms[len(ms)-1].Step)), append(eval.Y, final.Loss)
				}
			}
			series := []profile.Series{train}
			if len(eval.X) > 0 {
				series = append(series, eval)
			}
			if out == "" {
				out = filepath.Join(runDir, "loss.svg")
			}
			var b bytes.Buffer
			if err := profile.WriteCurveSVG(&b, "Loss of "+filepath.Base(filepath.Clean(runDir)), "step", "cross-entropy (nats)", series); err != nil {
				return err
			}
			if err := checkpoint.WriteAtomic(out, func(w io.Writer) error { _, err := w.Write(b.Bytes()); return err }); err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "pipetrain: wrote %s (%d steps, %d evaluations)\n", out, len(train.X), len(eval.X))
			return nil
		},
	}
	c.Flags().StringVar(&out, "svg", "", "file to write (default RUN_DIR/loss.svg)")
	return c
}
