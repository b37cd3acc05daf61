package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
)

// The target is a schedule efficiency of pipelineTarget for 1F1B at p = 4,
// m = pipelineMicro, on the benchmark model's configs.
const (
	pipelineTarget      = 0.9
	pipelineMicro       = 8
	pipelinePlain       = "configs/bench-mlp-4stage.yaml"
	pipelineInterleaved = "configs/bench-mlp-interleaved.yaml"
	// pipelineDedicated is the same MLP with one more hidden layer, which
	// balances it on 2 stages, pinned one per core: on a 2-core machine the
	// only p at which each stage owns its compute, as the simulator assumes.
	pipelineDedicated = "configs/bench-mlp-2stage-pinned.yaml"
	dedicatedRow      = "1f1b, p = 2, a core each"
)

// pipelineRun is what one `launch` of a schedule gave.
type pipelineRun struct {
	stepMS     float64 // median wall time of a step on the last stage
	windowMS   float64 // median pipeline window (first forward to last backward, any stage)
	makespanMS float64 // simulated, the run's own (median) action costs, free transfers
	withLinkMS float64 // simulated with the run's measured mean link delay
	busyMS     float64 // compute per step summed over stages (F, B, W and optimizer)
}

func runPipeline(o *options, b *bytes.Buffer) error {
	names := []string{"gpipe", "1f1b", "zb-h1", "interleaved"}
	runs := map[string][]pipelineRun{}
	var stagesN, threads int
	// Repetitions are the outer loop, so slow drift of the machine touches every
	// schedule alike.
	for rep := range o.runReps {
		for _, name := range names {
			base := pipelinePlain
			if name == "interleaved" {
				base = pipelineInterleaved
			}
			r, cfg, err := pipelineOnce(o, runConfig{base: base, schedule: name, micro: pipelineMicro, steps: o.pipeSteps})
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			stagesN, threads = len(cfg.Stages), cfg.Threads(0)
			runs[name] = append(runs[name], r)
			logf("pipeline rep %d %-11s step %.1f ms, window %.1f ms, simulated %.1f ms: efficiency %.2f", rep+1, name, r.stepMS, r.windowMS, r.makespanMS, r.makespanMS/r.stepMS)
		}
		if runtime.NumCPU() >= 2 {
			r, _, err := pipelineOnce(o, runConfig{base: pipelineDedicated, schedule: "1f1b", micro: pipelineMicro, steps: o.pipeSteps})
			if err != nil {
				return fmt.Errorf("%s: %w", dedicatedRow, err)
			}
			runs[dedicatedRow] = append(runs[dedicatedRow], r)
			logf("pipeline rep %d %s: step %.1f ms, simulated %.1f ms: efficiency %.2f", rep+1, dedicatedRow, r.stepMS, r.makespanMS, r.makespanMS/r.stepMS)
		}
	}
	cores := runtime.NumCPU()
	fmt.Fprintf(b, "Real training runs: `pipetrain launch` of `%s` (gpipe, 1f1b, zb-h1) and `%s` (interleaved, 2 chunks per stage), "+
		"p = %d stage processes talking gRPC on loopback, %d BLAS thread(s) each, m = %d micro-batches, %d steps per run, evaluation and checkpoints off, "+
		"each config copied with fresh ports; %d run(s) per schedule, medians.\n\n", pipelinePlain, pipelineInterleaved, stagesN, threads, pipelineMicro, o.pipeSteps, o.runReps)
	fmt.Fprintf(b, "- **simulated makespan**: `schedule.Simulate` of the run's schedule with that run's own action costs per stage "+
		"(the median duration of each kind of action after the first %d steps, as `profile.MeanCosts` but with medians, through `profile.ScheduleCosts`) and free transfers: "+
		"the step the schedule allows if the stages computed exactly that fast and messages took no time;\n", o.skip)
	fmt.Fprintf(b, "- **step time**: median wall time of a step on the last stage (`metrics.jsonl`), optimizer and data included;\n")
	fmt.Fprintf(b, "- **schedule efficiency** = simulated makespan / step time, per run, then the median; the *window* variant divides by the pipeline window instead "+
		"(first forward to last backward on any stage, `profile.Analyse`), which leaves the optimizer step out;\n")
	fmt.Fprintf(b, "- **with measured link delay**: the same simulation with the run's measured mean message delay (`Report.MeanTransfer`) as the transfer time;\n")
	fmt.Fprintf(b, "- **core load** = the median over steps of the compute of all stages in a step (forward, backward, weight, optimizer; wall-clock) / (%d cores × step time): "+
		"near 100%% the cores, not the schedule, set the pace.\n\n", cores)
	fmt.Fprintf(b, "| schedule | step time | simulated makespan | with measured link delay | schedule efficiency | target | met? | efficiency (window) | core load |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|\n")
	eff := map[string]float64{}
	load := map[string]float64{}
	rows := names
	if len(runs[dedicatedRow]) > 0 {
		rows = append(append([]string{}, names...), dedicatedRow)
	}
	for _, name := range rows {
		var step, mk, link, e, ew, cl []float64
		for _, r := range runs[name] {
			step, mk, link = append(step, r.stepMS), append(mk, r.makespanMS), append(link, r.withLinkMS)
			e, ew = append(e, r.makespanMS/r.stepMS), append(ew, r.makespanMS/r.windowMS)
			cl = append(cl, r.busyMS/(float64(cores)*r.stepMS))
		}
		eff[name], load[name] = stats.Median(e), stats.Median(cl)
		target, met := "", ""
		if name == "1f1b" {
			target, met = fmt.Sprintf("≥ %.1f", pipelineTarget), yesNo(eff[name] >= pipelineTarget)
		}
		fmt.Fprintf(b, "| %s | %.1f ms | %.1f ms | %.1f ms | %.2f | %s | %s | %.2f | %s |\n",
			name, stats.Median(step), stats.Median(mk), stats.Median(link), eff[name], target, met, stats.Median(ew), pct(load[name]))
	}

	targets = append(targets, targetResult{fmt.Sprintf("schedule efficiency, 1F1B at p = %d, m = %d", stagesN, pipelineMicro), fmt.Sprintf("≥ %.1f", pipelineTarget),
		fmt.Sprintf("%.2f (%d stage processes on %d cores)", eff["1f1b"], stagesN, cores), eff["1f1b"] >= pipelineTarget})
	fmt.Fprintf(b, "\nThis machine has %d cores and each run has %d stage processes", cores, stagesN)
	if cores < stagesN {
		fmt.Fprintf(b, ", so the stages take turns on the cores: at most %d of them compute at once, where the simulator lets all %d do so. "+
			"Efficiency on this machine is therefore expected to be low, and it says more about the machine than about the schedule. "+
			"The action costs the simulator is given are wall-clock times measured while the stages shared the cores, so they include time spent waiting for a core; "+
			"the simulator sees %d slow stages rather than %d stages sharing %d cores. ", cores, stagesN, stagesN, stagesN, cores)
	} else {
		fmt.Fprintf(b, ", so each stage can have a core of its own. ")
	}
	fmt.Fprintf(b, "1F1B's efficiency is %.2f against the %.1f target (%s), with a core load of %s. ",
		eff["1f1b"], pipelineTarget, map[bool]string{true: "met", false: "missed"}[eff["1f1b"] >= pipelineTarget], pct(load["1f1b"]))
	switch l := load["1f1b"]; {
	case l > 1.05:
		fmt.Fprintf(b, "A core load above 100%% means the stages' actions overlap in time more than %d cores allow, i.e. their measured durations include waiting for a core: "+
			"the cores, not the schedule, set the pace. ", cores)
	case l >= 0.85:
		fmt.Fprintf(b, "With the cores that busy, no schedule could shorten the step by much: the cores, not the schedule, set the pace. ")
	default:
		fmt.Fprintf(b, "The cores are not saturated, so the gap to the simulated makespan is the runtime's own: message latency, hand-offs between actions, and the optimizer step. ")
	}
	best, worst := names[0], names[0]
	for _, n := range names {
		if eff[n] > eff[best] {
			best = n
		}
		if eff[n] < eff[worst] {
			worst = n
		}
	}
	fmt.Fprintf(b, "Across schedules efficiency runs from %.2f (%s) to %.2f (%s)", eff[worst], worst, eff[best], best)
	plain := min(eff["gpipe"], eff["1f1b"]) - 0.02 // clearly below both plain schedules
	if bubbleFillers := eff["zb-h1"] < plain && eff["interleaved"] < plain; bubbleFillers && cores < stagesN {
		fmt.Fprintf(b, "; the schedules that promise the most (zero-bubble and interleaved, which fill bubbles with work) fall furthest short, "+
			"since the idle time they fill on paper is, here, time another stage already uses the core for")
	}
	fmt.Fprintf(b, ". ")
	fast, slow := names[0], names[0]
	steps := map[string]float64{}
	for _, n := range names {
		var xs []float64
		for _, r := range runs[n] {
			xs = append(xs, r.stepMS)
		}
		steps[n] = stats.Median(xs)
		if steps[n] < steps[fast] {
			fast = n
		}
		if steps[n] > steps[slow] {
			slow = n
		}
	}
	fmt.Fprintf(b, "Efficiency is not speed: the fastest step is %s's (%.1f ms), the slowest %s's (%.1f ms).", fast, steps[fast], slow, steps[slow])
	if d, ok := eff[dedicatedRow]; ok {
		fmt.Fprintf(b, " The last row is the same MLP with one more hidden layer (which balances it on 2 stages) and 1F1B on 2 stages pinned one per core (`%s`), the only p at which every stage owns a core here: "+
			"efficiency %.2f with a core load of %s, which is what the schedule and runtime achieve when the simulator's assumption holds; "+
			"the target's p = 4 needs 4 cores (or devices).", pipelineDedicated, d, pct(load[dedicatedRow]))
	}
	fmt.Fprintf(b, "\n")
	return nil
}

