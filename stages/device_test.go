package stages

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/optim"
)

// countedDevice is a device kind registered from outside package compute:
// the cpu engine, recording what each stage opened on it.
type countedDevice struct {
	mu     sync.Mutex
	opened []compute.Spec
}

func (*countedDevice) Kind() string { return "counted" }

func (d *countedDevice) Open(s compute.Spec) (compute.Stage, error) {
	d.mu.Lock()
	d.opened = append(d.opened, s)
	d.mu.Unlock()
	return engine.NewEngine(s.Model, s.First, s.Last, s.Batch, s.Seed, s.Options)
}

var counted = &countedDevice{}

func init() { compute.Register(counted) }

// TestStageOpensItsDevice: a stage computes on the device its
// stages[i].device names, asked of package compute's registry with its
// index, and the others on the cpu; the pipeline still equals the
// reference bit for bit.
func TestStageOpensItsDevice(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float64", "adam")
	cfg.Stages[1].Device = "counted:3"
	counted.mu.Lock()
	counted.opened = nil
	counted.mu.Unlock()
	ref := runInProcess(t, cfg, true)
	pipe := runInProcess(t, cfg, false)
	sameMLPRun(t, cfg, ref, pipe)

	counted.mu.Lock()
	opened := counted.opened
	counted.mu.Unlock()
	first, last := cfg.ChunkLayers(1, 0)
	if len(opened) != 1 || opened[0].Index != 3 || opened[0].First != first || opened[0].Last != last {
		t.Fatalf("opened on counted: %+v, want stage 1's layers [%d, %d) on device 3 only", opened, first, last)
	}
}

// wrappedDevice opens chunks whose compute is not the engine but wraps it
// and counts the forwards, backwards and optimizer
// steps driven through it.
type wrappedDevice struct{ forwards, backwards, steps atomic.Int64 }

// cpuEngine names the embedded engine, whose methods wrapped overrides.
type cpuEngine = engine.Engine

type wrapped struct {
	*cpuEngine
	d *wrappedDevice
}

func (w wrapped) Forward(mb int, in *tensor.Dense, targets []int) (*tensor.Dense, error) {
	w.d.forwards.Add(1)
	return w.cpuEngine.Forward(mb, in, targets)
}

func (w wrapped) Backward(mb int, grad *tensor.Dense) (*tensor.Dense, error) {
	w.d.backwards.Add(1)
	return w.cpuEngine.Backward(mb, grad)
}

func (w wrapped) Step(o *optim.Optimizer) error {
	w.d.steps.Add(1)
	return w.cpuEngine.Step(o)
}

func (*wrappedDevice) Kind() string { return "wrapped" }

func (d *wrappedDevice) Open(s compute.Spec) (compute.Stage, error) {
	e, err := engine.NewEngine(s.Model, s.First, s.Last, s.Batch, s.Seed, s.Options)
	return wrapped{e, d}, err
}

var wrapping = &wrappedDevice{}

func init() { compute.Register(wrapping) }

// TestExecutorDrivesTheDevicesCompute: the executor runs a stage's
// training and evaluation passes and optimizer steps through what its device opened
// (compute.Stage), not the engine behind it, and the pipeline still equals
// the reference bit for bit.
func TestExecutorDrivesTheDevicesCompute(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float64", "adam")
	cfg.Stages[0].Device = "wrapped"
	wrapping.forwards.Store(0)
	wrapping.backwards.Store(0)
	wrapping.steps.Store(0)
	ref := runInProcess(t, cfg, true)
	pipe := runInProcess(t, cfg, false)
	sameMLPRun(t, cfg, ref, pipe)

	// The final evaluation's forwards run on the device too: one per
	// evaluation micro-batch, the last padded.
	var final EvalResult
	if b, err := os.ReadFile(filepath.Join(pipe, "eval.json")); err != nil || json.Unmarshal(b, &final) != nil || final.Examples == 0 {
		t.Fatalf("eval.json: %v (%+v)", err, final)
	}
	mbs := int64(cfg.MicroBatchSize())
	passes, evals := int64(cfg.Train.Steps*cfg.Data.MicroBatches), (int64(final.Examples)+mbs-1)/mbs
	if f, b, s := wrapping.forwards.Load(), wrapping.backwards.Load(), wrapping.steps.Load(); f != passes+evals || b != passes || s != int64(cfg.Train.Steps) {
		t.Errorf("stage 0's device ran %d forwards, %d backwards and %d steps; want %d (%d training, %d evaluating), %d and %d", f, b, s, passes+evals, passes, evals, passes, cfg.Train.Steps)
	}
}

