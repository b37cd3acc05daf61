package predict

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestResolveUniformCosts: f=F,b=B[,w=W] gives every stage those costs, I as
// B - W; without w=, I and W are B/2 each and marked assumed on every stage.
func TestResolveUniformCosts(t *testing.T) {
	cfg, model := load(t, mlp2)
	c, err := ResolveCosts(cfg, model, "f=1.5,b=3,w=1", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := schedule.Costs{F: []float64{1.5, 1.5}, B: []float64{3, 3}, I: []float64{2, 2}, W: []float64{1, 1}}
	if !reflect.DeepEqual(c.Costs, want) || c.IWAssumed != "" || c.IWStages[0] || c.BStages[0] {
		t.Errorf("f=1.5,b=3,w=1: %+v", c)
	}
	c, err = ResolveCosts(cfg, model, "f=1,b=4", 1)
	if err != nil {
		t.Fatal(err)
	}
	if c.I[1] != 2 || c.W[1] != 2 || !reflect.DeepEqual(c.IWStages, []bool{true, true}) || c.IWAssumed == "" {
		t.Errorf("f=1,b=4: I %v, W %v, assumed %v (%q)", c.I, c.W, c.IWStages, c.IWAssumed)
	}
	for _, bad := range []string{"f=1", "f=1,b=2,w=3", "f=1,b=-2", "f=1,b=2,x=1", "nowhere/run"} {
		if _, err := ResolveCosts(cfg, model, bad, 1); err == nil || !strings.Contains(err.Error(), "--costs") {
			t.Errorf("%s: %v, want an error naming --costs", bad, err)
		}
	}
}

// TestResolveMeasuredCosts: "measure" times every stage here, and the
// split backward's parts of a model that splits it.
func TestResolveMeasuredCosts(t *testing.T) {
	cfg, model := load(t, mlp2)
	c, err := ResolveCosts(cfg, model, "measure", 1)
	if err != nil {
		t.Fatal(err)
	}
	for s := range cfg.Stages {
		if c.F[s] <= 0 || c.B[s] <= 0 || c.I[s] <= 0 || c.W[s] <= 0 {
			t.Errorf("stage %d: F %v, B %v, I %v, W %v: want every cost timed", s, c.F[s], c.B[s], c.I[s], c.W[s])
		}
	}
	if c.IWStages[0] || c.ChunkCosts != nil || c.Topology != cfg.Topology() {
		t.Errorf("one chunk a stage, split backward: %+v", c)
	}
}

// TestSetTransfer: a given transfer wins over a run's measured one, which
// wins over the estimate from the largest activation over the loopback link.
func TestSetTransfer(t *testing.T) {
	cfg, model := load(t, mlp2)
	var c Costs
	c.SetTransfer(cfg, model, nil)
	// Stage 1's input: a micro-batch of 2 samples of 6 float32s.
	if want := float64(schedule.Loopback.Time(2*6*4)) / 1e6; c.Transfer != want || !c.TransferEstimated {
		t.Errorf("estimated: %v ms (estimated %v), want %v", c.Transfer, c.TransferEstimated, want)
	}
	c = Costs{RunTransfer: 300 * time.Microsecond}
	c.SetTransfer(cfg, model, nil)
	if c.Transfer != 0.3 || c.TransferEstimated {
		t.Errorf("from the run: %v ms, estimated %v", c.Transfer, c.TransferEstimated)
	}
	given := time.Duration(0)
	c.SetTransfer(cfg, model, &given)
	if c.Transfer != 0 || c.TransferFrom != "given by --transfer" {
		t.Errorf("given 0: %v ms from %q", c.Transfer, c.TransferFrom)
	}
}

// TestForScheduleTakesChunkCostsOnlyForTheConfigsChunks: a chunk's own costs
// go to schedules that run the config's chunks in its placement only.
func TestForScheduleTakesChunkCostsOnlyForTheConfigsChunks(t *testing.T) {
	chunks := [][]schedule.ChunkCost{{{F: 1}, {F: 2}}, {{F: 3}, {F: 4}}}
	c := Costs{ChunkCosts: chunks, Topology: schedule.Topology{Stages: 2, Chunks: 2, Placement: schedule.V}}
	zbv, err := schedule.Build("zb-v", 2, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	interleaved, err := schedule.Build("interleaved", 2, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ForSchedule(zbv).Chunks; !reflect.DeepEqual(got, chunks) {
		t.Errorf("zb-v on a V config: chunks %v", got)
	}
	if got := c.ForSchedule(interleaved).Chunks; got != nil {
		t.Errorf("interleaved on a V config took the V's chunk costs: %v", got)
	}
}
