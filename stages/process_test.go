package stages

import (
	"runtime"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
)

// TestStagesShareTheScheduler: stages on one host get Go's scheduler sized to
// their share of its cores, a pinned stage to its CPUs, a stage alone on its
// host the whole machine; GOMAXPROCS in the environment wins.
func TestStagesShareTheScheduler(t *testing.T) {
	cfg, err := configs.Load("../configs/fmnist-mlp-4stage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := runtime.NumCPU()
	if got, want := schedulerProcs(cfg, 1, "", n), max(1, n/len(cfg.Stages)); got != want {
		t.Errorf("stage 1 of %d on one host, %d cores: %d procs, want %d", len(cfg.Stages), n, got, want)
	}
	if got := schedulerProcs(cfg, 1, "", 1); got != 1 {
		t.Errorf("a process with 1 proc got %d", got)
	}
	if got := schedulerProcs(cfg, 1, "3", 3); got != 3 {
		t.Errorf("GOMAXPROCS=3 in the environment gave %d procs", got)
	}
	alone := *cfg
	alone.Stages = append([]configs.Stage(nil), cfg.Stages...)
	alone.Stages[2].Address = "10.0.0.9:7000"
	if got := schedulerProcs(&alone, 2, "", n); got != n {
		t.Errorf("stage alone on its host: %d procs, want all %d", got, n)
	}
	alone.Stages[3].CPUs = "0"
	if got := schedulerProcs(&alone, 3, "", n); got != 1 {
		t.Errorf("stage pinned to CPU 0: %d procs, want 1", got)
	}
}