// hostedDevice opens chunks that hand out copies of their weights, as a
// device computing outside host memory must, and count the loads.
type hostedDevice struct{ reads, loads atomic.Int64 }

type hosted struct {
	*cpuEngine
	d *hostedDevice
}

func (h hosted) Engine() *engine.Engine { return h.cpuEngine }

// Weights copies the engine's weights out.
func (h hosted) Weights() []compute.Weight {
	h.d.reads.Add(1)
	ws := h.cpuEngine.Weights()
	for i, w := range ws {
		ws[i].Value = w.Value.Clone().(*tensor.Dense)
	}
	return ws
}

func (h hosted) LoadWeights(ws []compute.Weight) error {
	h.d.loads.Add(1)
	return h.cpuEngine.LoadWeights(ws)
}

func (*hostedDevice) Kind() string { return "hosted" }

func (d *hostedDevice) Open(s compute.Spec) (compute.Stage, error) {
	e, err := engine.NewEngine(s.Model, s.First, s.Last, s.Batch, s.Seed, s.Options)
	return hosted{e, d}, err
}

var hosting = &hostedDevice{}

func init() { compute.Register(hosting) }

// TestCheckpointerUsesHostWeights: a stage's checkpoint part is written
// from the weights its device hands out in host memory and loaded back
// through LoadWeights, so a device whose weights live elsewhere (here:
// copies) saves and restores them.
func TestCheckpointerUsesHostWeights(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	c.Stages[1].Device = "hosted"
	silent, rt := secondStage(t, c, t.TempDir())
	defer silent.Close()
	k := rt.ckpt
	want := snapshot(rt)
	if err := k.save(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	k.wait()
	for _, e := range rt.chunks {
		for _, w := range e.Weights() {
			clear(w.Value.Data().([]float32))
		}
	}
	hosting.loads.Store(0)
	if err := k.load(filepath.Join(checkpoint.StepDir(k.root, 3), checkpoint.PartFile(1))); err != nil {
		t.Fatal(err)
	}
	if !sameParams(snapshot(rt), want) {
		t.Error("the engine's weights differ from those saved")
	}
	if n := hosting.loads.Load(); n != int64(len(rt.chunks)) {
		t.Errorf("%d loads through the device, want one per chunk (%d)", n, len(rt.chunks))
	}
}

// TestInitAndFinalWeightsUseHostWeights: train.init_from fills a stage's
// weights through its device's LoadWeights, and the run directory's final
// weights are written from its Weights: those the file gives a stage on
// the cpu.
func TestInitAndFinalWeightsUseHostWeights(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	c.Train.Steps = 2
	file := exportRun(t, c, runInProcess(t, c, false))

	next := *c
	next.Train.InitFrom = file
	next.Train.Seed = 99 // the seed's weights must not show through
	next.Stages = slices.Clone(c.Stages)
	next.Stages[1].Device = "hosted"
	hosting.loads.Store(0)
	silent, rt := secondStage(t, &next, t.TempDir())
	defer silent.Close()
	if n := hosting.loads.Load(); n != int64(len(rt.chunks)) {
		t.Errorf("init_from loaded %d times through the device, want once per chunk (%d)", n, len(rt.chunks))
	}
	if err := os.MkdirAll(filepath.Dir(weightsFile(rt.runDir, 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	hosting.reads.Store(0)
	if err := rt.saveWeights(); err != nil {
		t.Fatal(err)
	}
	if n := hosting.reads.Load(); n != int64(len(rt.chunks)) {
		t.Errorf("the final weights read the device's weights %d times, want once per chunk (%d)", n, len(rt.chunks))
	}
	saved, _, err := checkpoint.Read(weightsFile(rt.runDir, 1))
	if err != nil {
		t.Fatal(err)
	}
	onCPU := next
	onCPU.Stages = c.Stages
	want := startingParams(t, &onCPU, false) // what the file starts a run on the cpu from
	for _, w := range saved {
		if !slices.Equal(w.F32, want[w.Name].F32) {
			t.Errorf("final weight %s differs from the one init_from gives on the cpu", w.Name)
		}
	}
	if len(saved) == 0 {
		t.Error("no final weights saved")
	}
}
