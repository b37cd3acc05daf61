package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/stages"
)

func plotCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "plot RUN_DIR [--svg FILE]",
		Short:   "Draw a run's training loss and its evaluation loss per step as an SVG (and its learning rate and gradient norm when logged)",
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
			name := filepath.Base(filepath.Clean(runDir))
			if err := writeCurve(out, "Loss of "+name, "cross-entropy (nats)", series); err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "pipetrain: wrote %s (%d steps, %d evaluations)\n", out, len(train.X), len(eval.X))
			// A run with a learning-rate schedule or clipping logged those
			// per step too: each gets a picture of its own, beside the loss's.
			for _, c := range []struct {
				file, title, unit string
				of                func(stages.Metric) *float64
			}{
				{"lr", "Learning rate of " + name, "learning rate", func(m stages.Metric) *float64 { return m.LR }},
				{"grad_norm", "Gradient norm of " + name + " (before clipping)", "global L2 norm", func(m stages.Metric) *float64 { return m.GradNorm }},
			} {
				s := profile.Series{Name: c.unit, Color: "#59a14f"}
				for _, m := range ms {
					if v := c.of(m); v != nil {
						s.X, s.Y = append(s.X, float64(m.Step)), append(s.Y, *v)
					}
				}
				if len(s.X) == 0 {
					continue
				}
				path := strings.TrimSuffix(out, ".svg") + "-" + c.file + ".svg"
				if err := writeCurve(path, c.title, c.unit, []profile.Series{s}); err != nil {
					return err
				}
				fmt.Fprintf(os.Stdout, "pipetrain: wrote %s (%s per step)\n", path, c.unit)
			}
			return nil
		},
	}
	c.Flags().StringVar(&out, "svg", "", "file to write (default RUN_DIR/loss.svg)")
	return c
}

// writeCurve draws series against the step into path, atomically.
func writeCurve(path, title, unit string, series []profile.Series) error {
	var b bytes.Buffer
	if err := profile.WriteCurveSVG(&b, title, "step", unit, series); err != nil {
		return err
	}
	return checkpoint.WriteAtomic(path, func(w io.Writer) error { _, err := w.Write(b.Bytes()); return err })
}
