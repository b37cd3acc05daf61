package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
)

// The breakdown section: where the CPU time of a training step goes, from a Go
// CPU profile (`pipetrain --cpuprofile`) of the one-process reference, every
// sample attributed by its stack to one category.

// bdModel is one of the section's models, trained at several micro-batch sizes
// with the same global batch.
type bdModel struct {
	key    string
	hidden []int
	batch  int
	micro  []int // micro-batch sizes, smallest first
}

var bdModels = []bdModel{
	{"a", repeatInt(1024, 8), 256, []int{8, 32, 128}},
	{"b", repeatInt(512, 4), 128, []int{8, 32, 128}},
}

// Categories, in the table's order.
const (
	catProducts = iota
	catElementwise
	catReductions
	catCopies
	catAlloc
	catGorgonia
	catOptimizer
	catData
	catRuntime
	catTransport
	catOther
	numCats
)

var catNames = [numCats]string{
	catProducts:    "sgemm products",
	catElementwise: "elementwise kernels",
	catReductions:  "reductions",
	catCopies:      "copies and zeroing",
	catAlloc:       "allocation and GC",
	catGorgonia:    "gorgonia bookkeeping",
	catOptimizer:   "optimizer",
	catData:        "data",
	catRuntime:     "pipetrain runtime",
	catTransport:   "transport",
	catOther:       "other",
}

// profileHz is the sampling rate of runtime/pprof.StartCPUProfile.
const profileHz = 100

// bdStageMB is the micro-batch size at which each model also runs as a
// 2-stage pipeline, one process per stage, each profiled.
const bdStageMB = 32

type bdRow struct {
	model      bdModel
	process    string // "reference", or which stage of the 2-stage run
	mb         int    // examples per micro-batch
	steps      int
	stepMs     []float64 // wall time per step after the warm-up, from metrics.jsonl
	samples    [numCats]int
	stepTotal  int // samples attributed to the steps
	startup    int // samples of the one-time start-up and finish, left out
	cpuPerStep float64
}

func (r *bdRow) share(c int) float64 {
	if r.stepTotal == 0 {
		return math.NaN()
	}
	return float64(r.samples[c]) / float64(r.stepTotal)
}

// catMs is category c's CPU time per step, in ms.
func (r *bdRow) catMs(c int) float64 { return r.share(c) * r.cpuPerStep }

