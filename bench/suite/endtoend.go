package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
)

// The demo model: `make demo` trains configs/fmnist-mlp-4stage.yaml.
const (
	demoConfig = "configs/fmnist-mlp-4stage.yaml"
	wideConfig = "configs/fmnist-mlp-2stage.yaml"
)

type e2eCase struct {
	label string
	rc    runConfig // launched, and run by the reference
	model *models.Model
	parts []string // each stage's layers
}

type e2eResult struct {
	launch, ref  []float64 // samples/s per repetition
	stageThreads []int     // BLAS threads of each stage process
	refThreads   int       // BLAS threads of the reference
}

func runEndToEnd(o *options, b *bytes.Buffer) error {
	demo, err := configs.Load(demoConfig)
	if err != nil {
		return err
	}
	model, err := models.Build(demo.Model)
	if err != nil {
		return err
	}
	n := len(model.Layers)
	wide, err := configs.Load(wideConfig)
	if err != nil {
		return err
	}
	wideModel, err := models.Build(wide.Model)
	if err != nil {
		return err
	}
	asIs := func(c *configs.Config) []string {
		var out []string
		for _, st := range c.Stages {
			out = append(out, st.Layers...)
		}
		return out
	}
	one := []string{layerRange(0, n)}
	cases := []e2eCase{
		{fmt.Sprintf("demo model, 1 stage (layers %s)", one[0]), runConfig{base: demoConfig, steps: o.e2eSteps, layers: one}, model, one},
	}
	if n >= 2 {
		two := balancedSplit(model, 2)
		cases = append(cases, e2eCase{fmt.Sprintf("demo model, 2 stages (layers %s)", strings.Join(two, " + ")), runConfig{base: demoConfig, steps: o.e2eSteps, layers: two}, model, two})
	}
	cases = append(cases,
		e2eCase{fmt.Sprintf("demo model, %d stages (`%s` as is)", len(demo.Stages), filepath.Base(demoConfig)), runConfig{base: demoConfig, steps: o.e2eSteps}, model, asIs(demo)},
		e2eCase{fmt.Sprintf("wider model, %d stages (`%s` as is)", len(wide.Stages), filepath.Base(wideConfig)), runConfig{base: wideConfig, steps: o.e2eSteps}, wideModel, asIs(wide)},
	)
	res := make([]e2eResult, len(cases))
	for rep := range o.runReps {
		for i, c := range cases {
			// The reference on the same config, right before the launch it is compared with.
			ref, cfg, err := samplesPerSec(o, "reference", c.rc)
			if err != nil {
				return fmt.Errorf("reference of %s: %w", c.label, err)
			}
			sps, _, err := samplesPerSec(o, "launch", c.rc)
			if err != nil {
				return fmt.Errorf("%s: %w", c.label, err)
			}
			res[i].launch, res[i].ref = append(res[i].launch, sps), append(res[i].ref, ref)
			res[i].refThreads, res[i].stageThreads = cfg.Threads(0), nil
			for s := range cfg.Stages {
				res[i].stageThreads = append(res[i].stageThreads, cfg.Threads(s))
			}
			logf("end to end rep %d: %s: launch %.0f samples/s, reference %.0f", rep+1, c.label, sps, ref)
		}
	}

	cores := runtime.NumCPU()
	fmt.Fprintf(b, "Samples per second of `pipetrain launch` (one process per stage, gRPC on loopback) against `pipetrain reference` "+
		"(the same model and batch in one process, no pipeline) on the same config, %d steps per run, the first %d left out, evaluation and checkpoints off, "+
		"`compute.blas_threads` as the configs leave it (0: each process gets its share of the %d cores, the reference counting as stage 0). "+
		"A run's samples/s is the batch over its median step time (`metrics.jsonl` of the last stage); %d repetition(s), each a reference run then a launch, "+
		"medians, the ratio taken per repetition. ", o.e2eSteps, o.skip, cores, o.runReps)
	fmt.Fprintf(b, "The demo model is `%s` (%s, batch %d in %d micro-batches, %s); the 1- and 2-stage configs are derived from it, "+
		"the 2-stage split balancing the layers' multiply-adds. `%s` is a wider model (%s, %s schedule) shown as shipped.\n\n",
		demoConfig, describeModel(model), demo.Data.BatchSize, demo.Data.MicroBatches, demo.Schedule, wideConfig, describeSpec(wide.Model), wide.Schedule)
	fmt.Fprintf(b, "The ceiling is the most the split allows against the reference, were BLAS threads to scale linearly: "+
		"min(stages, total multiply-adds / the largest stage's, %d cores / the reference's threads), leaving out the bubble, the transfers and the runtime's own costs; "+
		"of ceiling is launch / reference over it.\n\n", cores)
	fmt.Fprintf(b, "| run | BLAS threads: stage / reference | launch samples/s | reference samples/s | launch / reference | ceiling | of ceiling |\n|---|---|---|---|---|---|---|\n")
	ratios := make([]float64, len(cases))
	ceil := make([]float64, len(cases))
	for i, c := range cases {
		var rs []float64
		for j := range res[i].launch {
			rs = append(rs, res[i].launch[j]/res[i].ref[j])
		}
		ratios[i] = stats.Median(rs)
		ceil[i] = ceiling(c.model, c.parts, float64(cores)/float64(max(1, res[i].refThreads)))
		fmt.Fprintf(b, "| %s | %s / %d | %.0f (±%.0f%%) | %.0f (±%.0f%%) | %.2f× | %.2f× | %s |\n", c.label, threadList(res[i].stageThreads), res[i].refThreads,
			stats.Median(res[i].launch), 50*spread(res[i].launch), stats.Median(res[i].ref), 50*spread(res[i].ref), ratios[i], ceil[i], pct(ratios[i]/ceil[i]))
	}
	fmt.Fprintf(b, "\nOne stage under `launch` runs at %.2f× the reference: ", ratios[0])
	switch {
	case ratios[0] > 1.1:
		fmt.Fprintf(b, "faster than the reference, though both run the same computation in one process, which only run-to-run noise explains; "+
			"the other ratios carry that much doubt too. ")
	case ratios[0] >= 0.9:
		fmt.Fprintf(b, "the stage runtime (schedule interpreter, event log, metrics) costs little by itself. ")
	default:
		fmt.Fprintf(b, "the stage runtime (schedule interpreter, event log, metrics, per-micro-batch copies) costs %s of a step even with no link to cross. ", pct(1-ratios[0]))
	}
	w := len(cases) - 1
	var parts []string
	for i := 1; i < w; i++ {
		parts = append(parts, fmt.Sprintf("%.2f× with %d stages (%s of its %.2f× ceiling)", ratios[i], len(cases[i].parts), pct(ratios[i]/ceil[i]), ceil[i]))
	}
	// The demo config's own reference step.
	refStep := float64(demo.Data.BatchSize) / stats.Median(res[len(cases)-2].ref) * 1e3
	perAction := refStep / float64(demo.Data.MicroBatches) / float64(len(demo.Stages))
	fmt.Fprintf(b, "The demo model reaches %s. Its reference step takes %.1f ms on %d thread(s), so with %d micro-batches over %d stages one stage's forward and backward of a micro-batch "+
		"are worth about %.2f ms of compute together, ", strings.Join(parts, " and "), refStep, res[len(cases)-2].refThreads, demo.Data.MicroBatches, len(demo.Stages), perAction)
	best, bestFrac := 0.0, 0.0
	for i := 1; i < w; i++ {
		best, bestFrac = max(best, ratios[i]), max(bestFrac, ratios[i]/ceil[i])
	}
	switch {
	case best < 0.95:
		fmt.Fprintf(b, "small against the fixed cost of each action and message: on this model pipelining does not pay on this machine. ")
	case best <= 1.05:
		fmt.Fprintf(b, "about what the actions and messages cost: at best pipelining breaks even on this model here (%.2f×). ", best)
	default:
		fmt.Fprintf(b, "enough to pay for the messages: pipelining gains %.2f× here. ", best)
	}
	wideRef := float64(wide.Data.BatchSize) / stats.Median(res[w].ref) * 1e3
	fmt.Fprintf(b, "The wider model (reference step %.1f ms on %d thread(s), about %.1f times the compute per action) reaches %.2f× with %d stages, %s of a %.2f× ceiling: ",
		wideRef, res[w].refThreads, wideRef/float64(wide.Data.MicroBatches)/float64(len(wide.Stages))/perAction, ratios[w], len(cases[w].parts), pct(ratios[w]/ceil[w]), ceil[w])
	if ceil[w] < 1.25 {
		fmt.Fprintf(b, "its shipped split puts most of the multiply-adds on one stage, so there is little to gain however cheap the messages. ")
	} else {
		fmt.Fprintf(b, "its split leaves room to gain. ")
	}
	if ratios[w]/ceil[w] > bestFrac {
		fmt.Fprintf(b, "The more compute each message carries, the closer a pipeline gets to its ceiling.")
	}
	fmt.Fprintf(b, "\n")
	return nil
}