// pipelineOnce launches one run and measures it.
func pipelineOnce(o *options, rc runConfig) (pipelineRun, *configs.Config, error) {
	var r pipelineRun
	dir, cfgPath, err := pipetrain(o, "launch", rc)
	if err != nil {
		return r, nil, err
	}
	defer os.RemoveAll(dir)
	runDir := filepath.Join(dir, "run")
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return r, nil, err
	}
	info, events, err := profile.ReadRun(runDir)
	if err != nil {
		return r, nil, err
	}
	rep, err := profile.Analyse(info, events, o.skip)
	if err != nil {
		return r, nil, err
	}
	sched, err := cfg.BuildSchedule()
	if err != nil {
		return r, nil, err
	}
	costs := medianCosts(events, o.skip)
	tl, err := schedule.Simulate(sched, profile.ScheduleCosts(costs, info.Chunks, 0))
	if err != nil {
		return r, nil, err
	}
	r.makespanMS = tl.Makespan
	r.withLinkMS = tl.Makespan
	if d, ok := rep.MeanTransfer(); ok {
		if tl2, err := schedule.Simulate(sched, profile.ScheduleCosts(costs, info.Chunks, float64(d)/1e6)); err == nil {
			r.withLinkMS = tl2.Makespan
		}
	}
	steps, _, err := stepTimes(runDir, cfg.Data.BatchSize, o.skip)
	if err != nil {
		return r, nil, err
	}
	r.stepMS = stats.Median(steps)
	r.windowMS = float64(rep.MedianStep) / float64(time.Millisecond)
	r.busyMS = medianBusy(events, o.skip)
	return r, cfg, nil
}

