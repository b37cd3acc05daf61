// Command schedules benchmarks pipetrain's schedules on this machine. For each
// schedule and micro-batch count it launches real multi-process runs and reports
// the measured bubble beside the bubble the simulator predicts from that run's own
// action costs, and throughput relative to 1F1B measured in the same sweep. It
// writes a Markdown table (docs/schedules-benchmark.md by default).
//
//	go run ./bench/schedules -bin bin/pipetrain -out docs/schedules-benchmark.md
//
// -setups, -schedules and -micro-batches measure part of the sweep, such as one
// target's two rows with more repetitions; a partial sweep is printed, and
// written only where -out names a file, so the full report is not replaced by
// a part of it.
//
//	go run ./bench/schedules -setups pinned -schedules zb-v -recompute=false -micro-batches 4 -reps 9
package main

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/machine"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/stages"
)

type result struct {
	measured, simulated, steady, stepMS, memory, peakMiB []float64
}

// row is one schedule measured: a built-in, on a config of the setup, with
// every stage recomputing its forwards or not.
type row struct {
	name      string
	recompute bool
}

func (r row) String() string {
	if r.recompute {
		return r.name + ", recompute: full"
	}
	return r.name
}

// setup is one placement of the benchmark model.
type setup struct {
	key                            string // its name for -setups
	title, plain, interleaved, zbv string
	micros                         []int // micro-batch counts measured
	// pin: stage i runs pinned to CPU i (set here, so that the configs,
	// which name no cpus, validate on a machine with fewer cores); the
	// setup is left out, saying so, where the machine has fewer than stages.
	pin    bool
	stages int
}

var allSetups = []setup{
	{"shared", "4 stages sharing this machine's cores", "configs/bench-mlp-4stage.yaml", "configs/bench-mlp-interleaved.yaml", "configs/bench-mlp-zbv.yaml", []int{8, 16}, false, 4},
	// Two stages also at m = 4, where 1F1B's bubble is largest and the
	// zero-bubble schedules have the most to win.
	{"pinned", "2 stages, each pinned to its own core", "configs/bench-mlp-2stage-pinned.yaml", "configs/bench-mlp-2stage-pinned-interleaved.yaml", "configs/bench-mlp-2stage-pinned-zbv.yaml", []int{4, 8, 16}, false, 2},
	// p = 4 with a core per stage, on a machine with 4 or more.
	{"pinned4", "4 stages, each pinned to its own core", "configs/bench-mlp-4stage-pinned.yaml", "configs/bench-mlp-4stage-pinned-interleaved.yaml", "configs/bench-mlp-4stage-pinned-zbv.yaml", []int{8, 16}, true, 4},
}

var allRows = []row{{"gpipe", false}, {"1f1b", false}, {"interleaved", false}, {"zb-h1", false}, {"zb-v", false},
	{"interleaved-zb", false}, {"dualpipev", false}, {"gpipe", true}, {"1f1b", true}, {"zb-h1", true}}

