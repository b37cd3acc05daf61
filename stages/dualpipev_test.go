package stages

import (
	"fmt"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestDualPipeVEqualsReference: dualpipev, on zb-v's V but in DualPipeV's
// order, with full backwards in its steady state and split ones in its
// warm-up and drain (so each chunk's engine is split and runs a full
// backward as its input and weight passes back to back), trains bit for bit
// the model one runtime trains, for p = 2, 3, 4 and a couple of m each, with
// both optimizers.
func TestDualPipeVEqualsReference(t *testing.T) {
	cases := []struct {
		layers [][]string
		micro  []int
	}{
		{zbvLayers(2), []int{4, 6}},
		{[][]string{{"0-1", "5"}, {"2", "3-4"}}, []int{4}}, // uneven chunks
		{zbvLayers(3), []int{6, 7}},
		{zbvLayers(4), []int{8, 9}},
	}
	for _, c := range cases {
		for _, micro := range c.micro {
			for _, opt := range []string{"adam", "sgd"} {
				t.Run(fmt.Sprintf("p%d/m%d/%v/%s", len(c.layers), micro, c.layers, opt), func(t *testing.T) {
					cfg := testConfig("dualpipev", c.layers, micro, "float64", opt)
					ref := runInProcess(t, cfg, true)
					pipe := runInProcess(t, cfg, false)
					sameZBVRun(t, cfg, ref, pipe)
				})
			}
		}
	}
}

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
