package main

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
	iblas "github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/blas/cores"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
)

// The compute section's stage: the two middle layers of a 1024-wide MLP
// (1024 -> 1024 -> 1024 -> 1024 -> 1024), so it takes an activation in, sends one
// out and computes an input gradient, like any middle stage of a pipeline.
const (
	computeWidth = 1024
	computeFirst = 1
	computeLast  = 3
	// computeTarget is the first target: stage GFLOP/s over same-run sgemm
	// GFLOP/s, for 1024-wide layers at micro-batches of 64 or more.
	computeTarget = 0.60
	// smallComputeTarget is the same ratio's target at micro-batch 32, where
	// a pipeline's small micro-batches live.
	smallComputeTarget = 0.80
	smallBatch         = 32
	// repTime is how long one repetition of a timed loop should take.
	repTime = 250 * time.Millisecond
)

type computeRow struct {
	batch              int
	flops              float64   // per forward+backward step
	stageSec, sgemmSec []float64 // per step, one entry per repetition
	allocs, bytes      float64   // per step, steady state
	copyBytes          float64   // the output and input-gradient copies a step hands its caller
	stageGF, sgemmGF   float64   // medians; sgemmGF with this process's kernels
	// The limit: sgemm of the same products under the fastest kernel set
	// (bestSet, "" when only this process's kernels were timed), and under
	// the library's own choice (libSet, "" when not timed).
	bestGF, libGF   float64
	bestSet, libSet string
	ratio           float64 // stageGF / bestGF
	overheadShare   float64 // of a step, against this process's sgemm
}

// limit fills r's limit from sets, the kernel sets' sgemm at micro-batch
// index i; without a set that passed, the limit is this process's sgemm.
func (r *computeRow) limit(sets []*kernelSet, i int) {
	r.bestGF, r.bestSet = r.sgemmGF, ""
	if j := fastest(sets, i); j >= 0 {
		r.bestGF, r.bestSet = r.flops/sets[j].median(i)/1e9, sets[j].name()
	}
	if lib := library(sets); lib != nil && lib.err == "" && len(lib.sec[i]) > 0 {
		r.libGF, r.libSet = r.flops/lib.median(i)/1e9, lib.name()
	}
	r.ratio = r.stageGF / r.bestGF
}

// gfCell is a GFLOP/s figure with the kernel set it was measured under.
func gfCell(gf float64, set string) string {
	switch {
	case gf == 0:
		return "–"
	case set == "":
		return fmt.Sprintf("%.1f", gf)
	}
	return fmt.Sprintf("%.1f (%s)", gf, set)
}

// targetAt is the stage / sgemm target at micro-batch mb.
func targetAt(mb int) float64 {
	if mb <= smallBatch {
		return smallComputeTarget
	}
	return computeTarget
}