func main() {
	bin := flag.String("bin", "bin/pipetrain", "pipetrain binary")
	out := flag.String("out", "docs/schedules-benchmark.md", "Markdown file to write")
	reps := flag.Int("reps", 3, "runs per schedule and micro-batch count (medians are reported)")
	steps := flag.Int("steps", 60, "training steps per run")
	skip := flag.Int("skip", 10, "warm-up steps left out of every figure")
	var sel selection
	flag.StringVar(&sel.setups, "setups", "", "setups to measure, comma-separated: shared, pinned, pinned4 (default: all; pinned4 runs only where the machine has a core per stage)")
	flag.StringVar(&sel.schedules, "schedules", "", "schedules to measure, comma-separated (default: every row; 1f1b is always measured, the baseline of the throughput column)")
	flag.BoolVar(&sel.recompute, "recompute", true, "measure the recompute: full rows of the chosen schedules")
	flag.StringVar(&sel.micros, "micro-batches", "", "micro-batch counts, comma-separated (default: each setup's own)")
	flag.Parse()

	setups, rows, err := sel.choose(allSetups, allRows)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schedules:", err)
		os.Exit(2)
	}
	if sel.partial() && !explicit("out") {
		*out = ""
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Schedules measured on this machine\n\n")
	fmt.Fprintf(&b, "Made by `make bench-schedules` (`go run ./bench/schedules`) on %s: %s, %d cores, %s, BLAS %s, 1 BLAS thread per stage.\n",
		time.Now().UTC().Format("2006-01-02"), machine.CPUModel(), runtime.NumCPU(), runtime.Version(), blas.Name())
	fmt.Fprintf(&b, "Each row: %d runs of %d steps of `pipetrain launch` (one process per stage, gRPC on loopback), the first %d steps of each left out; medians. Global batch 512.\n\n", *reps, *steps, *skip)
	fmt.Fprintf(&b, "- measured bubble: `pipetrain profile`'s mean over stages of idle / step window, the window running from a step's first forward to its last backward on any stage;\n")
	fmt.Fprintf(&b, "- simulated bubble: `pipetrain profile`'s `sim`: the schedule played by `schedule.Replay` once for each analysed step of the run, each action taking the time it took in that step, with the run's measured mean link delay as the transfer time and each stage's mean hand-off between actions; difference: measured minus simulated;\n")
	fmt.Fprintf(&b, "- at mean costs: the same schedule played by `schedule.Simulate` with every action at its mean cost (each chunk's own); what separates it from the simulated bubble is the spread of the action times (docs/profiling.md);\n")
	fmt.Fprintf(&b, "- step time: median of the last stage's per-step wall time; throughput relative to 1F1B at the same micro-batch count, from the same sweep;\n")
	fmt.Fprintf(&b, "- activations: each stage's peak activation memory in the run's events over run.json's prediction from the chunks' shapes (see docs/profiling.md), for the stage furthest from it; and the most any stage held, in MiB;\n")
	fmt.Fprintf(&b, "- `recompute: full` rows: the same config with every stage set to recompute its forwards (docs/schedules.md#activation-recomputation).\n")
	for _, su := range setups {
		if err := bench(&b, su, rows, *bin, *reps, *steps, *skip); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if *out == "" {
		fmt.Print(b.String())
		return
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(b.String())
}

func bench(b *bytes.Buffer, su setup, rows []row, bin string, reps, steps, skip int) error {
	if su.pin && runtime.NumCPU() < su.stages {
		fmt.Fprintf(b, "\n## %s\n\nNot run: this machine has %d cores, and each of the %d stages needs one of its own (`go run ./bench/schedules -setups %s` on a machine with %d or more).\n",
			su.title, runtime.NumCPU(), su.stages, su.key, su.stages)
		fmt.Fprintf(os.Stderr, "%s: not run: %d cores for %d stages\n", su.title, runtime.NumCPU(), su.stages)
		return nil
	}
	micros := su.micros
	results := map[string]*result{}
	key := func(r row, m int) string { return fmt.Sprintf("%v/%d", r, m) }
	// Repetitions are the outer loop, so slow drift of the machine touches every
	// schedule alike.
	for rep := 0; rep < reps; rep++ {
		for _, m := range micros {
			for _, rw := range rows {
				cfgPath := su.plain
				switch rw.name {
				case "interleaved", "interleaved-zb":
					cfgPath = su.interleaved
				case "zb-v", "dualpipev":
					cfgPath = su.zbv
				}
				rewritten := rw.recompute || su.pin
				if rewritten {
					var err error
					if cfgPath, err = variant(cfgPath, rw.recompute, su.pin); err != nil {
						return err
					}
				}
				x, err := run(bin, cfgPath, rw.name, m, steps, skip)
				if rewritten {
					os.Remove(cfgPath)
				}
				if err != nil {
					return fmt.Errorf("%s, %v m=%d: %v", su.title, rw, m, err)
				}
				r := results[key(rw, m)]
				if r == nil {
					r = &result{}
					results[key(rw, m)] = r
				}
				r.measured, r.simulated, r.steady = append(r.measured, x.measured), append(r.simulated, x.simulated), append(r.steady, x.steady)
				r.stepMS, r.memory, r.peakMiB = append(r.stepMS, x.stepMS), append(r.memory, x.memory), append(r.peakMiB, x.peakMiB)
				fmt.Fprintf(os.Stderr, "%s, rep %d  %-28v m=%-2d  measured bubble %5.1f%%  simulated %5.1f%% (%5.1f%% at mean costs)  step %.2f ms  activations %.2f MiB\n",
					su.title, rep+1, rw, m, 100*x.measured, 100*x.simulated, 100*x.steady, x.stepMS, x.peakMiB)
			}
		}
	}
	fmt.Fprintf(b, "\n## %s\n\nConfigs: `%s` (gpipe, 1f1b, zb-h1), `%s` (interleaved and interleaved-zb, 2 chunks per stage) and `%s` (zb-v and dualpipev, 2 chunks per stage in a V).\n\n", su.title, su.plain, su.interleaved, su.zbv)
	fmt.Fprintf(b, "| schedule | micro-batches | measured bubble | simulated bubble | difference | at mean costs | step time | throughput vs 1F1B | activations measured / predicted | activations, fullest stage |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range micros {
		base := median(results[key(row{"1f1b", false}, m)].stepMS)
		for _, rw := range rows {
			r := results[key(rw, m)]
			meas, sim, step := median(r.measured), median(r.simulated), median(r.stepMS)
			fmt.Fprintf(b, "| %v | %d | %.1f%% | %.1f%% | %+.1f pp | %.1f%% | %.2f ms | %.2fx | %.0f%% | %.2f MiB |\n", rw, m, 100*meas, 100*sim, 100*(meas-sim), 100*median(r.steady), step, base/step, 100*median(r.memory), median(r.peakMiB))
		}
	}
	return nil
}

// variant writes a copy of the config at path, beside it, with every stage
// set to recompute its forwards (recompute), and stage i pinned to CPU i
// (pin), and returns the copy's path. Stages must be written {layers: ...},
// one a line.
func variant(path string, recompute, pin bool) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(raw), "\n")
	n := 0
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "- {layers:") {
			continue
		}
		var fields string
		if recompute {
			fields += "recompute: full, "
		}
		if pin {
			fields += fmt.Sprintf("cpus: \"%d\", ", n)
		}
		lines[i], n = strings.Replace(l, "{layers:", "{"+fields+"layers:", 1), n+1
	}
	if n == 0 {
		return "", fmt.Errorf("%s: no stage written as {layers: ...} to set recompute or cpus on", path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "variant-*.yaml")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "\n")); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// measurement is one run's figures: its measured mean bubble; the bubble
