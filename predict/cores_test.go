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
