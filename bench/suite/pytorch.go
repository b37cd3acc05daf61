package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	iblas "github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
)

// The pytorch section trains the same models in pipetrain and in PyTorch
// (Debian's python3-torch, on the same OpenBLAS), taking turns:
//
//   - one process: the MLPs in `pipetrain reference` against
//     bench/pytorch/mlp.py (the same layer sizes, global batch, micro-batch
//     split and SGD with momentum, 1 and 2 BLAS threads), and the GPT of
//     configs/gpt-small-4stage.yaml against bench/pytorch/gpt.py (the same
//     model, batch, micro-batches and Adam, 1 BLAS thread);
//   - four processes: the MLPs as 4-stage pipelines, `pipetrain launch` (1F1B)
//     against bench/pytorch/pipeline.py (torch.distributed over gloo, GPipe),
//     the same split, one BLAS thread per process.

// torchMLP is one model of the comparison.
type torchMLP struct {
	label  string
	hidden []int
	batch  int
	micro  int // micro-batches per step
	steps  int // per run, warm-up included
}

var torchMLPs = []torchMLP{
	{"a: 784-1024×8-10, B=256, m=8", []int{1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 256, 8, 50},
	{"b: 784-512×4-10, B=128, m=4", []int{512, 512, 512, 512}, 128, 4, 150},
}

const (
	torchScript         = "bench/pytorch/mlp.py"
	torchGPTScript      = "bench/pytorch/gpt.py"
	torchPipelineScript = "bench/pytorch/pipeline.py"
	// torchGPTConfig is the GPT both sides train; gpt.py hard-codes its shape.
	torchGPTConfig = "configs/gpt-small-4stage.yaml"
	torchGPTSteps  = 40
	// torchLlamaConfig is the Llama both sides train, which llama.py
	// builds by default; a step takes seconds, so runs are short.
	torchLlamaConfig = "configs/bench-llama-10m.yaml"
	torchLlamaScript = "bench/pytorch/llama.py"
	torchLlamaSteps  = 12
	torchLlamaTarget = 1.0
	torchLlamaReps   = 7
	torchStages      = 4 // processes of the pipeline comparison
	// The targets: pipetrain against PyTorch in one process, on the MLPs
	// (1 and 2 BLAS threads) and the GPT (1), and as 4-stage pipelines on
	// the MLPs.
	torchSingleTarget   = 1.0
	torchGPTTarget      = 1.0
	torchPipelineTarget = 1.3
	// torchTimeout bounds one PyTorch run (the pipeline's launcher kills its
	// stage processes when it is stopped).
	torchTimeout = 10 * time.Minute
)

// torchPython finds a python3 that imports torch: Debian's first (a
// version manager's python3 on PATH may lack it).
func torchPython() (string, error) {
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import torch").Run() == nil {
			return py, nil
		}
	}
	return "", fmt.Errorf("no python3 with torch (apt-get install python3-torch; make bench installs it)")
}

// torchPair is one row's figures, per repetition: PyTorch as installed
// (theirs) and, in one process, with pipetrain's kernel set (same).
type torchPair struct{ ours, theirs, ratios, same, sameRatios []float64 }

func (p *torchPair) add(ours, theirs float64) {
	p.ours, p.theirs, p.ratios = append(p.ours, ours), append(p.theirs, theirs), append(p.ratios, ours/theirs)
}

// addSame records PyTorch's samples/s with pipetrain's kernels, beside the
// repetition add recorded last.
func (p *torchPair) addSame(same float64) {
	p.same, p.sameRatios = append(p.same, same), append(p.sameRatios, p.ours[len(p.ours)-1]/same)
}

func (p *torchPair) ratio() float64 { return stats.Median(p.ratios) }