// the profile's replay of its schedule gives with the run's own action times
// (simulated), and with every action at its mean (steady); its median step
// time in ms; the stage whose peak activation memory is furthest from
// run.json's prediction, as measured over predicted; and the most activation
// memory a stage held, in MiB.
type measurement struct {
	measured, simulated, steady, stepMS, memory, peakMiB float64
}

// run launches one training run and measures it.
func run(bin, cfgPath, name string, micro, steps, skip int) (measurement, error) {
	var m measurement
	dir, err := os.MkdirTemp("", "pipetrain-bench")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(dir)
	env := []string{"PIPETRAIN_SCHEDULE=" + name, fmt.Sprintf("PIPETRAIN_DATA_MICRO_BATCHES=%d", micro), fmt.Sprintf("PIPETRAIN_TRAIN_STEPS=%d", steps)}
	cmd := exec.Command(bin, "launch", "--config", cfgPath, "--run-dir", dir)
	cmd.Env = append(os.Environ(), env...)
	if outb, err := cmd.CombinedOutput(); err != nil {
		return m, fmt.Errorf("%v\n%s", err, outb)
	}
	info, events, err := profile.ReadRun(dir)
	if err != nil {
		return m, err
	}
	rep, err := profile.Analyse(info, events, skip)
	if err != nil {
		return m, err
	}
	if rep.Predicted == nil {
		return m, fmt.Errorf("simulating the run: %v", rep.PredictErr)
	}
	m.measured, m.simulated, m.steady = rep.MeanBubble, rep.PredictedBubble, rep.SteadyBubble
	for _, k := range env {
		kv := strings.SplitN(k, "=", 2)
		os.Setenv(kv[0], kv[1])
	}
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return m, err
	}
	ms, err := stages.ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return m, err
	}
	var steptimes []float64
	for _, x := range ms[min(skip, len(ms)-1):] {
		steptimes = append(steptimes, float64(cfg.Data.BatchSize)/x.SamplesPerSec*1e3)
	}
	m.stepMS = median(steptimes)
	m.memory = 1
	for _, st := range rep.Stages {
		m.peakMiB = max(m.peakMiB, float64(st.PeakStashBytes)/(1<<20))
		if st.PredictedStashBytes > 0 {
			r := float64(st.PeakStashBytes) / float64(st.PredictedStashBytes)
			if math.Abs(r-1) > math.Abs(m.memory-1) {
				m.memory = r
			}
		}
	}
	return m, nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