func runCompute(o *options, b *bytes.Buffer) error {
	iblas.SetThreads(1)
	batches := []int{smallBatch, 64, 128, 256}
	if o.quick {
		batches = []int{smallBatch, 256}
	}
	hidden := make([]int, computeLast)
	for i := range hidden {
		hidden[i] = computeWidth
	}
	m, err := models.Build(models.Spec{Name: "mlp", DType: "float32", Input: computeWidth, Hidden: hidden, Classes: computeWidth})
	if err != nil {
		return err
	}
	var rows []*computeRow
	for _, mb := range batches {
		r, err := measureCompute(o, m, mb)
		if err != nil {
			return fmt.Errorf("micro-batch %d: %w", mb, err)
		}
		rows = append(rows, r)
		logf("compute mb=%d: stage %.1f GFLOP/s, sgemm in this process %.1f GFLOP/s, %.0f allocs/step", mb, r.stageGF, r.sgemmGF, r.allocs)
	}
	sets := measureKernelSets(o.reps, batches)
	for i, r := range rows {
		r.limit(sets, i)
		logf("compute mb=%d: fastest set's sgemm %s GFLOP/s (stage %.0f%% of it), library's choice %s", r.batch, gfCell(r.bestGF, r.bestSet), 100*r.ratio, gfCell(r.libGF, r.libSet))
	}

	layers := computeLast - computeFirst
	kernels, why := iblas.Kernels()
	fmt.Fprintf(b, "One stage holding layers %d-%d of a %d-wide MLP (each a %dx%d Dense layer with bias and ReLU), built with `engine.NewEngine` "+
		"as a middle stage: `Forward` then `Backward` (fused) of one micro-batch, the input gradient included. ", computeFirst, computeLast-1, computeWidth, computeWidth, computeWidth)
	fmt.Fprintf(b, "FLOPs count the matrix products only, 2·m·n·k each: %d forward (one per layer) and %d backward (input and weight gradient per layer). ", layers, 2*layers)
	writeComputeLimit(b, o, sets, kernels, why)
	fmt.Fprintf(b, "One BLAS thread; median of %d repetitions of about %s each. Allocations are counted over steady-state steps with `runtime.MemStats` "+
		"(the same loop is `BenchmarkEngineStepAllocs` in `engine/alloc_bench_test.go`, which `make bench` runs with `-benchmem`).\n\n", o.reps, repTime)
	fmt.Fprintf(b, "| micro-batch | stage step | stage GFLOP/s | sgemm GFLOP/s, fastest kernel set | stage / fastest sgemm | target | met? | sgemm GFLOP/s, library's choice | sgemm GFLOP/s in the stage's process | time outside the products | allocs/step | bytes/step (of which output copies) |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %d | %.2f ms (±%.0f%%) | %.1f | %s | %s | ≥ %s | %s | %s | %.1f | %s | %.0f | %s (%s) |\n",
			r.batch, 1e3*stats.Median(r.stageSec), 50*spread(r.stageSec), r.stageGF, gfCell(r.bestGF, r.bestSet), pct(r.ratio), pct(targetAt(r.batch)), yesNo(r.ratio >= targetAt(r.batch)),
			gfCell(r.libGF, r.libSet), r.sgemmGF, pct(r.overheadShare), r.allocs, byteSize(r.bytes), byteSize(r.copyBytes))
	}
	fmt.Fprintf(b, "\n(± is half the spread, max−min over median, of the repetitions.)\n\n")
	if gap := libraryGap(rows); gap != "" {
		fmt.Fprintf(b, "%s\n\n", gap)
	}

	var measured []string
	allMet := true
	for _, r := range rows {
		if r.batch == smallBatch {
			targets = append(targets, targetResult{fmt.Sprintf("stage compute / fastest kernel set's sgemm, 1024-wide layers, micro-batch %d", smallBatch), "≥ " + pct(smallComputeTarget), pct(r.ratio), r.ratio >= smallComputeTarget})
			continue
		}
		measured = append(measured, fmt.Sprintf("%s at %d", pct(r.ratio), r.batch))
		allMet = allMet && r.ratio >= computeTarget
	}
	targets = append(targets, targetResult{"stage compute / fastest kernel set's sgemm, 1024-wide layers, micro-batch ≥ 64", "≥ " + pct(computeTarget), strings.Join(measured, ", "), allMet})
	met := 0
	for _, r := range rows {
		if r.ratio >= targetAt(r.batch) {
			met++
		}
	}
	first := rows[0]
	fmt.Fprintf(b, "The stage reaches %s–%s of the speed of the same products as bare sgemm calls under the fastest kernel set; the targets (%s at micro-batch %d, %s from 64 on) are met at %d of %d micro-batch sizes. ",
		pct(minRatio(rows)), pct(maxRatio(rows)), pct(smallComputeTarget), smallBatch, pct(computeTarget), met, len(rows))
	fmt.Fprintf(b, "The rest of a step (%s of it at micro-batch %d) goes to bias adds, activations and their gradients, the copies of the output and input gradient a step hands to its caller, "+
		"allocation and garbage collection, and gorgonia's tape interpreter. ",
		pct(first.overheadShare), first.batch)
	last := rows[len(rows)-1]
	if last.overheadShare < rows[0].overheadShare {
		fmt.Fprintf(b, "That share falls as micro-batches grow (%s at %d, %s at %d), so the fixed per-step cost matters more than the per-element one. ",
			pct(rows[0].overheadShare), rows[0].batch, pct(last.overheadShare), last.batch)
	} else {
		fmt.Fprintf(b, "That share does not fall as micro-batches grow (%s at %d, %s at %d): the cost is per element (elementwise passes over the activations), not per step. ",
			pct(rows[0].overheadShare), rows[0].batch, pct(last.overheadShare), last.batch)
	}
	maxAllocs := 0.0
	for _, r := range rows {
		maxAllocs = max(maxAllocs, r.allocs)
	}
	fmt.Fprintf(b, "In steady state a step makes at most %.0f allocations; ", maxAllocs)
	excess := 0.0
	for _, r := range rows {
		excess = max(excess, r.bytes-r.copyBytes)
	}
	targets = append(targets, targetResult{"no avoidable allocation in a stage's steady state", "none beyond the output and input-gradient copies",
		fmt.Sprintf("up to %s per step beyond them (%.0f allocations per step)", byteSize(max(0, excess)), maxAllocs), excess <= 0.05*last.copyBytes})
	if excess <= 0.05*last.copyBytes {
		fmt.Fprintf(b, "the bytes allocated are essentially the output and input-gradient copies (the caller owns them and may send them while the next micro-batch runs), so nothing avoidable is allocated per step.\n")
	} else {
		w := float64(computeWidth * computeWidth * 4)
		fmt.Fprintf(b, "besides the output and input-gradient copies the caller owns, up to %s per step is allocated inside the engine "+
			"(%.1f times a %dx%d float32 weight matrix). ", byteSize(excess), excess/w, computeWidth, computeWidth)
		if layers := float64(computeLast - computeFirst); excess >= layers*w {
			fmt.Fprintf(b, "That is at least one matrix per layer: gorgonia's compiled tape allocates its intermediate values, such as each layer's weight gradient before it is added to the summed one, "+
				"afresh on every run (a memory profile of `BenchmarkEngineStepAllocs` shows them under its alloc instructions). ")
		}
		fmt.Fprintf(b, "Buffers kept across steps would avoid this allocation; the issue asks for none that is avoidable, so this is not met.\n")
	}
	return nil
}

