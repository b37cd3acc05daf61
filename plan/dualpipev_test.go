package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestDualPipeVPlans: the planner takes dualpipev as it takes zb-v, a V of
// two chunks per stage: on problems small enough to search to the end its
// plan is the fastest V split the brute force finds, a split's step is the
// simulator's on per-chunk costs, and too few micro-batches (below 2p) are
// left out.
func TestDualPipeVPlans(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 20 {
		p := randomVProblem(r, "dualpipev")
		want := math.Inf(1)
		for _, m := range p.Candidates {
			if m < 2*p.Stages {
				continue
			}
			splits(len(p.Layers), 2*p.Stages, func(cuts []int) {
				pl, err := Evaluate(p, cuts, "dualpipev", m, false)
				if err != nil {
					t.Fatalf("Evaluate(%v, dualpipev, %d): %v", cuts, m, err)
				}
				want = min(want, pl.StepMS)
			})
		}
		name := fmt.Sprintf("trial %d (%d layers, %d stages)", trial, len(p.Layers), p.Stages)
		got, err := Solve(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 || got.Schedule != "dualpipev" || len(got.Boundaries) != 2*p.Stages || got.Topology().Placement != schedule.V {
			t.Fatalf("%s: step %v with %v (%s), brute force finds %v", name, got.StepMS, got.Boundaries, got.Schedule, want)
		}
	}

	p := Problem{Layers: uniform(8, -1), Stages: 2, Batch: 8, MicroBatch: 2, MicroBatches: 4}
	simulatesChunks(t, p, "dualpipev", []int{0, 2, 4, 6}, 0)

	p = Problem{Layers: uniform(8, -1), Stages: 4, Batch: 16, MicroBatch: 1, Candidates: []int{2, 4}, Schedules: []string{"dualpipev"}}
	if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), "dualpipev needs micro_batches >= 8 for 4 stages") {
		t.Errorf("only too few micro-batches: %v", err)
	}
	p.Candidates = []int{4, 8}
	if pl, err := Solve(p); err != nil || pl.MicroBatches != 8 || pl.Schedule != "dualpipev" {
		t.Errorf("plan %+v, %v; want dualpipev with 8 micro-batches", pl, err)
	}
}
