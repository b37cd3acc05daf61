package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/plan"
)

func planCmd() *cobra.Command {
	var path, out, memory, schedules string
	var nStages, reps, micro int
	var force bool
	c := &cobra.Command{
		Use:   "plan --config FILE [--stages N] [--memory-limit BYTES]",
		Short: "Measure each layer here and choose stage boundaries, schedule and micro-batches that minimise the simulated step time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configs.Load(path)
			if err != nil {
				return err
			}
			if cfg.VirtualStages > 1 {
				return fmt.Errorf("%s: plan splits plain pipelines; this config uses virtual stages", cfg.Path)
			}
			limit, err := parseBytes(memory)
			if err != nil {
				return fmt.Errorf("--memory-limit: %w", err)
			}
			if nStages == 0 {
				nStages = len(cfg.Stages)
			}
			if out == "" {
				out = strings.TrimSuffix(cfg.Path, filepath.Ext(cfg.Path)) + "-planned.yaml"
			}
			// Checked before measuring: a config the user edited by hand
			// since the last plan is not overwritten unless asked.
			if _, err := os.Stat(out); err == nil && !force {
				return fmt.Errorf("--out %s exists; --force replaces it", out)
			}
			fmt.Printf("pipetrain plan: measuring each layer of %s at micro-batch %d (median of %d)...\n", cfg.Path, cfg.MicroBatchSize(), reps)
			layerCosts, err := engine.MeasureLayers(cfg.Model, cfg.MicroBatchSize(), cfg.Train.Seed, reps)
			if err != nil {
				return err
			}
			model, err := models.Build(cfg.Model)
			if err != nil {
				return err
			}
			names := strings.Split(schedules, ",")
			if !splittable(model) {
				// Zero-bubble schedules need layers that split their backward.
				names = slices.DeleteFunc(names, func(n string) bool { return n == "zb-h1" })
			}
			prob := plan.Problem{
				Stages: nStages, Batch: cfg.Data.BatchSize, MicroBatch: cfg.MicroBatchSize(), OverheadMS: 0.05,
				Schedules: names, MemoryLimit: limit,
				TransferBytesPerMS: 2e6, LatencyMS: 0.1,
			}
			if micro > 0 {
				if cfg.Data.BatchSize%micro != 0 {
					return fmt.Errorf("--micro-batches %d does not divide data.batch_size %d", micro, cfg.Data.BatchSize)
				}
				prob.MicroBatches = micro
			}
			for m := 1; micro == 0 && m <= cfg.Data.BatchSize && m <= 64; m *= 2 {
				if cfg.Data.BatchSize%m == 0 {
					prob.Candidates = append(prob.Candidates, m)
				}
			}
			for i, lc := range layerCosts {
				prob.Layers = append(prob.Layers, plan.Layer{Name: model.Layers[i].Name(), F: ms(lc.F), B: ms(lc.B), I: ms(lc.I), W: ms(lc.W),
					ActBytes: lc.StashBytes, ParamBytes: lc.ParamBytes, OutBytes: lc.OutBytes})
				fmt.Printf("  layer %d %-6s F %.3f ms  B %.3f ms  activations %s  parameters+state %s\n", i, model.Layers[i].Name(), ms(lc.F), ms(lc.B), human(lc.StashBytes), human(lc.ParamBytes))
			}
			best, err := plan.Solve(prob)
			if err != nil {
				return err
			}
			fmt.Printf("\nplan: %s\n", describe(best, len(prob.Layers)))
			if len(cfg.Stages) == nStages {
				var bounds []int
				for i := range cfg.Stages {
					first, _ := cfg.ChunkLayers(i, 0)
					bounds = append(bounds, first)
				}
				cur, err := plan.Evaluate(prob, bounds, cfg.Schedule, cfg.Data.MicroBatches)
				if err != nil {
					return fmt.Errorf("evaluating the current split: %w", err)
				}
				fmt.Printf("now:  %s\n", describe(cur, len(prob.Layers)))
				fmt.Printf("predicted speedup over the given config: %.2fx\n", cur.StepMS/best.StepMS)
			}
			if err := writePlannedConfig(cfg, best, len(prob.Layers), out); err != nil {
				return err
			}
			fmt.Printf("wrote %s\n", out)
			return nil
		},
	}
	c.Flags().StringVarP(&path, "config", "c", "", "config to plan for (model, data and addresses come from it)")
	c.Flags().IntVar(&nStages, "stages", 0, "number of stages (default: as many as the config has)")
	c.Flags().StringVar(&memory, "memory-limit", "", "bytes per stage for parameters, optimizer state and stashed activations (e.g. 512MiB); default none")
	c.Flags().StringVar(&schedules, "schedules", "1f1b,zb-h1,gpipe", "schedules to consider")
	c.Flags().StringVar(&out, "out", "", "where to write the new config (default: CONFIG-planned.yaml)")
	c.Flags().BoolVar(&force, "force", false, "replace the output file if it exists")
	c.Flags().IntVar(&reps, "reps", 5, "measurements per layer (the median is used)")
	c.Flags().IntVar(&micro, "micro-batches", 0, "keep this micro-batch count instead of choosing one (powers of two up to 64 that divide the batch)")
	c.MarkFlagRequired("config")
	return c
}