// writeComputeLimit says what the stage is compared with: sets' sgemm, or
// this process's where no kernel sets were timed.
func writeComputeLimit(b *bytes.Buffer, o *options, sets []*kernelSet, kernels, why string) {
	products := 3 * (computeLast - computeFirst)
	if len(sets) == 0 {
		fmt.Fprintf(b, "The limit is the same %d products as plain `sgemm` calls (gonum `blas32` routed to %s, the kernels gorgonia calls), timed in the same process, interleaved with the stage's repetitions: "+
			"there are no OpenBLAS kernel sets to compare here (%s). ", products, iblas.Name(), iblas.Describe(0))
		return
	}
	var names, refused []string
	for _, s := range sets {
		if s.policy != "library" {
			names = append(names, s.policy)
		}
		if s.err != "" {
			refused = append(refused, fmt.Sprintf("%s (%s)", s.policy, s.err))
		}
	}
	fmt.Fprintf(b, "The limit is the same %d products as plain `sgemm` calls (gonum `blas32` routed to OpenBLAS, the kernels gorgonia calls) under the fastest kernel set this machine's OpenBLAS has for its CPU (%s): "+
		"the library's own choice and each set of the build that `compute.blas_kernels: auto` may choose and the CPU runs (%s). "+
		"Each is timed in a child process that loads it as `PIPETRAIN_COMPUTE_BLAS_KERNELS` asks (`OPENBLAS_CORETYPE` set before OpenBLAS loads, then the self-test; "+
		"a set refused there, or that stops its process, is left out), the sets taking turns, %d rounds of one repetition each, medians. "+
		"So a library that fell back to slow kernels shows as a gap below 100%%, not as a stage at 100%% of an equally slow sgemm. "+
		"The stage computes with this process's kernels, %s (%s); the same products timed in this process, interleaved with the stage's repetitions, give the time outside the products. ",
		products, cores.Host(), strings.Join(names, ", "), o.reps, kernels, why)
	if len(refused) > 0 {
		fmt.Fprintf(b, "Refused: %s. ", strings.Join(refused, "; "))
	}
}

// libraryGap says how fast the library's own choice runs the products
// against the fastest set ("" when it was not timed).
func libraryGap(rows []*computeRow) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	var lib string
	var faster []string
	for _, r := range rows {
		if r.libGF == 0 || r.bestSet == "" {
			return ""
		}
		lib = r.libSet
		x := r.libGF / r.bestGF
		lo, hi = min(lo, x), max(hi, x)
		if r.bestSet != r.libSet && !slices.Contains(faster, r.bestSet) {
			faster = append(faster, r.bestSet)
		}
	}
	s := fmt.Sprintf("Under the library's own choice, %s, the same products run at %s–%s of the fastest set's speed", lib, pct(lo), pct(hi))
	switch {
	case len(faster) == 0:
		return s + ": the library's choice is the fastest set here."
	case hi < fellBack:
		return s + fmt.Sprintf(" (%s): the library fell back below this CPU, and `compute.blas_kernels: auto` computes with a faster set instead.", strings.Join(faster, ", "))
	}
	return s + fmt.Sprintf(" (%s faster at some micro-batches).", strings.Join(faster, ", "))
}

// fellBack is the share of the fastest set's speed below which the library's
// own choice is reported as a fallback rather than as noise between sets.
const fellBack = 0.8

func minRatio(rows []*computeRow) float64 {
	x := rows[0].ratio
	for _, r := range rows {
		x = min(x, r.ratio)
	}
	return x
}

func maxRatio(rows []*computeRow) float64 {
	x := rows[0].ratio
	for _, r := range rows {
		x = max(x, r.ratio)
	}
	return x
}

