package configs

import (
	"runtime"
	"testing"
)

func TestThreadsFairShare(t *testing.T) {
	c := &Config{Stages: []Stage{
		{Address: "127.0.0.1:1"}, {Address: "127.0.0.1:2"}, {Address: "10.0.0.2:3"}, {Address: "127.0.0.1:4", CPUs: "0-2"},
	}}
	n := runtime.NumCPU()
	if got, want := c.Threads(0), max(1, n/3); got != want {
		t.Errorf("stage 0 of 3 on its host: %d threads, want %d", got, want)
	}
	if got, want := c.Threads(2), n; got != want {
		t.Errorf("stage 2 alone on its host: %d threads, want %d", got, want)
	}
	if got := c.Threads(3); got != 3 {
		t.Errorf("stage pinned to 3 CPUs: %d threads", got)
	}
	c.Compute.BLASThreads = 5
	if got := c.Threads(1); got != 5 {
		t.Errorf("explicit blas_threads 5 gave %d", got)
	}
	if got, want := c.CoreShare(1), max(1, n/3); got != want {
		t.Errorf("stage 1's share of its host with blas_threads set: %d cores, want %d", got, want)
	}
}

// The reference runs alone, so it takes the whole machine unless the config
// fixes a thread count for every process.
func TestReferenceThreadsTakeTheMachine(t *testing.T) {
	var c Config
	if got := c.ReferenceThreads(); got != max(1, runtime.NumCPU()) {
		t.Errorf("ReferenceThreads = %d, want the %d CPUs", got, runtime.NumCPU())
	}
	c.Compute.BLASThreads = 3
	if got := c.ReferenceThreads(); got != 3 {
		t.Errorf("with blas_threads 3: ReferenceThreads = %d", got)
	}
}
