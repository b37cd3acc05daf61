package stages

import (
	"sync"
	"testing"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/engine"
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