func measureCompute(o *options, m *models.Model, mb int) (*computeRow, error) {
	e, err := engine.NewEngine(m, computeFirst, computeLast, mb, 1, engine.Options{})
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, uint64(mb)))
	x := randomTensor(rng, e.InShape())
	g := randomTensor(rng, e.OutShape())
	step := func() error {
		if _, err := e.Forward(0, x, nil); err != nil {
			return err
		}
		_, err := e.Backward(0, g)
		return err
	}

	// The same products as plain sgemm calls, on buffers of the same shapes.
	if mb == 64 {
		logf("sgemm through %T", G.WhichBLAS())
	}
	gemms := stageProducts(rng, mb)
	n := computeWidth
	layers := computeLast - computeFirst

	r := &computeRow{batch: mb, flops: float64(3*layers) * 2 * float64(mb) * float64(n) * float64(n)}
	r.copyBytes = float64(2 * mb * n * 4) // Forward's output and Backward's input gradient, float32
	// Warm up both, and size the loops so one repetition takes about repTime.
	kStage, err := loopSize(step)
	if err != nil {
		return nil, err
	}
	kGemm, _ := loopSize(gemms)
	for range o.reps {
		s, err := timeLoop(step, kStage)
		if err != nil {
			return nil, err
		}
		r.stageSec = append(r.stageSec, s)
		s, _ = timeLoop(gemms, kGemm)
		r.sgemmSec = append(r.sgemmSec, s)
	}
	// Allocations in steady state (after the warm-up above).
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range kStage {
		if err := step(); err != nil {
			return nil, err
		}
	}
	runtime.ReadMemStats(&after)
	r.allocs = float64(after.Mallocs-before.Mallocs) / float64(kStage)
	r.bytes = float64(after.TotalAlloc-before.TotalAlloc) / float64(kStage)

	st, sg := stats.Median(r.stageSec), stats.Median(r.sgemmSec)
	r.stageGF, r.sgemmGF = r.flops/st/1e9, r.flops/sg/1e9
	r.overheadShare = max(0, 1-sg/st)
	return r, nil
}

// stageProducts are the stage's matrix products at micro-batch mb as plain
// sgemm calls (gonum's blas32 routed to the BLAS gorgonia uses), on buffers
// of the same shapes: per layer x·W forward, then xᵀ·dy and dy·Wᵀ backward.
func stageProducts(rng *rand.Rand, mb int) func() error {
	blas32.Use(G.WhichBLAS())
	n := computeWidth
	type bufs struct{ x, w, y, dy, dw, dx blas32.General }
	ls := make([]bufs, computeLast-computeFirst)
	for i := range ls {
		ls[i] = bufs{
			x: randomGeneral(rng, mb, n), w: randomGeneral(rng, n, n), y: randomGeneral(rng, mb, n),
			dy: randomGeneral(rng, mb, n), dw: randomGeneral(rng, n, n), dx: randomGeneral(rng, mb, n),
		}
	}
	return func() error {
		for i := range ls { // forward: y = x·W
			blas32.Gemm(blas.NoTrans, blas.NoTrans, 1, ls[i].x, ls[i].w, 0, ls[i].y)
		}
		for i := len(ls) - 1; i >= 0; i-- { // backward: dW += xᵀ·dy, dx = dy·Wᵀ
			blas32.Gemm(blas.Trans, blas.NoTrans, 1, ls[i].x, ls[i].dy, 1, ls[i].dw)
			blas32.Gemm(blas.NoTrans, blas.Trans, 1, ls[i].dy, ls[i].w, 0, ls[i].dx)
		}
		return nil
	}
}

// loopSize warms f up and returns how many calls take about repTime.
func loopSize(f func() error) (int, error) {
	for range 2 {
		if err := f(); err != nil {
			return 0, err
		}
	}
	t0 := time.Now()
	k := 0
	for time.Since(t0) < repTime/5 || k < 2 {
		if err := f(); err != nil {
			return 0, err
		}
		k++
	}
	per := time.Since(t0) / time.Duration(k)
	return max(3, int(repTime/per)), nil
}

// timeLoop returns the mean seconds per call of k calls of f.
func timeLoop(f func() error, k int) (float64, error) {
	t0 := time.Now()
	for range k {
		if err := f(); err != nil {
			return 0, err
		}
	}
	return time.Since(t0).Seconds() / float64(k), nil
}

func randomTensor(r *rand.Rand, shape tensor.Shape) *tensor.Dense {
	d := make([]float32, shape.TotalSize())
	for i := range d {
		d[i] = r.Float32()*2 - 1
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(d))
}

func randomGeneral(r *rand.Rand, rows, cols int) blas32.General {
	d := make([]float32, rows*cols)
	for i := range d {
		d[i] = (r.Float32()*2 - 1) / 32
	}
	return blas32.General{Rows: rows, Cols: cols, Stride: cols, Data: d}
}

func byteSize(x float64) string {
	switch {
	case x >= 1<<20:
		return fmt.Sprintf("%.2f MiB", x/(1<<20))
	case x >= 1<<10:
		return fmt.Sprintf("%.1f KiB", x/(1<<10))
	}
	return fmt.Sprintf("%.0f B", x)
}
