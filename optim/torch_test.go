package optim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// The tests here hold the optimizers against torch.optim itself (Debian's
// python3-torch, testenv.Python), with the scripts of testdata.

// torchParam is one parameter as torch_optim.py reads it.
type torchParam struct {
	Name  string    `json:"name"`
	Shape []int     `json:"shape"`
	Data  []float32 `json:"data"`
}

// torchRun is torch_optim.py's input.
type torchRun struct {
	Spec
	Params []torchParam  `json:"params"`
	Grads  [][][]float32 `json:"grads"`
	LRs    []float64     `json:"lrs"`
}

// torchModelParams are parameters named as pipetrain's models name them,
// of sizes that reach both the vector kernels and their tails.
var torchModelParams = []struct {
	name  string
	shape tensor.Shape
}{
	{"embed.tok", tensor.Shape{5, 4}},
	{"embed.pos", tensor.Shape{3, 4}},
	{"block0.ln1.gain", tensor.Shape{4}},
	{"block0.ln1.bias", tensor.Shape{4}},
	{"block0.attn.q.weight", tensor.Shape{6, 5}},
	{"block0.attn.q.bias", tensor.Shape{5}},
	{"conv0.weight", tensor.Shape{2, 1, 3, 3}},
	{"fc0.weight", tensor.Shape{4, 3}},
	{"fc0.bias", tensor.Shape{3}},
	{"head.ln.gain", tensor.Shape{4}},
	{"head.weight", tensor.Shape{4, 7}},
}

// TestOptimizersMatchPyTorch runs each optimizer, with and without weight
// decay and decay_exclude patterns, for several steps at changing learning
// rates, and holds every parameter after every step against torch.optim's
// SGD, Adam and AdamW given the same gradients and the parameter groups
// nanoGPT builds. Equal to float32 rounding: the two do the same operations
// in different orders (torch divides by the bias corrections, pipetrain
// folds them into the step size and eps).
func TestOptimizersMatchPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	adam := Spec{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}
	with := func(s Spec, name string, lr, wd float64, exclude ...string) Spec {
		s.Name, s.LR, s.WeightDecay, s.DecayExclude = name, lr, wd, exclude
		return s
	}
	specs := []Spec{
		with(adam, "adamw", 0.01, 0.1),
		with(adam, "adamw", 0.01, 0.5, "*.bias", "embed.*"),
		with(adam, "adamw", 0.01, 0),
		with(adam, "adam", 0.01, 0.05),
		with(adam, "adam", 0.003, 0),
		{Name: "sgd", LR: 0.1, Momentum: 0.9, WeightDecay: 0.01},
		{Name: "sgd", LR: 0.1, WeightDecay: 0.2, DecayExclude: []string{"block?.*"}},
		{Name: "sgd", LR: 0.1, Momentum: 0.5},
	}
	const steps = 6
	for _, spec := range specs {
		t.Run(fmt.Sprintf("%s wd %v exclude %v momentum %v", spec.Name, spec.WeightDecay, spec.DecayExclude, spec.Momentum), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(spec.DecayExclude))))
			var names []string
			var shapes []tensor.Shape
			var params []*tensor.Dense
			run := torchRun{Spec: spec}
			for _, p := range torchModelParams {
				data := randomValues(r, p.shape.TotalSize(), 1)
				names, shapes = append(names, p.name), append(shapes, p.shape)
				params = append(params, tensor.New(tensor.WithShape(p.shape...), tensor.WithBacking(append([]float32(nil), data...))))
				run.Params = append(run.Params, torchParam{Name: p.name, Shape: p.shape, Data: data})
			}
			for s := range steps {
				var gs [][]float32
				for _, sh := range shapes {
					gs = append(gs, randomValues(r, sh.TotalSize(), 0.5))
				}
				run.Grads = append(run.Grads, gs)
				run.LRs = append(run.LRs, spec.LR*float64(s+1)/steps) // as a warmup drives it
			}
			var want [][][]float64
			testenv.RunPythonJSON(t, filepath.Join("testdata", "torch_optim.py"), run, &want)

			o, err := NewNamed(spec, tensor.Float32, names, shapes)
			if err != nil {
				t.Fatal(err)
			}
			for s := range steps {
				grads := make([]*tensor.Dense, len(shapes))
				for i, sh := range shapes {
					grads[i] = tensor.New(tensor.WithShape(sh...), tensor.WithBacking(append([]float32(nil), run.Grads[s][i]...)))
				}
				before := make([][]float32, len(params))
				for i, p := range params {
					before[i] = append([]float32(nil), p.Data().([]float32)...)
				}
				o.SetLR(run.LRs[s])
				if err := o.Step(params, grads); err != nil {
					t.Fatal(err)
				}
				for i, p := range params {
					for j, got := range p.Data().([]float32) {
						w, scale := want[s][i][j], math.Max(math.Abs(float64(before[i][j])), run.LRs[s])
						if !closeF32(got, w, scale) {
							t.Fatalf("step %d, %s[%d]: %v, PyTorch %v (%.3g ulp of the larger of the parameter before the step and lr)", s+1, names[i], j, got, w, math.Abs(float64(got)-w)/ulp32(scale))
						}
					}
				}
			}
		})
	}
}

// closeF32 says whether got is within 1e-6 (8 to 16 float32 ulps) of want
// relative to the larger of want and scale: an update that nearly cancels
// the parameter (p − lr·u near 0) leaves the rounding of its operands,
// whose size scale is, in a small result, and Adam's steps carry each
// other's rounding on.
func closeF32(got float32, want, scale float64) bool {
	return math.Abs(float64(got)-want) <= 1e-6*math.Max(math.Abs(want), scale)
}

// ulp32 is the gap between float32 x and the next float32 away from zero.
func ulp32(x float64) float64 {
	f := float32(math.Abs(x))
	return float64(math.Nextafter32(f, float32(math.Inf(1))) - f)
}

// randomValues are n float32s uniform in (-scale, scale).
func randomValues(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32((r.Float64()*2 - 1) * scale)
	}
	return out
}
