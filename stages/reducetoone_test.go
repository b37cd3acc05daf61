package stages

import (
	"fmt"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/collective"
)

// TestReduceToOneEqualsReference trains 1 × 2, 2 × 2, 1 × 3 and 2 × 3 grids
// under gpipe and 1F1B with all_reduce.algorithm reduce-to-one: the losses,
// evaluation and weights must equal the one-process reference's bit for
// bit (the reference folds each replica's share in replica order, as
// collective.Sum does for the plan), and the replicas must pass the weight
// digest check after every step. With three replicas the fold order shows:
// the ring's reference must end with other weights, or the test would not
// tell the two orders apart.
func TestReduceToOneEqualsReference(t *testing.T) {
	grids := []struct {
		layers   [][]string
		replicas int
	}{
		{plain("0-3"), 2}, {plain("0-1", "2-3"), 2}, {plain("0-3"), 3}, {plain("0-1", "2-3"), 3},
	}
	for _, g := range grids {
		for _, sched := range []string{"gpipe", "1f1b"} {
			t.Run(fmt.Sprintf("%dx%d/%s", len(g.layers), g.replicas, sched), func(t *testing.T) {
				cfg := gridTestConfig(sched, g.layers, 2, g.replicas, "adamw")
				cfg.AllReduce.Algorithm = string(collective.ReduceToOne)
				ref := runInProcess(t, cfg, true)
				dir := t.TempDir()
				runGrid(t, cfg, dir, false)
				sameMLPRun(t, cfg, ref, dir)
				if g.replicas < 3 || sched != "1f1b" {
					return
				}
				cfg.AllReduce.Algorithm = ""
				ringRef := runInProcess(t, cfg, true)
				if checkpoint.Diff(readWeights(t, ref), readWeights(t, ringRef)) == nil {
					t.Error("the ring's reference and reduce-to-one's hold the same weights: the fold order went untested")
				}
			})
		}
	}
}
