package stages

import (
	"sync"
	"sync/atomic"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

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

// wrappedDevice opens chunks whose compute is not the engine but holds it
// (the weights stay there) and counts the forwards, backwards and optimizer
// steps driven through it.
type wrappedDevice struct{ forwards, backwards, steps atomic.Int64 }

// cpuEngine names the embedded engine apart from the Engine method.
type cpuEngine = engine.Engine

type wrapped struct {
	*cpuEngine
	d *wrappedDevice
}

func (w wrapped) Engine() *engine.Engine { return w.cpuEngine }

func (w wrapped) Forward(mb int, in *tensor.Dense, targets []int) (*tensor.Dense, error) {
	w.d.forwards.Add(1)
	return w.cpuEngine.Forward(mb, in, targets)
}

func (w wrapped) Backward(mb int, grad G.Value) (*tensor.Dense, error) {
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
// training passes and optimizer steps through what its device opened
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

	passes := int64(cfg.Train.Steps * cfg.Data.MicroBatches)
	if f, b, s := wrapping.forwards.Load(), wrapping.backwards.Load(), wrapping.steps.Load(); f != passes || b != passes || s != int64(cfg.Train.Steps) {
		t.Errorf("stage 0's device ran %d forwards, %d backwards and %d steps; want %d, %d and %d", f, b, s, passes, passes, cfg.Train.Steps)
	}
}
