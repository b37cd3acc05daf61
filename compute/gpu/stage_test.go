package gpu_test

import (
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/compute/gpu"
	"github.com/pipetrain/pipetrain/compute/gpu/gputest"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
)

// TestStageTrainsLikeTheEngine: two chunks of an MLP on the fake device
// compute the engine's activations, losses, gradients and updated
// weights, within the float32 tolerances, for each activation, backward
// mode and optimizer.
func TestStageTrainsLikeTheEngine(t *testing.T) { gputest.CheckTraining(t, &gpu.Fake{}) }

// TestFakeKernels: each of the fake device's kernels against its float64
// reference.
func TestFakeKernels(t *testing.T) { gputest.CheckKernels(t, &gpu.Fake{}) }

// TestStageStartsFromTheEnginesWeights: a chunk on the device starts from
// the weights the seed gives the cpu engine, bit for bit.
func TestStageStartsFromTheEnginesWeights(t *testing.T) {
	m := gputest.MLP(t, "relu")
	cpu, dev := gputest.Chunks(t, m, &gpu.Fake{}, engine.Options{})
	for i := range 2 {
		w, g := cpu[i].Weights(), dev[i].Weights()
		if len(w) != len(g) || len(w) == 0 {
			t.Fatalf("chunk %d: %d weights on the device, %d on the cpu", i, len(g), len(w))
		}
		for k := range w {
			if g[k].Name != w[k].Name || !tensorEqual(g[k].Value, w[k].Value) {
				t.Errorf("chunk %d weight %d: %s differs from the engine's %s", i, k, g[k].Name, w[k].Name)
			}
		}
	}
}

func tensorEqual(a, b *tensor.Dense) bool {
	x, y := a.Data().([]float32), b.Data().([]float32)
	if len(x) != len(y) || !a.Shape().Eq(b.Shape()) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// TestStageRefusesWhatItCannotRun: a layer other than Dense, or a dtype
// other than float32, is refused naming it.
func TestStageRefusesWhatItCannotRun(t *testing.T) {
	gpt, err := models.Build(models.Spec{Name: "gpt", DType: "float32", Layers: 1, Width: 8, Heads: 2, Context: 4, Vocab: 11})
	if err != nil {
		t.Fatal(err)
	}
	m64, err := models.Build(models.Spec{Name: "mlp", DType: "float64", Input: 4, Hidden: []int{3}, Classes: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		m    *models.Model
		want string
	}{{gpt, "has no device kernels"}, {m64, "the device computes float32"}} {
		_, err := gpu.NewStage(&gpu.Fake{}, compute.Spec{Model: c.m, First: 0, Last: 1, Batch: 2})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("gpu.NewStage(%s %v): %v, want an error saying %q", c.m.Spec.Name, c.m.DType, err, c.want)
		}
	}
}