func describe(p *plan.Plan, layers int) string {
	var ranges []string
	for i, b := range p.Boundaries {
		end := layers
		if i+1 < len(p.Boundaries) {
			end = p.Boundaries[i+1]
		}
		ranges = append(ranges, layerRange(b, end-1))
	}
	var mean float64
	for _, b := range p.Bubble {
		mean += b / float64(len(p.Bubble))
	}
	return fmt.Sprintf("layers %s, %s, %d micro-batches: step %.2f ms, mean bubble %.1f%%", strings.Join(ranges, " | "), p.Schedule, p.MicroBatches, p.StepMS, 100*mean)
}

func layerRange(a, b int) string {
	if a == b {
		return strconv.Itoa(a)
	}
	return fmt.Sprintf("%d-%d", a, b)
}

// writePlannedConfig rewrites the config's YAML with the plan's stages, schedule and
// micro-batches, keeping everything else. Stages beyond the config's get the last
// stage's host with the following ports.
func writePlannedConfig(cfg *configs.Config, p *plan.Plan, layers int, out string) error {
	raw, err := os.ReadFile(cfg.Path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("%s: %w", cfg.Path, err)
	}
	old, _ := doc["stages"].([]any)
	var stagesOut []map[string]any
	for i, b := range p.Boundaries {
		end := layers
		if i+1 < len(p.Boundaries) {
			end = p.Boundaries[i+1]
		}
		st := map[string]any{}
		if i < len(old) {
			// Keep the stage's other settings (device, cpus, metrics address).
			if m, ok := old[i].(map[string]any); ok {
				for k, v := range m {
					st[k] = v
				}
			}
		} else {
			st["address"] = nextAddress(cfg.Stages[len(cfg.Stages)-1].Address, i-len(cfg.Stages)+1)
		}
		st["layers"] = layerRange(b, end-1)
		stagesOut = append(stagesOut, st)
	}
	doc["stages"] = stagesOut
	doc["schedule"] = p.Schedule
	data, _ := doc["data"].(map[string]any)
	if data == nil {
		data = map[string]any{}
	}
	data["micro_batches"] = p.MicroBatches
	doc["data"] = data
	if name, ok := doc["name"].(string); ok {
		doc["name"] = name + "-planned"
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Written by pipetrain plan from %s on %s: %s\n", cfg.Path, time.Now().Format("2006-01-02"), describe(p, layers))
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	if err := checkpoint.WriteAtomic(out, func(w io.Writer) error { _, err := w.Write(buf.Bytes()); return err }); err != nil {
		return err
	}
	if _, err := configs.Load(out); err != nil {
		return fmt.Errorf("the planned config does not validate: %w", err)
	}
	return nil
}

func nextAddress(addr string, k int) string {
	host, port, _ := strings.Cut(addr, ":")
	n, _ := strconv.Atoi(port)
	return fmt.Sprintf("%s:%d", host, n+k)
}

// parseBytes reads "123", "512MiB", "2GiB", "1.5GB".
func parseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := 1.0
	num := strings.TrimSpace(s)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			mult, num = u.mult, strings.TrimSpace(strings.TrimSuffix(num, u.suffix))
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a size like 512MiB or 2GiB", s)
	}
	return int64(v * mult), nil
}

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
}

// splittable reports whether every layer can split its backward (zero-bubble).
func splittable(m *models.Model) bool {
	for _, l := range m.Layers {
		if _, ok := l.(models.Splittable); !ok {
			return false
		}
	}
	return true
}