// rowSame is row with PyTorch on pipetrain's kernels beside it ("–" where
// it was not run).
func (p *torchPair) rowSame(b *bytes.Buffer, cells ...string) {
	same, ratio := "–", "–"
	if len(p.same) > 0 {
		same, ratio = samplesRate(stats.Median(p.same)), fmt.Sprintf("%.2f×", stats.Median(p.sameRatios))
	}
	fmt.Fprintf(b, "| %s | %s | %s | %.2f× | %s | %s |\n", strings.Join(cells, " | "), samplesRate(stats.Median(p.ours)), samplesRate(stats.Median(p.theirs)), p.ratio(), same, ratio)
}

// torchKernelsEnv is the environment that gives PyTorch the kernel set
// pipetrain computes with (Debian's torch calls the same OpenBLAS), nil
// where pipetrain computes without OpenBLAS's kernel sets.
func torchKernelsEnv() []string {
	if core, _ := iblas.Kernels(); core != "" {
		return []string{"OPENBLAS_CORETYPE=" + core}
	}
	return nil
}

func (p *torchPair) row(b *bytes.Buffer, cells ...string) {
	fmt.Fprintf(b, "| %s | %s | %s | %.2f× |\n", strings.Join(cells, " | "), samplesRate(stats.Median(p.ours)), samplesRate(stats.Median(p.theirs)), p.ratio())
}