func runBreakdown(o *options, b *bytes.Buffer) error {
	goBin, err := goTool()
	if err != nil {
		return err
	}
	target := o.breakdown
	if o.quick {
		target = min(target, 2)
	}
	tmp, err := os.MkdirTemp("", "pipetrain-breakdown-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var rows []*bdRow
	for _, m := range bdModels {
		base := filepath.Join(tmp, "mlp-"+m.key+".yaml")
		if err := os.WriteFile(base, []byte(m.config()), 0o644); err != nil {
			return err
		}
		model, err := models.Build(m.spec())
		if err != nil {
			return err
		}
		// The schema wants stages: the reference ignores them, the 2-stage runs use them.
		split := balancedSplit(model, 2)
		for _, mb := range m.micro {
			rc := runConfig{base: base, micro: m.batch / mb, layers: split}
			r, err := profileReference(o, goBin, rc, m, mb, target)
			if err != nil {
				return fmt.Errorf("MLP %s, micro-batch %d: %w", m.key, mb, err)
			}
			rows = append(rows, r)
			logRow(r)
			if mb != bdStageMB {
				continue
			}
			srs, err := profileStages(o, goBin, rc, m, mb, split, r.steps)
			if err != nil {
				return fmt.Errorf("MLP %s, micro-batch %d, 2 stages: %w", m.key, mb, err)
			}
			for _, sr := range srs {
				logRow(sr)
			}
			rows = append(rows, srs...)
		}
	}
	writeBreakdown(o, b, rows, target)
	return nil
}

func logRow(r *bdRow) {
	logf("breakdown MLP %s mb=%d %s: %d steps, step %.1f ms, CPU %.1f ms/step, products %.0f%%, elementwise %.0f%%, gorgonia %.0f%%, alloc %.0f%%, transport %.0f%%",
		r.model.key, r.mb, r.process, r.steps, stats.Median(r.stepMs), r.cpuPerStep, 100*r.share(catProducts), 100*r.share(catElementwise),
		100*r.share(catGorgonia), 100*r.share(catAlloc), 100*r.share(catTransport))
}

func repeatInt(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func (m bdModel) spec() models.Spec {
	return models.Spec{Name: "mlp", DType: "float32", Input: 784, Hidden: m.hidden, Classes: 10}
}

func (m bdModel) label() string {
	return fmt.Sprintf("%s: 784-%d×%d-10", m.key, m.hidden[0], len(m.hidden))
}

// config is the model's base config; runConfig fills in steps, micro-batches,
// stages with fresh ports, and turns evaluation and checkpoints off.
func (m bdModel) config() string {
	hidden := make([]string, len(m.hidden))
	for i, h := range m.hidden {
		hidden[i] = strconv.Itoa(h)
	}
	return fmt.Sprintf(`# Written by bench/suite (breakdown section).
name: breakdown-mlp-%s
model: {name: mlp, dtype: float32, input: 784, hidden: [%s], classes: 10}
data: {batch_size: %d, micro_batches: 1}
train: {optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
compute: {blas_threads: 1}
`, m.key, strings.Join(hidden, ", "), m.batch)
}

// profileReference sizes a reference run of rc to about target seconds of
// steps with a 3-step run, then runs it under --cpuprofile and attributes the
// profile's samples.
func profileReference(o *options, goBin string, rc runConfig, m bdModel, mb int, target float64) (*bdRow, error) {
	rc.steps = 3
	dir, err := os.MkdirTemp("", "pipetrain-breakdown-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := referenceRun(o, rc, filepath.Join(dir, "calibrate"), ""); err != nil {
		return nil, err
	}
	ms, _, err := stepTimes(filepath.Join(dir, "calibrate", "run"), m.batch, 1)
	if err != nil {
		return nil, err
	}
	est := ms[0]
	for _, x := range ms {
		est = min(est, x)
	}
	r := &bdRow{model: m, process: "reference", mb: mb}
	r.steps = max(5, int(math.Ceil(target*1e3/est)))
	rc.steps = r.steps
	prof := filepath.Join(dir, "cpu.pprof")
	if err := referenceRun(o, rc, filepath.Join(dir, "profiled"), prof); err != nil {
		return nil, err
	}
	if r.stepMs, _, err = stepTimes(filepath.Join(dir, "profiled", "run"), m.batch, bdSkip(o, r.steps)); err != nil {
		return nil, err
	}
	return r, r.attribute(goBin, prof)
}

// bdSkip is how many warm-up steps of a run of steps its step time leaves out.
func bdSkip(o *options, steps int) int { return min(o.skip, max(1, steps/5)) }

// attribute reads the profile prof into r's sample counts.
func (r *bdRow) attribute(goBin, prof string) error {
	stacks, err := readTraces(goBin, prof)
	if err != nil {
		return err
	}
	for _, s := range stacks {
		if oneTime(s.frames) {
			r.startup += s.n
			continue
		}
		r.samples[classify(s.frames)] += s.n
		r.stepTotal += s.n
	}
	r.cpuPerStep = float64(r.stepTotal) * 1e3 / profileHz / float64(r.steps)
	return nil
}

// profileStages runs rc as a 2-stage pipeline for steps steps, the two
// `pipetrain stage` processes started here as launch starts them, each with
// its own CPU profile, and returns a row per stage.
func profileStages(o *options, goBin string, rc runConfig, m bdModel, mb int, split []string, steps int) ([]*bdRow, error) {
	rc.steps = steps
	dir, err := os.MkdirTemp("", "pipetrain-breakdown-stages-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfgPath, err := rc.write(dir)
	if err != nil {
		return nil, err
	}
	runDir := filepath.Join(dir, "run")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, len(split))
	for i := range split {
		args := []string{"stage", "--config", cfgPath, "--stage", strconv.Itoa(i), "--run-dir", runDir,
			"--cpuprofile", filepath.Join(dir, fmt.Sprintf("stage-%d.pprof", i))}
		cmd := exec.CommandContext(ctx, o.bin, args...)
		cmd.Env = append(os.Environ(), runEnv(rc)...)
		go func() {
			out, err := cmd.CombinedOutput()
			switch {
			case err == nil, ctx.Err() != nil: // done, or stopped because the other stage failed
				errs <- nil
			default:
				cancel() // the other stage would wait for its peer until its timeout
				errs <- fmt.Errorf("%s %s: %v\n%s", filepath.Base(o.bin), strings.Join(args, " "), err, tail(out, 2000))
			}
		}()
	}
	var first error
	for range split {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	stepMs, _, err := stepTimes(runDir, m.batch, bdSkip(o, steps))
	if err != nil {
		return nil, err
	}
	var rows []*bdRow
	for i, layers := range split {
		r := &bdRow{model: m, process: fmt.Sprintf("stage %d of 2 (layers %s)", i, layers), mb: mb, steps: steps, stepMs: stepMs}
		if err := r.attribute(goBin, filepath.Join(dir, fmt.Sprintf("stage-%d.pprof", i))); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// referenceRun runs `pipetrain reference` for rc in dir (made here), with a CPU
// profile written to prof unless it is empty.
func referenceRun(o *options, rc runConfig, dir, prof string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfgPath, err := rc.write(dir)
	if err != nil {
		return err
	}
	args := []string{"reference", "--config", cfgPath, "--run-dir", filepath.Join(dir, "run")}
	if prof != "" {
		args = append(args, "--cpuprofile", prof)
	}
	cmd := exec.Command(o.bin, args...)
	cmd.Env = append(os.Environ(), runEnv(rc)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", filepath.Base(o.bin), strings.Join(args, " "), err, tail(out, 2000))
	}
	return nil
}

// goTool is the go command, whose `go tool pprof` reads the profiles.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("the go command is needed to read CPU profiles (go tool pprof), and is not on PATH")
}

// stack is one distinct call stack of a profile, leaf first, and its samples.
type stack struct {
	n      int
	frames []string
}

// readTraces reads a CPU profile's samples per stack from the text of
// `go tool pprof -traces -sample_index=samples`: blocks separated by a line of
// dashes, each a sample count followed by the leaf function's name, then one
// caller per line. Inlined frames are marked " (inline)"; labels, if any, come
// before the count.
func readTraces(goBin, prof string) ([]stack, error) {
	out, err := exec.Command(goBin, "tool", "pprof", "-traces", "-sample_index=samples", prof).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return nil, fmt.Errorf("go tool pprof -traces %s: %v\n%s", prof, err, tail(stderr, 1000))
	}
	var stacks []stack
	var cur *stack
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "-----------+") {
			stacks = append(stacks, stack{})
			cur = &stacks[len(stacks)-1]
			continue
		}
		if cur == nil || len(line) < 14 {
			continue
		}
		count, name := strings.TrimSpace(line[:10]), strings.TrimSpace(line[13:])
		name = strings.TrimSuffix(name, " (inline)")
		switch {
		case count != "" && len(cur.frames) == 0:
			n, err := strconv.Atoi(count)
			if err != nil {
				continue // a label line
			}
			cur.n, cur.frames = n, []string{name}
		case count == "" && len(cur.frames) > 0 && line[10] == ' ':
			cur.frames = append(cur.frames, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// The output ends with a separator, and blocks may hold no frames.
	full := stacks[:0]
	for _, s := range stacks {
		if s.n > 0 && len(s.frames) > 0 {
			full = append(full, s)
		}
	}
	if len(full) == 0 {
		return nil, fmt.Errorf("go tool pprof -traces %s: no samples", prof)
	}
	return full, nil
}

func hasFrame(frames []string, subs ...string) bool {
	for _, f := range frames {
		for _, s := range subs {
			if strings.Contains(f, s) {
				return true
			}
		}
	}
	return false
}

// oneTime reports whether a sample is the run's one-time work, left out of the
// steps: on the main goroutine but outside the training loop (process start,
// config, data file decompression, model build, the run directory), or saving
// the final weights. Training runs on the main goroutine under Runtime.Run;
// gorgonia's tape machines run on goroutines of their own, and so do the
// garbage collector's workers, whose samples all count as the steps'.
func oneTime(frames []string) bool {
	if frames[len(frames)-1] != "runtime.main" {
		return false
	}
	return !hasFrame(frames, "stages.(*Runtime).Run") ||
		hasFrame(frames, "stages.(*Runtime).saveWeights", "stages.(*Runtime).open", "checkpoint.RemoveAfter", "stages.(*Runtime).writeEval")
}

// classify attributes a sample to a category: the first frame from the leaf
// upward that names one decides. Frames that name none (runtime.cgocall, the
// scheduler, most of the standard library) pass the decision to their caller.
// Two refinements look further up: an elementwise kernel called by a
// reduction counts as the reduction, and memory zeroed while allocating as
// the allocation.
func classify(frames []string) int {
	for i, f := range frames {
		c := frameCat(f)
		if c < 0 {
			continue
		}
		up := frames[i+1:]
		switch {
		case c == catElementwise && hasFrame(up, "tensor.StdEng.reduce", "tensor.StdEng.OptimizedReduce", "tensor.StdEng.Sum", "tensor.StdEng.Max", "gorgonia.reductionDo"):
			return catReductions
		case c == catCopies && hasFrame(up, "runtime.mallocgc"):
			return catAlloc
		}
		return c
	}
	return catOther
}

// frameCat is the category a function's name puts it in, or -1 for none.
func frameCat(f string) int {
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(f, s) {
				return true
			}
		}
		return false
	}
	prefix := func(ps ...string) bool {
		for _, p := range ps {
			if strings.HasPrefix(f, p) {
				return true
			}
		}
		return false
	}
	switch {
	case has("cblas_", "sgemm_", "dgemm_", "pipetrain/internal/blas.", "gonum.org/v1/gonum/blas", "tensor.StdEng.MatMul", "tensor.StdEng.MatVecMul", "tensor.StdEng.Outer", "tensor.StdEng.Inner"):
		return catProducts
	case prefix("gorgonia.org/tensor/internal/execution.") && has("Reduce", ".Sum", "Max", "Min"),
		prefix("gorgonia.org/vecf32.Sum", "gorgonia.org/vecf64.Sum", "gorgonia.org/vecf32.Max", "gorgonia.org/vecf64.Max"):
		return catReductions
	case prefix("gorgonia.org/tensor/internal/execution.", "gorgonia.org/vecf32.", "gorgonia.org/vecf64.", "github.com/chewxy/math32."),
		has("tensor.StdEng.softMax", "tensor.StdEng.logSoftMax", "tensor.StdEng.SoftMax", "tensor.StdEng.LogSoftMax"),
		// pipetrain's own vectorised kernels, where the engine has them.
		has("pipetrain/engine.binary32", "pipetrain/engine.gteScalar32", "pipetrain/engine.addAVX", "pipetrain/engine.mulAVX", "pipetrain/engine.gteAVX", "pipetrain/engine.fastEngine"),
		// The fused ops and their kernels (their products are sgemm_ frames, found first).
		prefix("github.com/pipetrain/pipetrain/models."):
		return catElementwise
	case prefix("runtime.memmove", "runtime.typedmemmove", "runtime.typedslicecopy", "runtime.memclrNoHeapPointers", "runtime.memclr"),
		has("storage.CopySliced", "storage.Copy", "tensor.copyDense", "tensor.copyArray", "tensor.array.Zero", "tensor.(*Dense).Zero",
			"tensor.StdEng.fastCopyDenseRepeat", "tensor.StdEng.denseRepeat"):
		return catCopies
	case prefix("runtime.mallocgc", "runtime.gc", "runtime.bgsweep", "runtime.bgscavenge", "runtime.sweepone", "runtime.(*sweepLocked)",
		"runtime.(*mspan)", "runtime.(*mheap)", "runtime.(*mcache)", "runtime.(*mcentral)", "runtime.(*pageAlloc)", "runtime.(*gcWork)",
		"runtime.(*gcControllerState)", "runtime.(*scavengerState)", "runtime.scan", "runtime.markroot", "runtime.greyobject",
		"runtime.wbBuf", "runtime.bulkBarrier", "runtime.findObject", "runtime.newobject", "runtime.makeslice", "runtime.heapSetType"):
		return catAlloc
	case prefix("github.com/pipetrain/pipetrain/optim."):
		return catOptimizer
	case prefix("github.com/pipetrain/pipetrain/data.", "compress/"), has("stages.(*imageFeed)", "stages.(*textFeed)"):
		return catData
	case prefix("github.com/pipetrain/pipetrain/transport.", "google.golang.org/grpc", "google.golang.org/protobuf", "golang.org/x/net/", "net.", "net/", "crypto/tls."):
		return catTransport
	case prefix("gorgonia.org/", "github.com/chewxy/", "github.com/xtgo/"):
		return catGorgonia
	case prefix("github.com/pipetrain/pipetrain/"):
		return catRuntime
	}
	return -1
}

func writeBreakdown(o *options, b *bytes.Buffer, rows []*bdRow, target float64) {
	fmt.Fprintf(b, "Where the CPU time of a training step goes in the one-process reference (`pipetrain reference`, every layer in one process, no links), "+
		"on two MLPs at micro-batches of %s examples with a fixed global batch, so the same FLOPs per step in fewer and larger products: ", intList(bdModels[0].micro))
	for i, m := range bdModels {
		if i > 0 {
			fmt.Fprintf(b, "; ")
		}
		var counts []string
		for _, mb := range m.micro {
			counts = append(counts, strconv.Itoa(m.batch/mb))
		}
		fmt.Fprintf(b, "MLP %s, batch %d (%s micro-batches)", m.label(), m.batch, strings.Join(counts, ", "))
	}
	fmt.Fprintf(b, ". SGD with momentum, one BLAS thread per process, evaluation and checkpoints off. "+
		"At micro-batch %d each model also runs as a 2-stage 1F1B pipeline (the split balancing multiply-adds), "+
		"its two `pipetrain stage` processes started as `launch` starts them and each profiled, for as many steps as the reference. "+
		"Each reference run is sized by a 3-step run to about %.0f s of steps and profiled with `--cpuprofile` (Go's sampler, %d Hz, every thread, the C code under cgo calls included). "+
		"The step is the median wall time of a step from `metrics.jsonl` (the last stage's, for the pipeline), the first steps left out; "+
		"CPU / step is the process's step samples over its steps: more than the step where the garbage collector works on the other core, "+
		"less where a stage waits for its peer.\n\n", bdStageMB, target, profileHz)
	fmt.Fprintf(b, "`go tool pprof -traces` gives each sample's stack; the first frame from the leaf upward that names a category decides. "+
		"**products**: the sgemm calls (OpenBLAS's `sgemm_` under `tensor.StdEng.MatMul`, called through purego, the C time under `runtime.cgocall` included); "+
		"**elementwise**: gorgonia's kernels (`tensor/internal/execution`, `vecf32`: bias adds, ReLU and its mask, the adds that sum each micro-batch's weight gradients into the parameters'), "+
		"softmax, and pipetrain's own kernels where the engine has them; "+
		"**reductions**: sums (an elementwise kernel under `StdEng.Sum`/`reduce` counts here); "+
		"**copies and zeroing**: `memmove`, `memclr` outside an allocation, tensor copies, the bias's repetition over the rows; "+
		"**allocation and GC**: `mallocgc` (with the zeroing of fresh memory), the collector's workers, sweeping; "+
		"**gorgonia bookkeeping**: every other `gorgonia.org` frame (the tape machine, `execOp`, tensor headers, shape checks) "+
		"with the scheduler work its goroutine per tape run causes; **optimizer**: `pipetrain/optim`; **data**: `pipetrain/data`, `compress`, the feed; "+
		"**pipetrain runtime**: the rest of pipetrain (executor, engine glue, event log, metrics); **transport**: gRPC, protobuf, `net`, pipetrain's `transport`; "+
		"**other**: what is left (the scheduler waking and parking threads, code with no Go stack such as OpenBLAS's own threads). "+
		"The one-time work is left out of the shares and shown apart: samples on the main goroutine outside `Runtime.Run` "+
		"(process start, config, decompressing the data files, building the model, connecting the stages) and saving the final weights. "+
		"The garbage collector's work during start-up cannot be told from the steps' and counts as theirs; it is small, the data set being a few large pointer-free slices.\n\n")
	showTransport := false
	for _, r := range rows {
		showTransport = showTransport || r.samples[catTransport] > 0
	}
	cats := []int{}
	for c := range numCats {
		if c != catTransport || showTransport {
			cats = append(cats, c)
		}
	}
	fmt.Fprintf(b, "| MLP | micro-batch (micro-batches) | process | steps | step | CPU / step |")
	for _, c := range cats {
		fmt.Fprintf(b, " %s |", catNames[c])
	}
	fmt.Fprintf(b, " one-time, left out |\n|---|---|---|---|---|---|%s---|\n", strings.Repeat("---|", len(cats)))
	for _, r := range rows {
		fmt.Fprintf(b, "| %s | %d (%d) | %s | %d | %.1f ms (±%.0f%%) | %.1f ms |", r.model.label(), r.mb, r.model.batch/r.mb, r.process, r.steps,
			stats.Median(r.stepMs), 50*spread(r.stepMs), r.cpuPerStep)
		for _, c := range cats {
			fmt.Fprintf(b, " %s |", sharePct(r.share(c)))
		}
		fmt.Fprintf(b, " %.2f s CPU |\n", float64(r.startup)/profileHz)
	}
	fmt.Fprintf(b, "\n(± is half the spread, max−min over median, of the steps. Shares are of the process's step samples, "+
		"about %d a reference run, so a share is good to a point or two.)\n\n", int(math.Round(target*profileHz)))
	writeBreakdownReading(b, rows)
}

// writeBreakdownReading writes the sentences that read the table: what
// dominates, and which costs grow with the number of micro-batches.
func writeBreakdownReading(b *bytes.Buffer, rows []*bdRow) {
	byModel := map[string][]*bdRow{} // the reference rows, smallest micro-batch first
	var stageRows []*bdRow
	for _, r := range rows {
		if r.process == "reference" {
			byModel[r.model.key] = append(byModel[r.model.key], r)
		} else {
			stageRows = append(stageRows, r)
		}
	}
	top := func(r *bdRow) (int, int) { // the two largest categories
		first, second := -1, -1
		for c := range numCats {
			switch {
			case first < 0 || r.samples[c] > r.samples[first]:
				first, second = c, first
			case second < 0 || r.samples[c] > r.samples[second]:
				second = c
			}
		}
		return first, second
	}
	var ms []bdModel // the models measured
	for _, m := range bdModels {
		if len(byModel[m.key]) > 0 {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return
	}
	lo, hi := ms[0].micro[0], ms[0].micro[len(ms[0].micro)-1]
	// What dominates, at the smallest and the largest micro-batch.
	var parts []string
	for _, m := range ms {
		rs := byModel[m.key]
		l, h := rs[0], rs[len(rs)-1]
		c1, c2 := top(l)
		d1, d2 := top(h)
		parts = append(parts, fmt.Sprintf("on MLP %s, %s %s and %s %s at micro-batch %d, %s %s and %s %s at %d",
			m.key, catNames[c1], pct(l.share(c1)), catNames[c2], pct(l.share(c2)), l.mb, catNames[d1], pct(h.share(d1)), catNames[d2], pct(h.share(d2)), h.mb))
	}
	fmt.Fprintf(b, "Reading the table: the largest shares of a step's CPU time are, %s. ", strings.Join(parts, "; "))
	// Each category's CPU ms per step, smallest against largest micro-batch.
	msRange := func(c int) string {
		var ps []string
		for _, m := range ms {
			rs := byModel[m.key]
			ps = append(ps, fmt.Sprintf("%.1f → %.1f ms on MLP %s", rs[0].catMs(c), rs[len(rs)-1].catMs(c), m.key))
		}
		return strings.Join(ps, ", ")
	}
	ratio := func(c int) float64 { // smallest micro-batch's ms over the largest's, the lesser over the models
		x := math.Inf(1)
		for _, m := range ms {
			rs := byModel[m.key]
			x = min(x, rs[0].catMs(c)/rs[len(rs)-1].catMs(c))
		}
		return x
	}
	ratioMax := func(c int) float64 { // the same, the greater over the models
		x := math.Inf(-1)
		for _, m := range ms {
			rs := byModel[m.key]
			x = max(x, rs[0].catMs(c)/rs[len(rs)-1].catMs(c))
		}
		return x
	}
	fmt.Fprintf(b, "Every step computes the same products whatever the micro-batch, yet their CPU time per step goes %s from micro-batch %d to %d: "+
		"sgemm on %d-row matrices is far from its best. ", msRange(catProducts), lo, hi, lo)
	why := map[int]string{
		catElementwise: "each micro-batch adds its weight gradients into the summed ones, a pass over every weight matrix whatever the micro-batch's size",
		catGorgonia:    "each micro-batch runs the tapes again, with the same per-op work whatever its size",
		catAlloc:       "each tape run allocates afresh",
		catCopies:      "each tape run copies and zeroes its buffers",
	}
	significant := func(c int) bool { // 3% of a step or more somewhere
		for _, m := range ms {
			for _, r := range byModel[m.key] {
				if r.share(c) >= 0.03 {
					return true
				}
			}
		}
		return false
	}
	var grow, reasons, flat []string
	for _, c := range []int{catElementwise, catGorgonia, catAlloc, catCopies, catOptimizer} {
		if !significant(c) {
			continue
		}
		switch q := ratio(c); {
		case math.IsNaN(q):
		case q >= 2:
			grow = append(grow, fmt.Sprintf("the %s (%s)", catNames[c], msRange(c)))
			if why[c] != "" {
				reasons = append(reasons, why[c])
			}
		case q > 0.5 && ratioMax(c) < 2:
			flat = append(flat, fmt.Sprintf("the %s (%s)", catNames[c], msRange(c)))
		}
	}
	if len(grow) > 0 {
		fmt.Fprintf(b, "What grows with the number of micro-batches, not with the examples, is %s", strings.Join(grow, " and "))
		if len(reasons) > 0 {
			fmt.Fprintf(b, ": %s", strings.Join(reasons, "; "))
		}
		fmt.Fprintf(b, ". ")
	}
	if len(flat) > 0 {
		fmt.Fprintf(b, "What is paid once per step or per example changes much less: %s. ", strings.Join(flat, " and "))
	}
	if len(stageRows) > 0 {
		busyLo, busyHi, transport := math.Inf(1), 0.0, 0.0
		var speedups []string
		for i, r := range stageRows {
			busy := r.cpuPerStep / stats.Median(r.stepMs)
			busyLo, busyHi, transport = min(busyLo, busy), max(busyHi, busy), max(transport, r.share(catTransport))
			if i > 0 && stageRows[i-1].model.key == r.model.key {
				continue
			}
			for _, ref := range byModel[r.model.key] {
				if ref.mb == r.mb {
					speedups = append(speedups, fmt.Sprintf("%.2f× on MLP %s", stats.Median(ref.stepMs)/stats.Median(r.stepMs), r.model.key))
				}
			}
		}
		fmt.Fprintf(b, "In the 2-stage runs at micro-batch %d a stage process computes for %s–%s of the step and spends at most %s of its CPU time moving tensors; "+
			"it waits for its peer the rest of the step, and the reference's step over the pipeline's is %s.", bdStageMB, pct(busyLo), pct(busyHi), sharePct(transport), strings.Join(speedups, " and "))
	}
	fmt.Fprintf(b, "\n")
}

func sharePct(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case x == 0:
		return "0%"
	case x < 0.005:
		return "<1%"
	}
	return pct(x)
}

func intList(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
