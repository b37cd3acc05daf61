// Package gputest holds the checks a gpu.Backend must pass, written once
// for the fake device (go test, everywhere) and the CUDA device (the cuda
// build tag, on a GPU): each kernel against a float64 reference, and a
// chunk trained on the device against the cpu engine.
package gputest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/compute/gpu"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
)

// Tolerances of a device stage against the cpu engine, float32: the
// products sum in another order (cuBLAS's blocking, or the fake's naive
// loop, against OpenBLAS's), so each value may differ from the engine's
// by a few units in the last place of its largest terms. atol covers
// values near zero, where that is large relative to the value; rtol the
// rest. docs/gpu.md explains them.
const (
	Atol = 1e-5
	Rtol = 1e-4
)

func near(a, b float32) bool {
	return math.Abs(float64(a-b)) <= Atol+Rtol*math.Abs(float64(b))
}

// sameValues fails t at the first of got unlike want.
func sameValues(t *testing.T, what string, got, want *tensor.Dense) {
	t.Helper()
	if got == nil || want == nil {
		if got != want {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
		return
	}
	g, w := got.Data().([]float32), want.Data().([]float32)
	if len(g) != len(w) {
		t.Fatalf("%s: %d values, want %d", what, len(g), len(w))
	}
	for i := range g {
		if !near(g[i], w[i]) {
			t.Fatalf("%s[%d] = %g, want %g (engine) within %g + %g·|want|", what, i, g[i], w[i], Atol, Rtol)
		}
	}
}

func MLP(t *testing.T, act string) *models.Model {
	t.Helper()
	m, err := models.Build(models.Spec{Name: "mlp", DType: "float32", Input: 12, Hidden: []int{16, 10}, Classes: 5, Activation: act})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Chunks opens the model's layers [0, 1) and [1, 3) on the cpu engine and
// on a fake device.
func Chunks(t *testing.T, m *models.Model, be gpu.Backend, o engine.Options) (cpu, dev [2]compute.Stage) {
	t.Helper()
	for i, r := range [][2]int{{0, 1}, {1, 3}} {
		s := compute.Spec{Model: m, First: r[0], Last: r[1], Batch: 4, Seed: 7, Options: o}
		e, err := engine.NewEngine(m, r[0], r[1], 4, 7, o)
		if err != nil {
			t.Fatal(err)
		}
		d, err := gpu.NewStage(be, s)
		if err != nil {
			t.Fatal(err)
		}
		cpu[i], dev[i] = e, d
	}
	return cpu, dev
}

// Batch is a random micro-batch of rows inputs of in features and their
// classes, the same for the same sizes.
func Batch(rows, in, classes int) (*tensor.Dense, []int) {
	return batch(rand.New(rand.NewPCG(uint64(rows), uint64(in))), rows, in, classes)
}

func batch(r *rand.Rand, rows, in, classes int) (*tensor.Dense, []int) {
	x := make([]float32, rows*in)
	for i := range x {
		x[i] = r.Float32()*2 - 1
	}
	y := make([]int, rows)
	for i := range y {
		y[i] = r.IntN(classes)
	}
	return tensor.New(tensor.WithShape(rows, in), tensor.WithBacking(x)), y
}

// TrainBoth runs steps steps of two micro-batches through both pipelines
// of two chunks, checking each forward's output, each backward's input
// gradient, each step's summed gradients and weights against the engine's.
func TrainBoth(t *testing.T, m *models.Model, cpu, dev [2]compute.Stage, spec optim.Spec, steps int) {
	t.Helper()
	var opts [2][2]*optim.Optimizer
	for i := range 2 {
		for j, s := range []compute.Stage{cpu[i], dev[i]} {
			o, err := s.NewOptimizer(spec)
			if err != nil {
				t.Fatal(err)
			}
			opts[i][j] = o
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const mbs = 2
	for step := range steps {
		for mb := range mbs {
			x, y := batch(r, 4, m.Spec.Input, m.Classes)
			var outs [2][2]*tensor.Dense
			for j, p := range [][2]compute.Stage{cpu, dev} {
				h, err := p[0].Forward(mb, x, nil)
				if err != nil {
					t.Fatal(err)
				}
				loss, err := p[1].Forward(mb, h, y)
				if err != nil {
					t.Fatal(err)
				}
				outs[j] = [2]*tensor.Dense{h, loss}
				if p[1].Recomputation(mb) == nil { // recomputing stages run the forward again first
					if err := p[0].Recomputation(mb); err != nil {
						t.Fatal(err)
					}
				}
			}
			at := fmt.Sprintf("step %d micro-batch %d", step, mb)
			sameValues(t, at+" activation", outs[1][0], outs[0][0])
			sameValues(t, at+" loss", outs[1][1], outs[0][1])
			var dxs [2]*tensor.Dense
			for j, p := range [][2]compute.Stage{cpu, dev} {
				dh, err := p[1].Backward(mb, p[1].LossScale(mbs))
				if err != nil {
					t.Fatal(err)
				}
				dx, err := p[0].Backward(mb, dh)
				if err != nil {
					t.Fatal(err)
				}
				if dx != nil {
					t.Fatalf("%s: the first chunk returned an input gradient", at)
				}
				dxs[j] = dh
			}
			sameValues(t, at+" input gradient of chunk 1", dxs[1], dxs[0])
		}
		for i := range 2 {
			want, err := cpu[i].Gradients()
			if err != nil {
				t.Fatal(err)
			}
			got, err := dev[i].Gradients()
			if err != nil {
				t.Fatal(err)
			}
			for k := range want {
				if got[k].Name != want[k].Name {
					t.Fatalf("gradient %d: %s, want %s", k, got[k].Name, want[k].Name)
				}
				sameValues(t, fmt.Sprintf("step %d gradient of %s", step, want[k].Name), got[k].Value, want[k].Value)
			}
			for j, s := range []compute.Stage{cpu[i], dev[i]} {
				if err := s.Step(opts[i][j]); err != nil {
					t.Fatal(err)
				}
			}
			w, g := cpu[i].Weights(), dev[i].Weights()
			for k := range w {
				sameValues(t, fmt.Sprintf("step %d weight %s", step, w[k].Name), g[k].Value, w[k].Value)
			}
		}
	}
}

// CheckTraining: two chunks of an MLP on be
// compute the engine's activations, losses, gradients and updated
// weights, within the float32 tolerances, for each activation, backward
// mode and optimizer.
func CheckTraining(t *testing.T, be gpu.Backend) {
	optimizers := []optim.Spec{
		{Name: "sgd", LR: 0.1},
		{Name: "sgd", LR: 0.1, Momentum: 0.9, WeightDecay: 0.01},
		{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01},
		{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
	}
	modes := map[string]engine.Options{"fused": {}, "split": {Split: true}, "recompute": {Recompute: true}}
	for _, act := range models.Activations() {
		for mode, o := range modes {
			for _, spec := range optimizers {
				t.Run(fmt.Sprintf("%s/%s/%s-wd%g-m%g", act, mode, spec.Name, spec.WeightDecay, spec.Momentum), func(t *testing.T) {
					cpu, dev := Chunks(t, MLP(t, act), be, o)
					TrainBoth(t, MLP(t, act), cpu, dev, spec, 3)
					for _, d := range dev {
						d.(*gpu.Stage).Close()
					}
					if c, ok := be.(interface{ LiveBuffers() int64 }); ok && c.LiveBuffers() != 0 {
						t.Errorf("%d device buffers not given back", c.LiveBuffers())
					}
				})
			}
		}
	}
}
