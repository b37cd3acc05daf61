// Command suite measures pipetrain on this machine and writes the results as
// Markdown (docs/benchmarks.md by default): the machine, then one table per
// section, each figure the median of several runs, each ratio taken against a
// baseline measured in the same run.
//
//   - compute: one stage's forward+backward GFLOP/s on 1024-wide Dense layers
//     against plain sgemm calls of the same shapes under the fastest of
//     OpenBLAS's kernel sets the CPU runs, the library's own choice beside it,
//     each set timed in a child process (compute.go, kernels.go);
//   - transport: gRPC tensor stream throughput and round-trip latency against
//     raw TCP on loopback (transport.go);
//   - pipeline: each schedule's simulated makespan, from the run's own action
//     costs, over its measured step time (pipeline.go);
//   - end to end: samples/s of `pipetrain launch` against `pipetrain reference`
//     (endtoend.go);
//   - all-reduce: the replicas' ring all-reduce bus bandwidth against raw TCP,
//     and one model on four processes as stages × replicas (allreduce.go);
//   - zero: each replica's optimizer state with and without
//     all_reduce.shard_optimizer, and the step rate it costs (zero.go);
//   - ps: the replicas' ring against parameter servers (sync, backup
//     workers, async with max_staleness 0, 1 and 4) on the same processes:
//     samples/s and the loss after the same samples, what one worker at
//     half speed costs each, and a GPT's loss per mode (ps.go);
//   - breakdown: where a step's CPU time goes in the one-process reference
//     (products, elementwise kernels, gorgonia's bookkeeping, allocation...),
//     from a `--cpuprofile` of it at micro-batches 8, 32 and 128 (breakdown.go);
//   - pytorch: samples/s of pipetrain against PyTorch on the same models,
//     batches and micro-batch split: one process (the MLPs at 1 and 2 BLAS
//     threads, the GPT at 1) and 4-process pipelines of the MLPs (pipetrain
//     launch against torch.distributed over gloo) (pytorch.go); PyTorch in
//     one process both as installed and with pipetrain's kernel set
//     (OPENBLAS_CORETYPE: Debian's torch calls the same OpenBLAS).
//
// A "## Notes" section at the end of the -out file, measured by hand, is
// kept when the file is written again.
//
// Usage (make bench builds the binary first):
//
//	go run ./bench/suite -bin bin/pipetrain -out docs/benchmarks.md
//	go run ./bench/suite -quick -sections compute,transport -out /tmp/b.md
package main

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/blas/cores"
	"github.com/pipetrain/pipetrain/internal/machine"
	"github.com/pipetrain/pipetrain/internal/stats"
)

// options are the command's flags, shared by every section.
type options struct {
	bin        string
	reps       int  // repetitions of in-process measurements (medians reported)
	runReps    int  // repetitions of multi-process runs
	quick      bool // fewer and smaller measurements, for a smoke run
	pipeSteps  int
	e2eSteps   int
	skip       int // warm-up steps left out of every run's figures
	maxLoad    float64
	waitQuiet  time.Duration
	keepGoing  bool
	breakdown  float64 // about how many seconds of steps each breakdown run profiles
	sectionSet map[string]bool
}

// targetResult is one of the targets as measured, for the summary table.
type targetResult struct {
	what, target, measured string
	met                    bool
}

// targets collects the sections' target checks in the order they ran.
var targets []targetResult

// section is one part of the report.
type section struct {
	name  string
	title string
	run   func(o *options, b *bytes.Buffer) error
}

var sections = []section{
	{"compute", "Compute", runCompute},
	{"transport", "Transport", runTransport},
	{"pipeline", "Pipeline: schedule efficiency", runPipeline},
	{"endtoend", "End to end", runEndToEnd},
	{"compression", "Wire compression", runCompression},
	{"allreduce", "Data-parallel replicas: all-reduce", runAllReduce},
	{"hierarchical", "Data-parallel replicas: within and across hosts", runHierarchical},
	{"zero", "Data-parallel replicas: sharded optimizer state", runZero},
	{"ps", "Parameter servers", runPS},
	{"breakdown", "Where a step goes", runBreakdown},
	{"pytorch", "Against PyTorch", runPyTorch},
}