// medianCosts is profile.MeanCosts with medians: each stage's median action
// duration by kind over the steps after skip. A few actions stretched by a
// descheduled process move a mean far more than the median step time, so the
// simulated makespan is built from medians too.
func medianCosts(events [][]profile.Event, skip int) []profile.ActionCosts {
	out := make([]profile.ActionCosts, len(events))
	for s, evs := range events {
		by := map[string][]float64{}
		for _, e := range evs {
			if e.Step >= skip {
				by[e.Kind] = append(by[e.Kind], float64(e.EndNS-e.StartNS))
			}
		}
		med := func(k string) time.Duration {
			if len(by[k]) == 0 {
				return 0
			}
			return time.Duration(stats.Median(by[k]))
		}
		out[s] = profile.ActionCosts{F: med(profile.Forward), B: med(profile.Backward), I: med(profile.Input), W: med(profile.Weight)}
		if out[s].B == 0 && out[s].I > 0 {
			out[s].B = out[s].I + out[s].W
		}
	}
	return out
}

// medianBusy is the median over steps after skip of the compute time of all
// stages in a step (every action, the optimizer included), in ms.
func medianBusy(events [][]profile.Event, skip int) float64 {
	perStep := map[int]float64{}
	for _, evs := range events {
		for _, e := range evs {
			if e.Step >= skip {
				perStep[e.Step] += float64(e.EndNS-e.StartNS) / 1e6
			}
		}
	}
	var xs []float64
	for _, v := range perStep {
		xs = append(xs, v)
	}
	return stats.Median(xs)
}