func threadList(ts []int) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprint(t)
	}
	return strings.Join(parts, "+")
}

// samplesPerSec runs command for rc and returns its samples/s, the batch over the
// median step time after skip (a median, so that a step stretched by another
// process on the machine does not move it), and the derived config it ran.
func samplesPerSec(o *options, command string, rc runConfig) (float64, *configs.Config, error) {
	dir, cfgPath, err := pipetrain(o, command, rc)
	if err != nil {
		return 0, nil, err
	}
	defer os.RemoveAll(dir)
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return 0, nil, err
	}
	ms, _, err := stepTimes(filepath.Join(dir, "run"), cfg.Data.BatchSize, o.skip)
	if err != nil {
		return 0, nil, err
	}
	return float64(cfg.Data.BatchSize) / stats.Median(ms) * 1e3, cfg, nil
}

// balancedSplit cuts the model's layers into p contiguous ranges minimising the
// largest range's multiply-adds (Dense layers: In·Out; other layers count 1).
func balancedSplit(m *models.Model, p int) []string {
	n := len(m.Layers)
	cost := layerCosts(m)
	if p == 2 {
		best, cut := -1.0, 1
		for c := 1; c < n; c++ {
			var a, z float64
			for i := range n {
				if i < c {
					a += cost[i]
				} else {
					z += cost[i]
				}
			}
			if worst := max(a, z); best < 0 || worst < best {
				best, cut = worst, c
			}
		}
		return []string{layerRange(0, cut), layerRange(cut, n)}
	}
	// Equal layer counts otherwise.
	var out []string
	for s := range p {
		out = append(out, layerRange(s*n/p, (s+1)*n/p))
	}
	return out
}

