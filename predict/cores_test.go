package predict

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestStageCores: stages pinned to one CPU share it; lists that overlap
// make one group of the CPUs they list; a stage pinned beside a free one
// shares nothing.
func TestStageCores(t *testing.T) {
	three := strings.Replace(mlp2, `address: 127.0.0.1:7002}`, `address: 127.0.0.1:7002, cpus: "0"}
  - {layers: "2", address: 127.0.0.1:7003, cpus: "0"}`, 1)
	three = strings.Replace(three, `layers: "1-2", address`, `layers: "1", address`, 1)
	three = strings.Replace(three, `address: 127.0.0.1:7001}`, `address: 127.0.0.1:7001, cpus: "0"}`, 1)
	cfg, _ := load(t, three)
	shared := StageCores(cfg)
	want := schedule.CoreGroups{Group: []int{0, 0, 0}, Cores: []float64{1}, Demand: []float64{1, 1, 1}}
	if !reflect.DeepEqual(shared.Groups, want) || shared.Note != "stages 0, 1, 2 (3 BLAS threads of 3 processes) share CPU 0" {
		t.Errorf("three stages on CPU 0: %+v", shared)
	}
	if runtime.NumCPU() < 2 {
		return
	}
	// The stage on two CPUs runs two threads.
	chain := strings.Replace(three, `address: 127.0.0.1:7002, cpus: "0"`, `address: 127.0.0.1:7002, cpus: "0,1"`, 1)
	chain = strings.Replace(chain, `address: 127.0.0.1:7003, cpus: "0"`, `address: 127.0.0.1:7003, cpus: "1"`, 1)
	cfg, _ = load(t, chain)
	if got := StageCores(cfg); !reflect.DeepEqual(got.Groups.Group, []int{0, 0, 0}) || !reflect.DeepEqual(got.Groups.Cores, []float64{2}) ||
		got.Note != "stages 0, 1, 2 (4 BLAS threads of 3 processes) share CPUs 0,1" {
		t.Errorf("stages on CPUs 0, 0-1 and 1: %+v", got)
	}
	// As many cores as threads: nothing shared.
	cfg, _ = load(t, strings.Replace(mlp2, `address: 127.0.0.1:7001}`, `address: 127.0.0.1:7001, cpus: "0"}`, 1))
	if got := StageCores(cfg); got.Groups.Group != nil || got.Note != "" {
		t.Errorf("a stage pinned to CPU 0 and one free: %+v", got)
	}
}

// TestSharePlanCores: a plan's processes share the CPUs every stage is
// pinned to, each with its share as BLAS threads unless compute.blas_threads
// says; a stage on another machine leaves the sharing uncharged, and says why.
func TestSharePlanCores(t *testing.T) {
	pinned := strings.Replace(mlp2, `address: 127.0.0.1:7001}`, `address: 127.0.0.1:7001, cpus: "0"}`, 1)
	pinned = strings.Replace(pinned, `address: 127.0.0.1:7002}`, `address: 127.0.0.1:7002, cpus: "0"}`, 1)
	cfg, _ := load(t, pinned)
	if got, want := SharePlanCores(cfg, 2), (PlanCores{Cores: 1, Threads: 1, Processes: 2}); got != want {
		t.Errorf("two stages on CPU 0: %+v, want %+v", got, want)
	}
	cfg, _ = load(t, strings.Replace(pinned, "schedule: 1f1b", "schedule: 1f1b\ncompute: {blas_threads: 3}", 1))
	if got, want := SharePlanCores(cfg, 4), (PlanCores{Cores: 1, Threads: 3, Processes: 4}); got != want {
		t.Errorf("blas_threads 3: %+v, want %+v", got, want)
	}
	cfg, _ = load(t, strings.Replace(mlp2, "127.0.0.1:7002", "192.0.2.1:7002", 1)+"transport: {token: secret}\n")
	want := PlanCores{Threads: max(1, runtime.NumCPU()/2), Processes: 2, Why: "stage 1 (192.0.2.1:7002) runs on another machine"}
	if got := SharePlanCores(cfg, 2); got != want {
		t.Errorf("a stage elsewhere: %+v, want %+v", got, want)
	}
}
