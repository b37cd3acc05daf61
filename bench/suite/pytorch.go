package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/internal/stats"
)

// The pytorch section trains the same MLPs in `pipetrain reference` and in
// PyTorch (Debian's python3-torch, on the same OpenBLAS), taking turns:
// the same layer sizes, global batch, micro-batch split and SGD with
// momentum, one process, 1 and 2 BLAS threads. bench/pytorch/mlp.py is the
// PyTorch side.

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

const torchScript = "bench/pytorch/mlp.py"

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
	fmt.Fprintf(b, "Samples per second of one training process, `pipetrain reference` against PyTorch %s (`%s`), on the same MLP, global batch, micro-batch split and SGD with momentum (the micro-batch gradients summed, the loss their mean), with the same number of BLAS threads (PyTorch's given by `torch.set_num_threads`, `OPENBLAS_NUM_THREADS` and `OMP_NUM_THREADS`, with `OMP_WAIT_POLICY=PASSIVE`: OpenMP's spinning workers otherwise starve OpenBLAS's threads on two cores), taking turns, %d repetition(s), medians; each run's figure is the median step after %d warm-up steps. PyTorch trains on random inputs of the same shapes (a step's time does not depend on the pixels); pipetrain on Fashion-MNIST.\n\n",
		strings.TrimSpace(string(version)), torchScript, reps, o.skip)
	fmt.Fprintln(b, "| model | BLAS threads | pipetrain (samples/s) | PyTorch (samples/s) | pipetrain / PyTorch |")
	fmt.Fprintln(b, "|---|---|---|---|---|")
	dir, err := os.MkdirTemp("", "pipetrain-torch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range torchMLPs {
		steps := m.steps
		if o.quick {
			steps = max(o.skip+5, steps/5)
		}
		base, err := writeTorchBase(dir, m)
		if err != nil {
			return err
		}
		for _, threads := range []int{1, 2} {
			var ours, theirs, ratios []float64
			for range reps {
				rc := runConfig{base: base, steps: steps, env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=" + strconv.Itoa(threads)}}
				sps, _, err := samplesPerSec(o, "reference", rc)
				if err != nil {
					return err
				}
				tps, err := torchSamplesPerSec(py, m, steps, o.skip, threads)
				if err != nil {
					return err
				}
				ours, theirs, ratios = append(ours, sps), append(theirs, tps), append(ratios, sps/tps)
			}
			r := stats.Median(ratios)
			lo, hi = min(lo, r), max(hi, r)
			fmt.Fprintf(b, "| %s | %d | %.0f | %.0f | %.2f× |\n", m.label, threads, stats.Median(ours), stats.Median(theirs), r)
		}
	}
	fmt.Fprintf(b, "\npipetrain reaches %.2f× to %.2f× of PyTorch's samples/s on these MLPs; where a pipetrain step goes is in the section above.\n\n", lo, hi)
	return nil
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

func torchSamplesPerSec(py string, m torchMLP, steps, skip, threads int) (float64, error) {
	hidden := make([]string, len(m.hidden))
	for i, h := range m.hidden {
		hidden[i] = strconv.Itoa(h)
	}
	cmd := exec.Command(py, torchScript, "--hidden", strings.Join(hidden, ","), "--batch", strconv.Itoa(m.batch),
		"--micro-batches", strconv.Itoa(m.micro), "--steps", strconv.Itoa(steps), "--skip", strconv.Itoa(skip), "--threads", strconv.Itoa(threads))
	// torch.set_num_threads sizes PyTorch's own pool, not OpenBLAS's, which
	// otherwise takes every core: both get the count. With two pools on
	// two cores, OpenMP's spinning workers starve OpenBLAS's (a 2-thread
	// step measured 2.7× slower than a 1-thread one here): they sleep.
	n := strconv.Itoa(threads)
	cmd.Env = append(os.Environ(), "OPENBLAS_NUM_THREADS="+n, "OMP_NUM_THREADS="+n, "OMP_WAIT_POLICY=PASSIVE")
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", torchScript, err)
	}
	var r struct {
		SamplesPerSec float64 `json:"samples_per_sec"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return 0, fmt.Errorf("%s printed %q: %w", torchScript, out, err)
	}
	return r.SamplesPerSec, nil
}