func layerRange(first, end int) string {
	if end-first == 1 {
		return fmt.Sprint(first)
	}
	return fmt.Sprintf("%d-%d", first, end-1)
}

func describeModel(m *models.Model) string { return describeSpec(m.Spec) }

func describeSpec(s models.Spec) string {
	widths := append(append([]int{s.Input}, s.Hidden...), s.Classes)
	parts := make([]string, len(widths))
	for i, w := range widths {
		parts[i] = fmt.Sprint(w)
	}
	return fmt.Sprintf("%s %s", s.Name, strings.Join(parts, "→"))
}

// ceiling is the best speed-up over the reference that a split of m into stages
// (layer ranges) allows: the total multiply-adds over the largest stage's, at
// most the stage count and at most coreRatio, the cores over the reference's
// BLAS threads. Bubble, transfers and runtime costs are left out.
func ceiling(m *models.Model, parts []string, coreRatio float64) float64 {
	cost := layerCosts(m)
	var total, largest float64
	for _, p := range parts {
		first, last, err := configs.ParseLayers(p)
		if err != nil {
			return math.NaN()
		}
		var c float64
		for l := first; l <= last && l < len(cost); l++ {
			c += cost[l]
		}
		total += c
		largest = max(largest, c)
	}
	return min(float64(len(parts)), total/largest, coreRatio)
}

// layerCosts are the layers' multiply-adds per example (Dense: In·Out; other layers 1).
func layerCosts(m *models.Model) []float64 {
	cost := make([]float64, len(m.Layers))
	for i, l := range m.Layers {
		cost[i] = 1
		if d, ok := l.(*models.Dense); ok {
			cost[i] = float64(d.In * d.Out)
		}
	}
	return cost
}
