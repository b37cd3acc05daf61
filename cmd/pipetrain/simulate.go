package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
	"github.com/pipetrain/pipetrain/timeline"
)

func simulateCmd() *cobra.Command {
	var path, which, costsFrom, svg, scheduleFile string
	var transfer time.Duration
	var reps int
	c := &cobra.Command{
		Use:   "simulate --config FILE [--schedule all|NAME] [--costs measure|RUN_DIR|f=1,b=2,w=1]",
		Short: "Predict each schedule's makespan, bubble and stashed memory for a config, before launching anything",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configs.Load(path)
			if err != nil {
				return err
			}
			model, err := models.Build(cfg.Model)
			if err != nil {
				return err
			}
			costs, measuredTransfer, source, err := simulationCosts(cfg, costsFrom, reps)
			if err != nil {
				return err
			}
			if transfer < 0 && measuredTransfer > 0 {
				transfer = measuredTransfer
			}
			stash := stages.StashBytes(cfg, model)
			if transfer < 0 {
				transfer = stages.EstimateTransfer(cfg, model)
			}
			costs.Transfer = ms(transfer)
			fmt.Printf("%s: %d stages, %d micro-batches; costs per micro-batch (%s), transfer %.3f ms\n", cfg.Path, len(cfg.Stages), cfg.Data.MicroBatches, source, costs.Transfer)
			for s := range cfg.Stages {
				fmt.Printf("  stage %d  F %.3f ms  B %.3f ms  (I %.3f + W %.3f ms)\n", s, costs.F[s], costs.B[s], costs.I[s], costs.W[s])
			}
			var scheds []*schedule.Schedule
			if scheduleFile != "" {
				s, err := loadScheduleFile(scheduleFile)
				if err != nil {
					return err
				}
				scheds = append(scheds, s)
			} else {
				names := schedule.Names()
				if which != "all" {
					names = strings.Split(which, ",")
				}
				for _, name := range names {
					v := 1
					if name == "interleaved" {
						v = max(2, cfg.VirtualStages)
					}
					s, err := schedule.Build(name, len(cfg.Stages), cfg.Data.MicroBatches, v)
					if err != nil {
						fmt.Printf("\n%s: not applicable here: %v\n", name, err)
						continue
					}
					scheds = append(scheds, s)
				}
			}
			for _, s := range scheds {
				if err := simulateOne(os.Stdout, s, costs, stash, svg); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().StringVarP(&path, "config", "c", "", "run config (YAML)")
	c.Flags().StringVar(&which, "schedule", "all", "schedules to simulate: all, or names separated by commas")
	c.Flags().StringVar(&scheduleFile, "schedule-file", "", "simulate a schedule written by hand (.csv, .yaml or a grid as printed by the simulator), after checking it")
	c.Flags().StringVar(&costsFrom, "costs", "measure", "action costs: measure (time the config's stages here), a run directory (its events), or f=F,b=B[,w=W] in ms")
	c.Flags().DurationVar(&transfer, "transfer", -1, "time to move one activation between stages (default: a run's measured mean link delay with --costs RUN_DIR, else estimated from its size at 2 GB/s plus 100us)")
	c.Flags().IntVar(&reps, "reps", 5, "measurements per action when --costs measure (the median is used)")
	c.Flags().StringVar(&svg, "svg", "", "write each schedule's timeline as an SVG: FILE.svg gets the schedule name added before .svg")
	c.MarkFlagRequired("config")
	return c
}

// simulationCosts returns per-stage action costs in ms.
func simulationCosts(cfg *configs.Config, from string, reps int) (schedule.Costs, time.Duration, string, error) {
	p := len(cfg.Stages)
	c := schedule.Costs{F: make([]float64, p), B: make([]float64, p), I: make([]float64, p), W: make([]float64, p)}
	switch {
	case from == "measure":
		measured, err := stages.MeasureCosts(cfg, max(reps, 1))
		if err != nil {
			return c, 0, "", err
		}
		for s, chunks := range measured {
			for _, m := range chunks {
				c.F[s] += ms(m.F)
				c.B[s] += ms(m.B)
				c.I[s] += ms(m.I)
				c.W[s] += ms(m.W)
			}
		}
		return c, 0, fmt.Sprintf("measured on this machine, median of %d", reps), nil
	case strings.Contains(from, "="):
		u, err := parseUniform(from)
		if err != nil {
			return c, 0, "", err
		}
		for s := range c.F {
			c.F[s], c.B[s], c.I[s], c.W[s] = u[0], u[1], u[1]-u[2], u[2]
		}
		return c, 0, "given: " + from, nil
	default:
		info, events, err := profile.ReadRun(from)
		if err != nil {
			return c, 0, "", err
		}
		if info.Stages != p {
			return c, 0, "", fmt.Errorf("%s ran %d stages, %s has %d", from, info.Stages, cfg.Path, p)
		}
		var transfer time.Duration
		if rep, err := profile.Analyse(info, events, 1); err == nil {
			transfer, _ = rep.MeanTransfer()
		}
		c = profile.ScheduleCosts(profile.MeanCosts(events, 1), info.Chunks, 0)
		if c.I == nil { // the run did not split its backwards: assume half each
			c.I, c.W = make([]float64, p), make([]float64, p)
			for s := range c.B {
				c.I[s], c.W[s] = c.B[s]/2, c.B[s]/2
			}
		}
		return c, transfer, "from the events of " + from + " (transfer: its measured mean link delay)", nil
	}
}

func parseUniform(s string) ([3]float64, error) {
	var f, b, w float64 = 0, 0, -1
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || x < 0 {
			return [3]float64{}, fmt.Errorf("--costs %q: write f=F,b=B[,w=W] with non-negative ms", s)
		}
		switch strings.ToLower(k) {
		case "f":
			f = x
		case "b":
			b = x
		case "w":
			w = x
		default:
			return [3]float64{}, fmt.Errorf("--costs %q: unknown key %q (f, b, w)", s, k)
		}
	}
	if w < 0 {
		w = b / 2
	}
	if f <= 0 || b <= 0 || w > b {
		return [3]float64{}, fmt.Errorf("--costs %q: need f > 0, b > 0 and w <= b", s)
	}
	return [3]float64{f, b, w}, nil
}

func simulateOne(w io.Writer, s *schedule.Schedule, costs schedule.Costs, stash []int64, svg string) error {
	tl, err := schedule.Simulate(s, costs)
	if err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	name := s.Name
	if name == "" {
		name = "schedule from file"
	}
	if s.Chunks > 1 {
		name += fmt.Sprintf(" (%d chunks per stage)", s.Chunks)
	}
	var mean float64
	for _, b := range tl.Bubble {
		mean += b / float64(len(tl.Bubble))
	}
	theory := ""
	if t, ok := schedule.TheoreticalBubble(s.Name, s.Stages, s.MicroBatches, s.Chunks); ok {
		theory = fmt.Sprintf(", equal-stage theory %.1f%%", 100*t)
	}
	fmt.Fprintf(w, "\n%s: makespan %.2f ms, mean bubble %.1f%%%s\n", name, tl.Makespan, 100*mean, theory)
	chart := &timeline.Chart{Title: fmt.Sprintf("%s: simulated, makespan %.2f ms", name, tl.Makespan), Unit: "ms"}
	for st := range tl.Spans {
		fmt.Fprintf(w, "  stage %d  busy %8.2f ms  bubble %5.1f%%  peak stash %d micro-batches (%.2f MiB)\n",
			st, tl.Busy[st], 100*tl.Bubble[st], tl.PeakInFlight[st], float64(int64(tl.PeakInFlight[st])*stash[st])/(1<<20))
		row := timeline.Row{Name: fmt.Sprintf("stage %d", st), Note: fmt.Sprintf("bubble %.1f%%", 100*tl.Bubble[st])}
		for _, sp := range tl.Spans[st] {
			row.Spans = append(row.Spans, timeline.Span{Start: sp.Start, End: sp.End, Kind: timeline.Kind(sp.Action.Kind.String()), MicroBatch: sp.Action.MicroBatch, Chunk: sp.Action.Chunk})
		}
		chart.Rows = append(chart.Rows, row)
	}
	if err := chart.Text(w, 0, 100); err != nil {
		return err
	}
	if svg == "" {
		return nil
	}
	file := strings.TrimSuffix(svg, ".svg") + "-" + strings.ReplaceAll(s.Name, "/", "_") + ".svg"
	if s.Name == "" {
		file = svg
	}
	if dir := filepath.Dir(file); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := chart.SVG(f); err != nil {
		return err
	}
	fmt.Fprintf(w, "  timeline written to %s\n", file)
	return f.Close()
}

// loadScheduleFile reads a hand-written schedule and checks it before anything runs.
func loadScheduleFile(path string) (*schedule.Schedule, error) {
	s, err := schedule.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
