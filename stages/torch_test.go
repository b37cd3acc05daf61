package stages

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/testenv"
	"github.com/pipetrain/pipetrain/models"
)

// The tests here hold pipetrain's weights against PyTorch itself (Debian's
// python3-torch, testenv.Python), with the scripts of testdata/pytorch.

// runTorch runs one of the scripts of testdata/pytorch.
func runTorch(t *testing.T, script string, args ...string) {
	t.Helper()
	testenv.RunPython(t, filepath.Join("testdata", "pytorch", script), args...)
}

// pipetrainLogits runs the model of c, with the final weights of the run in
// dir, forward on x and returns its logits.
func pipetrainLogits(t *testing.T, c *configs.Config, dir string, x *tensor.Dense) []float64 {
	t.Helper()
	m, err := models.Build(c.Model)
	if err != nil {
		t.Fatal(err)
	}
	batch := x.Shape()[0]
	e, err := engine.NewEngine(m, 0, len(m.Layers), batch, c.Train.Seed, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := readWeights(t, dir)
	for _, p := range e.Params() {
		if err := checkpoint.CopyInto(w, p.Name(), p.Shape(), p.Value().Data()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Forward(0, x, make([]int, batch*m.Targets())); err != nil {
		t.Fatal(err)
	}
	logits, err := e.Logits()
	if err != nil {
		t.Fatal(err)
	}
	return append([]float64(nil), engine.Float64s(logits)...)
}

// randomInput is a batch of examples for c's model: features in [0, 1), or
// token ids for a GPT.
func randomInput(c *configs.Config, batch int) *tensor.Dense {
	m, _ := models.Build(c.Model)
	shape := append(tensor.Shape{batch}, m.Example...)
	x := tensor.New(tensor.Of(m.DType), tensor.WithShape(shape...))
	r := rand.New(rand.NewPCG(3, 4))
	for i := range shape.TotalSize() {
		v := r.Float64()
		if c.Model.Name == "gpt" {
			v = float64(r.IntN(c.Model.Vocab))
		}
		switch d := x.Data().(type) {
		case []float32:
			d[i] = float32(v)
		case []float64:
			d[i] = v
		}
	}
	return x
}

func readTensor(t *testing.T, path, name string) checkpoint.Tensor {
	t.Helper()
	ts, _, err := checkpoint.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		if x.Name == name {
			return x
		}
	}
	t.Fatalf("%s: no tensor %s", path, name)
	return checkpoint.Tensor{}
}

func values(x checkpoint.Tensor) []float64 {
	if x.F64 != nil {
		return x.F64
	}
	out := make([]float64, len(x.F32))
	for i, v := range x.F32 {
		out[i] = float64(v)
	}
	return out
}

// maxDiff is the largest |got[i] - want[i]|.
func maxDiff(got, want []float64) float64 {
	d := 0.0
	for i := range min(len(got), len(want)) {
		d = max(d, math.Abs(got[i]-want[i]))
	}
	return d
}

// near reports the first of got that is not within tol of want.
func near(got, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d values, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > tol || math.IsNaN(got[i]) != math.IsNaN(want[i]) {
			return fmt.Errorf("[%d] = %v, want %v (within %g)", i, got[i], want[i], tol)
		}
	}
	return nil
}

// TestPyTorchLoadsExports trains each model a few steps in pipetrain,
// exports it, and has PyTorch load the export into the module
// docs/weights.md defines (strictly: every tensor a parameter of the
// module, in its shape): its logits on the same input are pipetrain's.
func TestPyTorchLoadsExports(t *testing.T) {
	testenv.NeedTorch(t)
	gpt := func(tied bool) *configs.Config {
		c := gptConfig("1f1b", plain("0-1", "2-4"), tied)
		c.Model.DType = "float32"
		return c
	}
	cases := map[string]*configs.Config{
		"mlp":        testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam"),
		"cnn":        cnnConfig(plain("0", "1-2")),
		"gpt":        gpt(false),
		"gpt (tied)": gpt(true),
	}
	dir := t.TempDir()
	var args []string
	want := map[string][]float64{}
	for name, c := range cases {
		c.Train.Steps = 3
		run := runInProcess(t, c, false)
		export := filepath.Join(dir, name+".safetensors")
		if _, err := Export(c, run, FinalWeights, export); err != nil {
			t.Fatal(err)
		}
		x := randomInput(c, 3)
		want[name] = pipetrainLogits(t, c, run, x)
		input := filepath.Join(dir, name+".input.safetensors")
		if err := checkpoint.Write(input, []checkpoint.Tensor{denseTensor("x", x)}, nil); err != nil {
			t.Fatal(err)
		}
		args = append(args, export, input, filepath.Join(dir, name+".logits.safetensors"))
	}
	runTorch(t, "forward.py", args...)
	for name := range cases {
		got := values(readTensor(t, filepath.Join(dir, name+".logits.safetensors"), "logits"))
		if err := near(got, want[name], 1e-5); err != nil {
			t.Errorf("%s: PyTorch's logits from the export: %v", name, err)
		}
		t.Logf("%s: %d logits, largest |pipetrain - PyTorch| %.3g", name, len(got), maxDiff(got, want[name]))
	}
}

// TestSGDStepMatchesPyTorch starts pipetrain from an MLP that PyTorch
// initialised (train.init_from) and takes one SGD step on the batch PyTorch
// takes its step on: the loss and the new weights are PyTorch's to float32
// rounding, within 1e-5. Not bit for bit: pipetrain sums the gradient and
// the loss over 4 micro-batches and PyTorch over the whole batch at once,
// and their matrix products add in orders of their own (about 1e-8 apart).
func TestSGDStepMatchesPyTorch(t *testing.T) { sgdStepAgainstPyTorch(t, 0) }

// TestClippedSGDStepMatchesPyTorch is TestSGDStepMatchesPyTorch with the
// gradients clipped by their global norm across the two stages
// (train.clip_grad_norm) and PyTorch's clipped by clip_grad_norm_ before
// its step: the norms agree within 1e-5 relative, the limit is below the
// norm (the step is clipped), and the new weights are PyTorch's.
func TestClippedSGDStepMatchesPyTorch(t *testing.T) { sgdStepAgainstPyTorch(t, 0.05) }

// sgdStepAgainstPyTorch runs the one-step comparison, clipping the
// gradients to clip when it is above 0.
func sgdStepAgainstPyTorch(t *testing.T, clip float64) {
	testenv.NeedTorch(t)
	dir := t.TempDir()
	c := testConfig("1f1b", plain("0-1", "2-3"), 4, "float32", "sgd")
	// One batch of every example runStagesIn trains on: PyTorch's batch.
	train := synthetic(96, 8, 3, 1)
	c.Data.BatchSize = train.N
	c.Train.Steps, c.Train.Evaluate = 1, false
	c.Train.Optimizer.LR, c.Train.Optimizer.Momentum = 0.5, 0
	y := make([]float32, train.N)
	for i, l := range train.Labels {
		y[i] = float32(l)
	}
	data := filepath.Join(dir, "batch.safetensors")
	if err := checkpoint.Write(data, []checkpoint.Tensor{
		{Name: "x", Shape: []int{train.N, train.Dim}, F32: train.Images},
		{Name: "y", Shape: []int{train.N}, F32: y},
	}, nil); err != nil {
		t.Fatal(err)
	}
	sizes := []string{strconv.Itoa(c.Model.Input)}
	for _, h := range append(append([]int(nil), c.Model.Hidden...), c.Model.Classes) {
		sizes = append(sizes, strconv.Itoa(h))
	}
	init, after := filepath.Join(dir, "init.safetensors"), filepath.Join(dir, "after.safetensors")
	args := []string{data, strings.Join(sizes, ","), fmt.Sprint(c.Train.Optimizer.LR), init, after}
	if clip > 0 {
		args = append(args, fmt.Sprint(clip))
	}
	runTorch(t, "sgd_step.py", args...)

	c.Train.InitFrom, c.Train.ClipGradNorm = init, clip
	run := runInProcess(t, c, false)

	ms, err := ReadMetrics(filepath.Join(run, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := checkpoint.ReadMeta(after)
	if err != nil {
		t.Fatal(err)
	}
	torchLoss, err := strconv.ParseFloat(meta["loss"], 64)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(ms[0].Loss-torchLoss) > 1e-5 {
		t.Errorf("loss %v, PyTorch's %v", ms[0].Loss, torchLoss)
	}
	if clip > 0 {
		torchNorm, err := strconv.ParseFloat(meta["grad_norm"], 64)
		if err != nil || ms[0].GradNorm == nil {
			t.Fatalf("norms: PyTorch's %q (%v), pipetrain's %v", meta["grad_norm"], err, ms[0].GradNorm)
		}
		if math.Abs(*ms[0].GradNorm-torchNorm) > 1e-5*torchNorm || torchNorm <= clip {
			t.Errorf("gradient norm %v, PyTorch's %v (the limit %v must be below it)", *ms[0].GradNorm, torchNorm, clip)
		}
		t.Logf("gradient norm %v, PyTorch's %v", *ms[0].GradNorm, torchNorm)
	}
	t.Logf("loss %v, PyTorch's %v", ms[0].Loss, torchLoss)
	m, err := models.Build(c.Model)
	if err != nil {
		t.Fatal(err)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := checkpoint.ToTorch(params, readWeights(t, run), nil)
	if err != nil {
		t.Fatal(err)
	}
	moved, worst := false, 0.0
	for _, w := range mine {
		torchW := values(readTensor(t, after, w.Name))
		if err := near(values(w), torchW, 1e-5); err != nil {
			t.Errorf("%s after one step: %v", w.Name, err)
		}
		worst = max(worst, maxDiff(values(w), torchW))
		if near(values(readTensor(t, init, w.Name)), torchW, 1e-4) != nil {
			moved = true
		}
	}
	if !moved {
		t.Error("the step left every weight within 1e-4 of its initial value: the comparison shows nothing")
	}
	t.Logf("%d tensors after the step, largest |pipetrain - PyTorch| %.3g", len(mine), worst)
}

// TestDocsShowTheTestedModules: the PyTorch modules docs/weights.md gives
// users to copy are the ones the tests above load exports into.
func TestDocsShowTheTestedModules(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "weights.md"))
	if err != nil {
		t.Fatal(err)
	}
	tested, err := os.ReadFile(filepath.Join("testdata", "pytorch", "modules.py"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```python\n")
	if block, _, _ = strings.Cut(block, "```"); !ok || block != string(tested) {
		t.Errorf("the first python block of docs/weights.md is not testdata/pytorch/modules.py; copy the file into the doc")
	}
}
