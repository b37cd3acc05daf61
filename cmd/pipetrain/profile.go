package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/profile"
)

func profileCmd() *cobra.Command {
	var skip, first, shown, replica int
	var steps bool
	var trace, svg, html string
	c := &cobra.Command{
		Use:   "profile RUN_DIR [--trace FILE] [--svg FILE] [--html FILE]",
		Short: "Per-stage compute, waits, bubble against the simulator's prediction, links and straggler steps of a run; timelines as Chrome trace, SVG or HTML",
		Example: `  # the per-stage table: compute, waits and idle time, measured beside simulated
  pipetrain profile runs/mlp4

  # timelines: a Chrome trace (chrome://tracing, Perfetto) and an SVG
  pipetrain profile runs/mlp4 --trace mlp4.json --svg mlp4.svg`,
		Long: `Per-stage compute, waits, bubble against the simulator's prediction, links and
straggler steps of a run; timelines as Chrome trace, SVG or HTML.

Steps are numbered as the training log and metrics.jsonl number them: from 1.

With data-parallel replicas the tables and pictures are one replica's
pipeline (--replica, default 0), with each stage's gradient all-reduce, and a
summary of every replica's stages names the straggler replicas. With parameter
servers (the replicas their workers) two more tables follow: each worker
stage's pushes and pulls (bytes, times, the share of its step they took, its
pushes' staleness) and each server's updates, bytes, busy time, dropped
pushes and staleness histogram, from the servers' event logs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, events, err := profile.ReadRun(args[0])
			if err != nil {
				return err
			}
			if replica != 0 && (replica < 0 || replica >= max(info.Replicas, 1)) {
				if info.Replicas < 2 {
					return fmt.Errorf("--replica %d: the run has no replicas (data_parallel 1): use 0", replica)
				}
				return fmt.Errorf("--replica %d: the run has %d replicas, 0 to %d", replica, info.Replicas, info.Replicas-1)
			}
			// Replica 0's logs are ReadRun's; the others' are needed for the
			// summary, and another replica's when asked for.
			replicas, replicasErr := profile.ReadReplicas(args[0], info)
			if replica > 0 {
				if replicasErr != nil {
					return replicasErr
				}
				events, info.Clocks = replicas[replica].Events, replicas[replica].Clocks
			}
			// The ranges asked for, checked before anything is printed or
			// written.
			lo, hi, n := profile.StepRange(events)
			if n == 0 {
				return fmt.Errorf("profile: %s: the event logs hold no actions", args[0])
			}
			logged := fmt.Sprintf("the run logged %d steps, %d to %d", n, lo, hi)
			if n == 1 {
				logged = fmt.Sprintf("the run logged 1 step, step %d", lo)
			}
			if skip < 0 || skip >= n {
				if skip < 0 || cmd.Flags().Changed("skip") {
					return fmt.Errorf("--skip %d leaves no step to analyse: %s (--skip 0 to %d)", skip, logged, n-1)
				}
				skip = n - 1 // the default warm-up on a run of one step: analyse that step
			}
			if cmd.Flags().Changed("first-step") && (first < lo || first > hi) {
				return fmt.Errorf("--first-step %d is outside the run: %s", first, logged)
			}
			if shown < 1 {
				return fmt.Errorf("--chart-steps %d: show at least 1 step", shown)
			}

			r, err := profile.Analyse(info, events, skip)
			if err != nil {
				return err
			}
			r.Replica = replica
			switch {
			case replicasErr != nil:
				r.ReplicasErr = replicasErr
			case replicas != nil:
				r.ReplicasErr = r.AddReplicas(replicas)
			}
			if info.ParameterServers > 0 {
				r.ServersErr = addParameterServers(r, args[0], info, events, replicas, replicasErr)
			}
			if !cmd.Flags().Changed("first-step") {
				first = r.Steps[0].Step
			}
			from, to, err := profile.ShownSteps(events, first, shown)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := r.Write(out, profile.Options{Steps: steps}); err != nil {
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
				if from == to {
					fmt.Fprintf(out, "wrote %s (step %d)\n", path, from)
				} else {
					fmt.Fprintf(out, "wrote %s (steps %d to %d)\n", path, from, to)
				}
				return nil
			}
			clocks := profile.ChartOptions{Clocks: info.Clocks, Placement: profile.RunPlacement(info)} // aligned and paired as the report's
			chart, err := profile.Chart(events, from, to-from+1, clocks)
			if err != nil {
				return err
			}
			if err := write(trace, func(w io.Writer) error { return profile.WriteTrace(w, events, from, to-from+1, clocks) }); err != nil {
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
	c.Flags().IntVar(&first, "first-step", 0, "first step shown in the pictures, numbered from 1 as in the training log (default: the first step after --skip)")
	c.Flags().IntVar(&shown, "chart-steps", profile.DefaultChartSteps, "steps shown in the pictures (fewer when the run ends first)")
	c.Flags().IntVar(&replica, "replica", 0, "with data-parallel replicas, the replica whose pipeline the tables and pictures show")
	return c
}

// addParameterServers adds the workers' pushes and pulls and the servers'
// work to r (a run with parameter servers), or says why it cannot: the
// workers are the replicas (replica 0's events alone without others).
func addParameterServers(r *profile.Report, dir string, info profile.RunInfo, events [][]profile.Event, replicas []profile.Replica, replicasErr error) error {
	if replicasErr != nil {
		return replicasErr
	}
	servers, err := profile.ReadServers(dir, info)
	if err != nil {
		return err
	}
	if replicas == nil {
		replicas = []profile.Replica{{Events: events}}
	}
	r.AddParameterServers(replicas, servers)
	return nil
}