func main() {
	if spec, ok := os.LookupEnv(sgemmChildEnv); ok {
		runSgemmChild(spec) // a compute section's child, timing one kernel set
		return
	}
	if spec, ok := os.LookupEnv(ringRankEnv); ok {
		runRingRankChild(spec) // a hierarchical section's child, one rank of a ring across hosts
		return
	}
	var o options
	out := flag.String("out", "docs/benchmarks.md", "Markdown file to write")
	only := flag.String("sections", "compute,transport,pipeline,endtoend,compression,allreduce,hierarchical,zero,ps,breakdown,pytorch", "comma-separated sections to run")
	flag.StringVar(&o.bin, "bin", "bin/pipetrain", "pipetrain binary (pipeline and end-to-end sections)")
	flag.IntVar(&o.reps, "reps", 7, "repetitions of each in-process measurement (compute, transport); medians are reported")
	flag.IntVar(&o.runReps, "run-reps", 5, "repetitions of each pipetrain run (pipeline, end to end); medians are reported")
	flag.BoolVar(&o.quick, "quick", false, "a smoke run: fewer repetitions, fewer steps, smaller transfers")
	flag.IntVar(&o.pipeSteps, "pipeline-steps", 40, "training steps per pipeline-section run")
	flag.IntVar(&o.e2eSteps, "e2e-steps", 100, "training steps per end-to-end run")
	flag.IntVar(&o.skip, "skip", 10, "warm-up steps left out of every run's figures")
	flag.Float64Var(&o.breakdown, "breakdown-sec", 8, "seconds of steps each breakdown run profiles (at most 2 with -quick)")
	flag.Float64Var(&o.maxLoad, "max-load", 1.5, "wait (up to -wait) for the 1-minute load average to fall below this before starting")
	flag.DurationVar(&o.waitQuiet, "wait", 2*time.Minute, "longest wait for a quiet machine (0: do not wait)")
	flag.BoolVar(&o.keepGoing, "keep-going", false, "write the report even if a section fails (the failure is recorded in it)")
	flag.Parse()
	if o.quick {
		o.reps = min(o.reps, 3)
		o.runReps = 1
		o.pipeSteps = min(o.pipeSteps, 20)
		o.e2eSteps = min(o.e2eSteps, 30)
		o.skip = min(o.skip, 5)
	}
	if o.reps < 1 || o.runReps < 1 || o.skip < 0 || o.pipeSteps <= o.skip || o.e2eSteps <= o.skip || o.breakdown <= 0 {
		fatalf("need -reps >= 1, -run-reps >= 1, -breakdown-sec > 0 and more steps than -skip")
	}
	o.sectionSet = map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.ContainsFunc(sections, func(x section) bool { return x.name == s }) {
			fatalf("unknown section %q (known: compute, transport, pipeline, endtoend, compression, allreduce, hierarchical, zero, ps, breakdown, pytorch)", s)
		}
		o.sectionSet[s] = true
	}
	if o.sectionSet["pipeline"] || o.sectionSet["endtoend"] || o.sectionSet["compression"] || o.sectionSet["allreduce"] || o.sectionSet["hierarchical"] || o.sectionSet["zero"] || o.sectionSet["ps"] || o.sectionSet["breakdown"] || o.sectionSet["pytorch"] {
		if _, err := os.Stat(o.bin); err != nil {
			fatalf("pipetrain binary: %v (run make build, or pass -bin)", err)
		}
	}

	waitForQuiet(o.maxLoad, o.waitQuiet)
	start := time.Now()
	loadStart := loadAvg()
	var body bytes.Buffer
	var failed []string
	var others []string // other processes' share of the CPU, per section
	total := startCPU()
	for _, s := range sections {
		if !o.sectionSet[s.name] {
			continue
		}
		logf("== %s", s.title)
		t0 := time.Now()
		cpu := startCPU()
		fmt.Fprintf(&body, "\n## %s\n\n", s.title)
		if err := s.run(&o, &body); err != nil {
			if !o.keepGoing {
				fatalf("%s: %v", s.name, err)
			}
			failed = append(failed, s.name)
			fmt.Fprintf(&body, "\n**This section failed:** `%s`\n", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		share := cpu.othersShare()
		others = append(others, fmt.Sprintf("%s %s", strings.ReplaceAll(s.name, "endtoend", "end to end"), pct(share)))
		logf("== %s done in %.0fs (other processes took %.0f%% of the CPU)", s.title, time.Since(t0).Seconds(), 100*share)
	}
	loadEnd := loadAvg()
	othersTotal := total.othersShare()

	var doc bytes.Buffer
	writeHeader(&doc, &o, start, loadStart, loadEnd, othersTotal, others)
	if len(targets) > 0 {
		fmt.Fprintf(&doc, "\n## Targets\n\n| what | target | measured | met? |\n|---|---|---|---|\n")
		for _, t := range targets {
			fmt.Fprintf(&doc, "| %s | %s | %s | %s |\n", t.what, t.target, t.measured, yesNo(t.met))
		}
	}
	doc.Write(body.Bytes())
	if old, err := os.ReadFile(*out); err == nil {
		doc.WriteString(keptNotes(string(old)))
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fatalf("%v", err)
	}
	if err := os.WriteFile(*out, doc.Bytes(), 0o644); err != nil {
		fatalf("%v", err)
	}
	logf("wrote %s in %.0fs", *out, time.Since(start).Seconds())
	if len(failed) > 0 {
		fatalf("sections failed: %s", strings.Join(failed, ", "))
	}
}

func writeHeader(b *bytes.Buffer, o *options, start time.Time, loadStart, loadEnd, othersTotal float64, others []string) {
	fmt.Fprintf(b, "# Benchmarks\n\n")
	fmt.Fprintf(b, "What pipetrain achieves on one machine, and how close that is to what the machine allows. ")
	fmt.Fprintf(b, "Reproduce with `make bench`, which builds `bin/pipetrain` and runs `go run ./bench/suite -bin bin/pipetrain -out docs/benchmarks.md` ")
	fmt.Fprintf(b, "(flags: `-reps`, `-run-reps`, `-quick`, `-sections`, see `go run ./bench/suite -h`; `make bench BENCH_FLAGS=-quick` for a rough run in about three minutes). ")
	fmt.Fprintf(b, "Every figure is the median of several runs, and every ratio is taken against a baseline measured in the same invocation, ")
	fmt.Fprintf(b, "so a slower or busier machine moves both sides alike. Targets come from the issue that asked for this report; ")
	fmt.Fprintf(b, "they are checked here, not by the tests. A `## Notes` section at the end, measured by hand with the commands it gives, is kept when the suite writes the file again.\n\n")
	fmt.Fprintf(b, "## Machine\n\n")
	fmt.Fprintf(b, "| | |\n|---|---|\n")
	fmt.Fprintf(b, "| CPU | %s (%s) |\n", machine.CPUModel(), cores.Host())
	fmt.Fprintf(b, "| cores | %d (GOMAXPROCS %d) |\n", runtime.NumCPU(), runtime.GOMAXPROCS(0))
	if mem := memTotal(); mem != "" {
		fmt.Fprintf(b, "| memory | %s |\n", mem)
	}
	if k := readTrim("/proc/sys/kernel/osrelease"); k != "" {
		fmt.Fprintf(b, "| kernel | Linux %s |\n", k)
	}
	fmt.Fprintf(b, "| Go | %s %s/%s |\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if core, why := blas.Kernels(); core != "" {
		fmt.Fprintf(b, "| BLAS | %s, %s kernels: %s (threads per process: see each section) |\n", blas.Name(), core, why)
	} else {
		fmt.Fprintf(b, "| BLAS | %s (threads per process: see each section) |\n", blas.Name())
	}
	fmt.Fprintf(b, "| date | %s |\n", start.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(b, "| load average (1 min) | %.2f at the start, %.2f at the end (the benchmark's own processes included) |\n", loadStart, loadEnd)
	fmt.Fprintf(b, "| CPU taken by other processes | %s of the machine's CPU time while this ran (%s) |\n", pct(othersTotal), strings.Join(others, ", "))
	fmt.Fprintf(b, "| settings | %d repetitions in-process, %d per pipetrain run, %d pipeline steps and %d end-to-end steps per run, first %d steps left out |\n",
		o.reps, o.runReps, o.pipeSteps, o.e2eSteps, o.skip)
	if othersTotal > 0.1 || loadStart > o.maxLoad {
		fmt.Fprintf(b, "\nThe machine was not idle while this ran: other processes took CPU time from both the measured code and its baselines, which widens the spread of every figure.\n")
	}
	if o.quick {
		fmt.Fprintf(b, "\nThis is a `-quick` run: fewer repetitions and shorter runs than the defaults, so the figures are rougher.\n")
	}
}

// notesHeading starts the part of a report the suite does not write:
// measurements made by hand with the commands they give, kept when the
// suite writes the file again.
const notesHeading = "\n## Notes\n"

// keptNotes is the notes section at the end of a report the suite wrote
// before (from notesHeading on), "" when it has none.
func keptNotes(report string) string {
	if i := strings.LastIndex(report, notesHeading); i >= 0 {
		return report[i:]
	}
	return ""
}

// waitForQuiet sleeps while the 1-minute load average is above max, for at most d.
func waitForQuiet(max float64, d time.Duration) {
	deadline := time.Now().Add(d)
	for l := loadAvg(); l > max && time.Now().Before(deadline); l = loadAvg() {
		logf("load average %.2f > %.2f: waiting for a quieter machine (up to %s more)", l, max, time.Until(deadline).Round(time.Second))
		time.Sleep(15 * time.Second)
	}
}

// cpuMark is a point in time's CPU accounting: the machine's busy CPU time
// (/proc/stat, steal included) and this process's and its waited-for
// descendants' (getrusage), in seconds.
type cpuMark struct {
	at          time.Time
	busy, owned float64
}

func startCPU() cpuMark { return cpuMark{time.Now(), machineBusy(), ownedCPU()} }

// othersShare is the fraction of the machine's CPU capacity since m that
// processes other than this one and its children used.
func (m cpuMark) othersShare() float64 {
	capacity := time.Since(m.at).Seconds() * float64(runtime.NumCPU())
	if capacity <= 0 || math.IsNaN(m.busy) {
		return math.NaN()
	}
	other := (machineBusy() - m.busy) - (ownedCPU() - m.owned)
	return min(1, max(0, other/capacity))
}

// machineBusy is the CPU time all processes used, from /proc/stat's "cpu" line
// (user, nice, system, irq, softirq, steal; USER_HZ = 100).
func machineBusy() float64 {
	for _, line := range strings.Split(readTrim("/proc/stat"), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			continue
		}
		var busy float64
		for _, i := range []int{1, 2, 3, 6, 7, 8} {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return math.NaN()
			}
			busy += v
		}
		return busy / 100
	}
	return math.NaN()
}

// ownedCPU is the user and system time of this process and of its children
// that have been waited for (the pipetrain runs and their stage processes).
func ownedCPU() float64 {
	var t float64
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			t += float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		}
	}
	return t
}

func loadAvg() float64 {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) == 0 {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				return fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	return ""
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "suite: "+format+"\n", args...)
	os.Exit(1)
}

// quantile q in [0, 1] of xs, nearest rank; NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// spread is (max-min)/median of xs, the run-to-run variation shown beside medians.
func spread(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	return (slices.Max(xs) - slices.Min(xs)) / stats.Median(xs)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }
