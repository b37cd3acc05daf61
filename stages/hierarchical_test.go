package stages

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/collective"
)

// TestHierarchicalEqualsReference trains 1 × 4 and 2 × 4 grids under gpipe
// and 1F1B with all_reduce.algorithm hierarchical, replicas 0-1 on host
// 127.0.0.1 and 2-3 on 127.0.0.2, and a 2 × 3 grid with replica 0 alone
// on its host: the losses, evaluation and weights must
// equal the one-process reference's bit for bit, which folds each host's
// replicas first and then the hosts' sums as collective.Sum does, and the
// replicas must pass the weight digest check after every step. The ring's
// reference must end with other weights, or the test would not tell the
// orders apart.
func TestHierarchicalEqualsReference(t *testing.T) {
	grids := []struct {
		layers          [][]string
		replicas, local int // replicas from local on are on 127.0.0.2
	}{
		{plain("0-3"), 4, 2}, {plain("0-1", "2-3"), 4, 2}, {plain("0-1", "2-3"), 3, 1},
	}
	for _, g := range grids {
		layers := g.layers
		for _, sched := range []string{"gpipe", "1f1b"} {
			t.Run(fmt.Sprintf("%dx%d/%s", len(layers), g.replicas, sched), func(t *testing.T) {
				cfg := gridTestConfig(sched, layers, 2, g.replicas, "adamw")
				for i := range cfg.Stages {
					s := &cfg.Stages[i]
					for r := g.local; r < g.replicas; r++ {
						s.Addresses[r] = strings.Replace(s.Addresses[r], "127.0.0.1:", "127.0.0.2:", 1)
					}
				}
				cfg.AllReduce.Algorithm = string(collective.Hierarchical)
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				ref := runInProcess(t, cfg, true)
				dir := t.TempDir()
				runGrid(t, cfg, dir, false)
				sameMLPRun(t, cfg, ref, dir)
				if len(layers) > 1 || sched != "1f1b" || g.replicas != 4 {
					return
				}
				cfg.AllReduce.Algorithm = ""
				ringRef := runInProcess(t, cfg, true)
				if checkpoint.Diff(readWeights(t, ref), readWeights(t, ringRef)) == nil {
					t.Error("the ring's reference and the hierarchical one hold the same weights: the fold order went untested")
				}
			})
		}
	}
}