// samplesRate prints samples/s with at least three significant digits:
// a Llama's few samples a second would otherwise all round to the same
// integer and hide the difference the ratio beside them reports.
func samplesRate(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func runPyTorch(o *options, b *bytes.Buffer) error {
	py, err := torchPython()
	if err != nil {
		return err
	}
	version, _ := exec.Command(py, "-c", "import torch; print(torch.__version__)").Output()
	reps := 3
	if o.quick {
		reps = 1
	}
	dir, err := os.MkdirTemp("", "pipetrain-torch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	steps := func(n int) int {
		if o.quick {
			return max(o.skip+5, n/5)
		}
		return max(o.skip+5, n)
	}
	bases := make([]string, len(torchMLPs))
	splits := make([][]string, len(torchMLPs))
	for i, m := range torchMLPs {
		if bases[i], err = writeTorchBase(dir, m); err != nil {
			return err
		}
		cfg, err := configs.Load(bases[i])
		if err != nil {
			return err
		}
		model, err := models.Build(cfg.Model)
		if err != nil {
			return err
		}
		splits[i] = balancedSplit(model, torchStages)
	}
	gptCfg, err := configs.Load(torchGPTConfig)
	if err != nil {
		return err
	}
	gptSteps := max(o.skip+5, torchGPTSteps)
	if o.quick {
		gptSteps = max(o.skip+5, torchGPTSteps/4)
	}

	// One process, the MLPs at 1 and 2 BLAS threads, then the GPT at 1;
	// PyTorch as installed, then with pipetrain's kernels.
	kenv := torchKernelsEnv()
	single := make([][2]torchPair, len(torchMLPs))
	for i, m := range torchMLPs {
		for t, threads := range []int{1, 2} {
			for range reps {
				rc := runConfig{base: bases[i], steps: steps(m.steps), env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=" + strconv.Itoa(threads)}}
				sps, _, err := samplesPerSec(o, "reference", rc)
				if err != nil {
					return err
				}
				tps, err := torchSamplesPerSec(py, torchScript, torchMLPArgs(m, steps(m.steps), o.skip), threads)
				if err != nil {
					return err
				}
				single[i][t].add(sps, tps)
				same := math.NaN()
				if kenv != nil {
					if same, err = torchSamplesPerSec(py, torchScript, torchMLPArgs(m, steps(m.steps), o.skip), threads, kenv...); err != nil {
						return err
					}
					single[i][t].addSame(same)
				}
				logf("pytorch %s, %d thread(s): pipetrain %.0f samples/s, PyTorch %.0f, PyTorch with pipetrain's kernels %.0f", m.label, threads, sps, tps, same)
			}
		}
	}
	gpt, err := lmAgainstTorch(o, py, "GPT", torchGPTConfig, torchGPTScript, gptCfg, gptSteps, o.skip, reps, kenv)
	if err != nil {
		return err
	}
	llamaCfg, err := configs.Load(torchLlamaConfig)
	if err != nil {
		return err
	}
	llamaSteps, llamaSkip := torchLlamaSteps, min(o.skip, torchLlamaSteps/3)
	if o.quick {
		llamaSteps = llamaSkip + 4
	}
	// The Llama's target is a median of alternating rounds near 1.0×, so it
	// takes more rounds than the other rows: a single pair swings ±40% on a
	// shared machine.
	llamaReps := reps
	if !o.quick {
		llamaReps = torchLlamaReps
	}
	llama, err := lmAgainstTorch(o, py, "Llama", torchLlamaConfig, torchLlamaScript, llamaCfg, llamaSteps, llamaSkip, llamaReps, kenv)
	if err != nil {
		return err
	}

	// Four processes: the MLPs as 4-stage pipelines.
	pipes := make([]torchPair, len(torchMLPs))
	for rep := range reps {
		for i, m := range torchMLPs {
			n := steps(m.steps)
			rc := runConfig{base: bases[i], steps: n, layers: splits[i], schedule: "1f1b", env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
			sps, _, err := samplesPerSec(o, "launch", rc)
			if err != nil {
				return fmt.Errorf("launch of %s: %w", m.label, err)
			}
			args := append(torchMLPArgs(m, n, o.skip), "--stages", strconv.Itoa(torchStages), "--split", strings.Join(splits[i], ","),
				"--timeout", strconv.Itoa(int(torchTimeout.Seconds())))
			tps, err := torchSamplesPerSec(py, torchPipelineScript, args, 1)
			if err != nil {
				return err
			}
			pipes[i].add(sps, tps)
			logf("pytorch pipeline rep %d, %s: pipetrain launch %.0f samples/s, PyTorch gloo %.0f", rep+1, m.label, sps, tps)
		}
	}

	fmt.Fprintf(b, "pipetrain against PyTorch %s, taking turns, %d repetition(s), medians, each ratio taken per repetition; each run's figure is the batch over its median step time after %d warm-up steps "+
		"(pipetrain's from the last stage's `metrics.jsonl`, evaluation and checkpoints off). PyTorch runs with the same number of BLAS threads per process "+
		"(`torch.set_num_threads`, `OPENBLAS_NUM_THREADS` and `OMP_NUM_THREADS`, with `OMP_WAIT_POLICY=PASSIVE`: OpenMP's spinning workers otherwise starve OpenBLAS's threads on two cores) "+
		"and trains on random inputs of the same shapes (a step's time does not depend on the data); pipetrain on Fashion-MNIST and, for the GPT, on the Go sources of package `strings`.\n\n",
		strings.TrimSpace(string(version)), reps, o.skip)
	fmt.Fprintf(b, "### One process\n\n")
	fmt.Fprintf(b, "`pipetrain reference` against `%s` on the same MLP, global batch, micro-batch split and SGD with momentum (the micro-batch gradients summed, the loss their mean), %d steps a run for a and %d for b, "+
		"and against `%s` on the GPT of `%s` (%s), its global batch of %d windows of %d tokens in %d micro-batches and Adam (lr %g), %d steps a run, 1 BLAS thread. A GPT sample is one window.\n\n",
		torchScript, steps(torchMLPs[0].steps), steps(torchMLPs[1].steps), torchGPTScript, torchGPTConfig, describeGPT(gptCfg.Model),
		gptCfg.Data.BatchSize, gptCfg.Model.Context, gptCfg.Data.MicroBatches, gptCfg.Train.Optimizer.LR, gptSteps)
	writeTorchKernels(b, kenv)
	fmt.Fprintln(b, "| model | BLAS threads | pipetrain (samples/s) | PyTorch as installed (samples/s) | pipetrain / PyTorch | PyTorch, pipetrain's kernels (samples/s) | pipetrain / PyTorch, same kernels |")
	fmt.Fprintln(b, "|---|---|---|---|---|---|---|")
	lo, hi := math.Inf(1), math.Inf(-1)
	slo, shi := math.Inf(1), math.Inf(-1) // against PyTorch on pipetrain's kernels
	var singleMeasured []string
	for i, m := range torchMLPs {
		for t, threads := range []int{1, 2} {
			r := single[i][t].ratio()
			lo, hi = min(lo, r), max(hi, r)
			if p := single[i][t]; len(p.same) > 0 {
				slo, shi = min(slo, stats.Median(p.sameRatios)), max(shi, stats.Median(p.sameRatios))
			}
			single[i][t].rowSame(b, m.label, strconv.Itoa(threads))
			singleMeasured = append(singleMeasured, fmt.Sprintf("%s %d thread(s) %.2f×", strings.SplitN(m.label, ":", 2)[0], threads, r))
		}
	}
	gpt.rowSame(b, fmt.Sprintf("GPT: %s, B=%d, m=%d", filepath.Base(torchGPTConfig), gptCfg.Data.BatchSize, gptCfg.Data.MicroBatches), "1")
	llama.rowSame(b, fmt.Sprintf("Llama: %s, B=%d, m=%d", filepath.Base(torchLlamaConfig), llamaCfg.Data.BatchSize, llamaCfg.Data.MicroBatches), "1")
	fmt.Fprintf(b, "\nThe Llama row: `%s` (%s) against `%s`, the same model written with Hugging Face's LlamaForCausalLM formulas in eager PyTorch, "+
		"%d windows of %d tokens in %d micro-batches, Adam (lr %g), %d steps a run of which %d warm up, 1 BLAS thread, %d repetition(s) taking turns.\n",
		torchLlamaConfig, describeLlama(llamaCfg.Model), torchLlamaScript, llamaCfg.Data.BatchSize, llamaCfg.Model.Context, llamaCfg.Data.MicroBatches,
		llamaCfg.Train.Optimizer.LR, llamaSteps, llamaSkip, llamaReps)

	fmt.Fprintf(b, "\n### 4-process pipelines\n\n")
	fmt.Fprintf(b, "The same MLPs, batches and micro-batches as %d-stage pipelines of one process per stage on loopback, one BLAS thread per process, each stage holding an equal number of the layers: "+
		"`pipetrain launch` (1F1B, gRPC) against `%s` (torch.distributed with the gloo backend, a fill-drain GPipe schedule: every micro-batch's forward, activations sent on with `isend`, "+
		"then every backward, gradients sent back, then each stage's SGD step). The two schedules have the same bubble, (p−1)/(m+p−1) of a step; 1F1B holds fewer activations. "+
		"PyTorch's step is rank 0's, from the start of one step to the start of the next. On this %d-core machine the four processes of either side share the cores.\n\n",
		torchStages, torchPipelineScript, runtime.NumCPU())
	fmt.Fprintln(b, "| model | stages (layers) | pipetrain launch (samples/s) | PyTorch gloo (samples/s) | pipetrain / PyTorch |")
	fmt.Fprintln(b, "|---|---|---|---|---|")
	plo, phi := math.Inf(1), math.Inf(-1)
	var pipeMeasured []string
	for i, m := range torchMLPs {
		r := pipes[i].ratio()
		plo, phi = min(plo, r), max(phi, r)
		pipes[i].row(b, m.label, strings.Join(splits[i], " + "))
		pipeMeasured = append(pipeMeasured, fmt.Sprintf("%s %.2f×", strings.SplitN(m.label, ":", 2)[0], r))
	}

	fmt.Fprintf(b, "\nIn one process pipetrain reaches %s of PyTorch's samples/s on these MLPs, %.2f× on the GPT and %.2f× on the Llama", span(lo, hi), gpt.ratio(), llama.ratio())
	if len(gpt.same) > 0 {
		fmt.Fprintf(b, " (%s and %.2f× against PyTorch on the same kernels)", span(slo, shi), stats.Median(gpt.sameRatios))
	}
	fmt.Fprintf(b, "; as 4-process pipelines, %s on the MLPs. Where a pipetrain step goes is in the section above.\n\n", span(plo, phi))
	targets = append(targets,
		targetResult{"pipetrain one process / PyTorch one process, both MLPs, 1 and 2 BLAS threads", fmt.Sprintf("≥ %.1f×", torchSingleTarget), strings.Join(singleMeasured, ", "), lo >= torchSingleTarget},
		targetResult{"pipetrain one process / PyTorch one process, GPT, 1 thread", fmt.Sprintf("≥ %.1f×", torchGPTTarget), fmt.Sprintf("%.2f×", gpt.ratio()), gpt.ratio() >= torchGPTTarget},
		targetResult{"pipetrain one process / PyTorch one process, Llama of about 10M parameters, 1 thread", fmt.Sprintf("≥ %.1f×", torchLlamaTarget), fmt.Sprintf("%.2f×", llama.ratio()), llama.ratio() >= torchLlamaTarget},
		targetResult{"4-stage pipeline / PyTorch 4-process pipeline, both MLPs", fmt.Sprintf("≥ %.1f×", torchPipelineTarget), strings.Join(pipeMeasured, ", "), plo >= torchPipelineTarget},
	)
	return nil
}

// writeTorchKernels says which kernels the two PyTorch columns compute with.
func writeTorchKernels(b *bytes.Buffer, kenv []string) {
	core, why := iblas.Kernels()
	if kenv == nil {
		fmt.Fprintf(b, "pipetrain computes without OpenBLAS's kernel sets here (%s), so PyTorch runs only as installed.\n\n", iblas.Describe(0))
		return
	}
	fmt.Fprintf(b, "pipetrain computes with OpenBLAS's %s kernels (%s). PyTorch runs as installed, whose OpenBLAS picks its kernels itself, "+
		"and again with `%s`, the same kernels: where the library falls back below the CPU, the first measures that fallback as much as PyTorch, "+
		"and the second compares the two frameworks on equal products.\n\n", core, why, strings.Join(kenv, " "))
}

// span writes a range of ratios, or one ratio when both ends round alike.
func span(lo, hi float64) string {
	if fmt.Sprintf("%.2f", lo) == fmt.Sprintf("%.2f", hi) {
		return fmt.Sprintf("%.2f×", lo)
	}
	return fmt.Sprintf("%.2f× to %.2f×", lo, hi)
}

// lmAgainstTorch trains the language model of config in `pipetrain
// reference` and script its PyTorch twin, reps times taking turns, one BLAS
// thread, PyTorch also on pipetrain's kernels when kenv is set.
func lmAgainstTorch(o *options, py, label, config, script string, cfg *configs.Config, steps, skip, reps int, kenv []string) (torchPair, error) {
	var pair torchPair
	ro := *o
	ro.skip = skip
	for range reps {
		rc := runConfig{base: config, steps: steps, env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
		sps, _, err := samplesPerSec(&ro, "reference", rc)
		if err != nil {
			return pair, fmt.Errorf("reference of %s: %w", config, err)
		}
		args := []string{"--batch", strconv.Itoa(cfg.Data.BatchSize), "--micro-batches", strconv.Itoa(cfg.Data.MicroBatches),
			"--steps", strconv.Itoa(steps), "--skip", strconv.Itoa(skip), "--lr", strconv.FormatFloat(cfg.Train.Optimizer.LR, 'g', -1, 64)}
		tps, err := torchSamplesPerSec(py, script, args, 1)
		if err != nil {
			return pair, err
		}
		pair.add(sps, tps)
		same := math.NaN()
		if kenv != nil {
			if same, err = torchSamplesPerSec(py, script, args, 1, kenv...); err != nil {
				return pair, err
			}
			pair.addSame(same)
		}
		logf("pytorch %s, 1 thread: pipetrain %.1f samples/s, PyTorch %.1f, PyTorch with pipetrain's kernels %.1f", label, sps, tps, same)
	}
	return pair, nil
}

func describeLlama(s models.Spec) string {
	return fmt.Sprintf("%d blocks of hidden size %d, %d query heads sharing %v key and value heads, SwiGLU of %v, context %d, vocabulary %d",
		s.Layers, s.Width, s.Heads, s.Own["kv_heads"], s.Own["intermediate"], s.Context, s.Vocab)
}

func describeGPT(s models.Spec) string {
	return fmt.Sprintf("%d blocks of width %d, %d heads, context %d, vocabulary %d, head tied to the embedding: %d parameters, as `%s` asserts",
		s.Layers, s.Width, s.Heads, s.Context, s.Vocab, 220544, torchGPTScript)
}

// writeTorchBase writes the pipetrain config of m, for runConfig to derive
// each run's from.
func writeTorchBase(dir string, m torchMLP) (string, error) {
	hidden := make([]string, len(m.hidden))
	for i, h := range m.hidden {
		hidden[i] = strconv.Itoa(h)
	}
	body := fmt.Sprintf(`model: {name: mlp, dtype: float32, input: 784, hidden: [%s], classes: 10}
data: {batch_size: %d, micro_batches: %d}
train: {steps: 10, evaluate: false, optimizer: {name: sgd, lr: 0.05, momentum: 0.9}}
schedule: 1f1b
stages:
  - {layers: "0-%d", address: 127.0.0.1:7001}
  - {layers: "%d-%d", address: 127.0.0.1:7002}
`, strings.Join(hidden, ", "), m.batch, m.micro, len(m.hidden)/2-1, len(m.hidden)/2, len(m.hidden))
	path := filepath.Join(dir, fmt.Sprintf("mlp-%d.yaml", len(m.hidden)))
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// torchMLPArgs are mlp.py's and pipeline.py's flags for m.
func torchMLPArgs(m torchMLP, steps, skip int) []string {
	hidden := make([]string, len(m.hidden))
	for i, h := range m.hidden {
		hidden[i] = strconv.Itoa(h)
	}
	return []string{"--hidden", strings.Join(hidden, ","), "--batch", strconv.Itoa(m.batch),
		"--micro-batches", strconv.Itoa(m.micro), "--steps", strconv.Itoa(steps), "--skip", strconv.Itoa(skip)}
}

// torchSamplesPerSec runs one of bench/pytorch's scripts with args and
// threads BLAS threads (per process) and returns the samples/s it printed.
// env is added to the environment (OPENBLAS_CORETYPE for pipetrain's kernels).
func torchSamplesPerSec(py, script string, args []string, threads int, env ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), torchTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, append([]string{script}, append(args, "--threads", strconv.Itoa(threads))...)...)
	// SIGTERM first: pipeline.py's launcher then kills its stage processes.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	// torch.set_num_threads sizes PyTorch's own pool, not OpenBLAS's, which
	// otherwise takes every core: both get the count. With two pools on
	// two cores, OpenMP's spinning workers starve OpenBLAS's (a 2-thread
	// step measured 2.7× slower than a 1-thread one here): they sleep.
	n := strconv.Itoa(threads)
	cmd.Env = append(append(os.Environ(), "OPENBLAS_NUM_THREADS="+n, "OMP_NUM_THREADS="+n, "OMP_WAIT_POLICY=PASSIVE"), env...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return 0, fmt.Errorf("%s: %w\n%s", script, err, tail(ee.Stderr, 2000))
		}
		return 0, fmt.Errorf("%s: %w", script, err)
	}
	var r struct {
		SamplesPerSec float64 `json:"samples_per_sec"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil || r.SamplesPerSec <= 0 {
		return 0, fmt.Errorf("%s printed %q: %v", script, out, err)
	}
	return r.SamplesPerSec, nil
}
