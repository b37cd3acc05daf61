package stages

import (
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestDualPipeVStash: each stage holds what the schedule's PeakInFlight
// says, 2p+1 micro-batch chunks (DualPipe's PP+1), counting the full
// backwards that a split engine runs as an input and a weight pass.
func TestDualPipeVStash(t *testing.T) {
	cfg := testConfig("dualpipev", zbvLayers(3), 6, "float32", "sgd")
	_, rts := runStages(t, cfg, false)
	sched, err := schedule.Build("dualpipev", 3, 6, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := sched.PeakInFlight()
	for s, rt := range rts {
		if rt.peakStash != want[s] || rt.peakStash != 2*3+1 {
			t.Errorf("stage %d logs a peak of %d chunks, the schedule says %d", s, rt.peakStash, want[s])
		}
	}
}
