package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/profile"
)

func profileCmd() *cobra.Command {
	var skip, first, shown int
	var steps bool
	var trace, svg, html string
	c := &cobra.Command{
		Use:   "profile RUN_DIR [--trace FILE] [--svg FILE] [--html FILE]",
		Short: "Per-stage compute, waits, bubble against the simulator's prediction, links and straggler steps of a run; timelines as Chrome trace, SVG or HTML",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, events, err := profile.ReadRun(args[0])
			if err != nil {
				return err
			}
			r, err := profile.Analyse(info, events, skip)
			if err != nil {
				return err
			}
			if err := r.Write(os.Stdout, profile.Options{Steps: steps}); err != nil {
				return err
			}
			write := func(path string, fill func(io.Writer) error) error {
				if path == "" {
					return nil
				}
				f, err := os.Create(path)
				if err != nil {
					return err
				}
				if err := fill(f); err != nil {
					f.Close()
					return fmt.Errorf("%s: %w", path, err)
				}
				if err := f.Close(); err != nil {
					return err
				}
				fmt.Printf("wrote %s (steps %d to %d)\n", path, max(first, 0)+1, max(first, 0)+shown)
				return nil
			}
			chart := profile.Chart(events, first, shown)
			if err := write(trace, func(w io.Writer) error { return profile.WriteTrace(w, events, first, shown) }); err != nil {
				return err
			}
			if err := write(svg, chart.SVG); err != nil {
				return err
			}
			return write(html, func(w io.Writer) error { return profile.WriteHTML(w, chart, r) })
		},
	}
	c.Flags().IntVar(&skip, "skip", 1, "leave out the first steps (warm-up) from the statistics")
	c.Flags().BoolVar(&steps, "steps", false, "also print a row per step")
	c.Flags().StringVar(&trace, "trace", "", "write a Chrome trace-event JSON file (Perfetto, chrome://tracing)")
	c.Flags().StringVar(&svg, "svg", "", "write the timeline as a self-contained SVG")
	c.Flags().StringVar(&html, "html", "", "write the timeline and the report as a self-contained HTML page")
	c.Flags().IntVar(&first, "first-step", 1, "first step shown in the pictures (0-based; step 0 is warm-up)")
	c.Flags().IntVar(&shown, "chart-steps", profile.DefaultChartSteps, "steps shown in the pictures")
	return c
}
