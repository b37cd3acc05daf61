package stages

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/compute/gpu"
	"github.com/pipetrain/pipetrain/configs"
)

// fakeGPUs counts the devices the "fakegpu" kind opened: one per index,
// however many stages and chunks are placed on it.
var fakeGPUs atomic.Int64

// fakeGPU is the device stage (package compute/gpu) on the fake backend,
// registered as a kind of its own: what a cuda:N stage does on the host
// side, run where there is no GPU.
var fakeGPU = gpu.NewDevice("fakegpu", func(int) (gpu.Backend, error) {
	fakeGPUs.Add(1)
	return &gpu.Fake{}, nil
})

func init() { compute.Register(fakeGPU) }

// Float32 tolerance of a run with device stages against the all-cpu
// reference: each step's loss and each final weight within lossTol
// relative (plus weightAtol near zero). The products sum in another order
// on the device (docs/gpu.md); over 6 Adam steps of this small MLP the
// differences stay near float32's 1e-7, and the bounds leave two orders
// of magnitude for cuBLAS's orders.
const (
	lossTol    = 1e-5
	weightTol  = 1e-4
	weightAtol = 1e-5
)

// closeRun fails t unless the run in dir trained as the reference did,
// within the tolerances.
func closeRun(t *testing.T, cfg *configs.Config, ref, dir string) {
	t.Helper()
	lr, ld := readLosses(t, ref), readLosses(t, dir)
	if len(lr) != cfg.Train.Steps || len(ld) != len(lr) {
		t.Fatalf("%d losses on the device, %d in the reference, want %d", len(ld), len(lr), cfg.Train.Steps)
	}
	for i := range lr {
		if math.Abs(ld[i]-lr[i]) > lossTol*math.Abs(lr[i]) {
			t.Errorf("step %d: loss %v with device stages, %v on the cpu (relative tolerance %g)", i+1, ld[i], lr[i], lossTol)
		}
	}
	closeEvaluation(t, ref, dir)
	wr, wd := readWeights(t, ref), readWeights(t, dir)
	if len(wr) == 0 || len(wd) != len(wr) {
		t.Fatalf("%d weights with device stages, %d in the reference", len(wd), len(wr))
	}
	for name, w := range wr {
		d := wd[name].F32
		if len(d) != len(w.F32) {
			t.Fatalf("weight %s: %d values with device stages, %d on the cpu", name, len(d), len(w.F32))
		}
		for i := range d {
			if math.Abs(float64(d[i]-w.F32[i])) > weightAtol+weightTol*math.Abs(float64(w.F32[i])) {
				t.Fatalf("weight %s[%d]: %v with device stages, %v on the cpu", name, i, d[i], w.F32[i])
			}
		}
	}
}

// TestMixedCPUAndDevicePipeline: a pipeline with a stage on the cpu and
// one on the device trains as the all-cpu reference does within float32
// tolerances, under each backward mode the schedules ask of a chunk (fused,
// split for zero-bubble, full recomputation) and with SGD, Adam and AdamW.
func TestMixedCPUAndDevicePipeline(t *testing.T) {
	for _, c := range []struct{ sched, opt string }{{"1f1b", "adam"}, {"zb-h1", "sgd"}, {"gpipe", "adamw"}} {
		t.Run(c.sched, func(t *testing.T) {
			cfg := testConfig(c.sched, plain("0-1", "2-3"), 2, "float32", c.opt)
			if c.opt == "adamw" {
				cfg.Train.Optimizer.WeightDecay = 0.1
			}
			cfg.Stages[1].Device = "fakegpu:0"
			if c.sched == "gpipe" {
				cfg.Stages[1].Recompute = "full"
			}
			closeRun(t, cfg, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
		})
	}
}

// TestStagesShareOneDevice: with interleaved chunks, both stages place
// two chunks each on fakegpu:1; the device is opened once and the run
// trains as the reference.
func TestStagesShareOneDevice(t *testing.T) {
	cfg := testConfig("interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 4, "float32", "adam")
	cfg.Stages[0].Device, cfg.Stages[1].Device = "fakegpu:1", "fakegpu:1"
	before := fakeGPUs.Load()
	ref := runInProcess(t, cfg, true)
	closeRun(t, cfg, ref, runInProcess(t, cfg, false))
	be, err := fakeGPU.Backend(1)
	if err != nil {
		t.Fatal(err)
	}
	if opened := fakeGPUs.Load() - before; opened > 1 {
		t.Errorf("fakegpu:1 opened %d times, want once for every chunk placed on it", opened)
	}
	if n := be.(*gpu.Fake).Live.Load(); n == 0 {
		t.Error("no buffers on fakegpu:1: the chunks did not run there")
	}
}

// TestDeviceResumeEqualsUninterrupted: a run whose stage 1 keeps its
// weights and Adam's moments on the device, stopped after a checkpoint and
// resumed, trains as one never stopped, bit for bit (the fake device is
// deterministic): the checkpoint holds the device's optimizer state, and
// resuming puts it back.
func TestDeviceResumeEqualsUninterrupted(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	cfg.Stages[1].Device = "fakegpu:0"
	cfg.Train.Steps = 6
	cfg.Checkpoint.Every, cfg.Checkpoint.Keep = 2, 2
	full := runInProcess(t, cfg, false)
	dir := t.TempDir()
	cfg.Train.Steps = 4
	runStagesIn(t, cfg, false, dir, false)
	cfg.Train.Steps = 6
	runStagesIn(t, cfg, false, dir, true)
	sameWeights(t, full, dir)
	sameLosses(t, full, dir)
}

// closeEvaluation: the final evaluation, whose logits the last stage hands
// out (Logits), scores the examples as the reference's does: the same
// examples, a loss within lossTol, and the same correct count but for
// examples whose top two logits are closer than the tolerances.
func closeEvaluation(t *testing.T, ref, dir string) {
	t.Helper()
	var er, ed EvalResult
	for _, e := range []struct {
		dir string
		r   *EvalResult
	}{{ref, &er}, {dir, &ed}} {
		b, err := os.ReadFile(filepath.Join(e.dir, "eval.json"))
		if err == nil {
			err = json.Unmarshal(b, e.r)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if er.Examples == 0 || ed.Examples != er.Examples || math.Abs(ed.Loss-er.Loss) > lossTol*er.Loss || max(ed.Correct-er.Correct, er.Correct-ed.Correct) > 1 {
		t.Errorf("evaluation with device stages %+v, on the cpu %+v", ed, er)
	}
}
