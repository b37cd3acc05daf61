package plan

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCoreSharingChargesEveryAction: four processes on two cores compute at
// half a core each, so the plan is the one for layers and overhead twice as
// dear on cores of their own; with as many cores as processes, or replicas
// counted among the processes, the charge follows.
func TestCoreSharingChargesEveryAction(t *testing.T) {
	layers := uniform(8, 2)
	base := Problem{Layers: layers, Stages: 4, MicroBatches: 8, Batch: 16, MicroBatch: 2, OverheadMS: 0.05,
		Schedules: []string{"1f1b", "zb-h1"}, LatencyMS: 0.1}
	dear := base
	dear.Layers = slices.Clone(layers)
	for k := range dear.Layers {
		dear.Layers[k].F *= 2
		dear.Layers[k].B *= 2
	}
	dear.OverheadMS *= 2
	want, err := Solve(dear)
	if err != nil {
		t.Fatal(err)
	}
	shared := base
	shared.Cores = 2
	got, err := Solve(shared)
	if err != nil {
		t.Fatal(err)
	}
	if got.StepMS != want.StepMS || !slices.Equal(got.Boundaries, want.Boundaries) || got.Schedule != want.Schedule {
		t.Errorf("4 stages on 2 cores: %v %s %.4f ms, want %v %s %.4f ms (costs doubled)", got.Boundaries, got.Schedule, got.StepMS, want.Boundaries, want.Schedule, want.StepMS)
	}
	alone, err := Solve(base)
	if err != nil {
		t.Fatal(err)
	}
	enough := base
	enough.Cores = 4
	if pl, err := Solve(enough); err != nil || pl.StepMS != alone.StepMS {
		t.Errorf("4 stages on 4 cores: %v, %v; want %.4f ms, as on cores of their own", pl, err, alone.StepMS)
	}
	// Two stages of two replicas on two cores share them as four stages do.
	replicated := base
	replicated.Stages, replicated.Replicas, replicated.MicroBatches = 2, 2, 4
	sharedR := replicated
	sharedR.Cores = 2
	dearR := replicated
	dearR.Layers, dearR.OverheadMS = dear.Layers, dear.OverheadMS
	a, errA := Evaluate(sharedR, []int{0, 4}, "1f1b", 4, false)
	b, errB := Evaluate(dearR, []int{0, 4}, "1f1b", 4, false)
	if errA != nil || errB != nil || a.StepMS != b.StepMS {
		t.Errorf("2 stages × 2 replicas on 2 cores: %v (%v), want %v (%v)", a, errA, b, errB)
	}
	if _, err := Solve(Problem{Layers: layers, Stages: 2, MicroBatches: 2, Batch: 2, MicroBatch: 1, Cores: -1}); err == nil {
		t.Error("negative cores accepted")
	}
}

// nearTie is a problem whose 1f1b and zb-h1 plans are within a few percent:
// two stages, the split backward a fifth dearer than the fused one, which
// costs zb-h1 most of what its filled bubble saves.
func nearTie() Problem {
	layers := make([]Layer, 6)
	for k := range layers {
		layers[k] = Layer{Name: fmt.Sprint(k), F: 1, B: 2, I: 1.21, W: 1.21, ActBytes: 100, ParamBytes: 1000, OutBytes: 10}
	}
	return Problem{Layers: layers, Stages: 2, MicroBatches: 4, Batch: 8, MicroBatch: 2, OverheadMS: 0.05,
		Schedules: []string{"1f1b", "zb-h1"}, LatencyMS: 0.1}
}

// TestMarginPrefersTheEarlierCandidate: zb-h1 beats 1f1b by a few percent;
// within the margin the earlier candidate (1f1b) is kept, beyond it the
// faster one is chosen.
func TestMarginPrefersTheEarlierCandidate(t *testing.T) {
	p := nearTie()
	by := map[string]*Plan{}
	for _, s := range p.Schedules {
		q := p
		q.Schedules = []string{s}
		pl, err := Solve(q)
		if err != nil {
			t.Fatal(err)
		}
		by[s] = pl
	}
	gain := by["1f1b"].StepMS/by["zb-h1"].StepMS - 1
	if gain <= 0.001 || gain > 0.03 {
		t.Fatalf("zb-h1 %.3f ms against 1f1b %.3f ms: not the near tie this test needs", by["zb-h1"].StepMS, by["1f1b"].StepMS)
	}
	for _, tc := range []struct {
		margin float64
		want   string
	}{{0, "zb-h1"}, {gain / 2, "zb-h1"}, {gain * 1.5, "1f1b"}} {
		q := p
		q.Margin = tc.margin
		pl, err := Solve(q)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Schedule != tc.want || pl.StepMS != by[tc.want].StepMS {
			t.Errorf("margin %.4f (gain %.4f): chose %s at %.4f ms, want %s at %.4f ms", tc.margin, gain, pl.Schedule, pl.StepMS, tc.want, by[tc.want].StepMS)
		}
	}
}

// TestMarginMakesNoisyCostsAgree: the near tie's costs, each drawn ±3% as
// measurements vary, give both schedules without a margin, and the same plan
// every time with a 5% margin.
func TestMarginMakesNoisyCostsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	chosen := map[float64]map[string]bool{0: {}, 0.05: {}}
	for range 40 {
		p := nearTie()
		p.Layers = slices.Clone(p.Layers)
		for k := range p.Layers {
			l := &p.Layers[k]
			l.F *= 1 + 0.06*(r.Float64()-0.5)
			l.B *= 1 + 0.06*(r.Float64()-0.5)
			l.I *= 1 + 0.06*(r.Float64()-0.5)
			l.W *= 1 + 0.06*(r.Float64()-0.5)
		}
		for margin, seen := range chosen {
			q := p
			q.Margin = margin
			pl, err := Solve(q)
			if err != nil {
				t.Fatal(err)
			}
			seen[fmt.Sprintf("%s %v", pl.Schedule, pl.Boundaries)] = true
		}
	}
	if len(chosen[0]) < 2 {
		t.Fatalf("without a margin every draw gave %v: the noise is too small to test the margin", chosen[0])
	}
	if len(chosen[0.05]) != 1 {
		t.Errorf("with a 5%% margin the draws gave %v, want one plan", chosen[0.05])
	}
}

// TestPreferKeepsTheGivenPlan: the user's plan is kept when Solve's is not
// faster by more than the margin, and when it fits the memory limit.
func TestPreferKeepsTheGivenPlan(t *testing.T) {
	p := Problem{Layers: uniform(6, -1), Stages: 2, MicroBatches: 4, Batch: 8, MicroBatch: 2, Schedules: []string{"1f1b"}}
	best, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	given, err := Evaluate(p, []int{0, 4}, "1f1b", 4, false)
	if err != nil {
		t.Fatal(err)
	}
	gain := given.StepMS/best.StepMS - 1
	if gain <= 0 {
		t.Fatalf("the given split %v is as fast as the plan %v", given.Boundaries, best.Boundaries)
	}
	for _, tc := range []struct {
		margin float64
		limit  int64
		want   *Plan
	}{
		{gain / 2, 0, best},
		{gain * 2, 0, given},
		{gain * 2, slices.Max(given.MemoryBytes) - 1, best}, // the given split does not fit
		{gain * 2, slices.Max(given.MemoryBytes), given},
	} {
		q := p
		q.Margin, q.MemoryLimit = tc.margin, tc.limit
		if got := q.Prefer(best, given); got != tc.want {
			t.Errorf("margin %.3f, limit %d: chose %v, want %v", tc.margin, tc.limit, got.Boundaries, tc.want.Boundaries)
		}
	}
	if got := p.Prefer(best, nil); got != best {
		t.Errorf("with no given plan: chose %v", got)
	}
}

// TestPreferredMicroBatchesFirst: the preferred count (the config's, which
// leaves the training as it is) is weighed first, so another count must beat
// it by the margin; without a margin the fastest count wins.
func TestPreferredMicroBatchesFirst(t *testing.T) {
	base := Problem{Layers: uniform(8, 2), Stages: 4, Batch: 32, MicroBatch: 4, OverheadMS: 0.5,
		Schedules: []string{"1f1b"}, LatencyMS: 0.2, Candidates: []int{1, 2, 4, 8, 16, 32}}
	fastest, err := Solve(base)
	if err != nil {
		t.Fatal(err)
	}
	// 32 micro-batches pay the most overhead: the preferred count here,
	// slower than the fastest by gain.
	q := base
	q.MicroBatches = 32
	preferred, err := Solve(q)
	if err != nil {
		t.Fatal(err)
	}
	gain := preferred.StepMS/fastest.StepMS - 1
	if fastest.MicroBatches == 32 || gain <= 0 {
		t.Fatalf("32 micro-batches are the fastest: %+v", fastest)
	}
	for _, margin := range []float64{0, gain * 0.99, gain * 1.01} {
		p := base
		p.PreferMicroBatches, p.Margin = 32, margin
		pl, err := Solve(p)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case margin == 0 && (pl.MicroBatches != fastest.MicroBatches || pl.StepMS != fastest.StepMS):
			t.Errorf("no margin: chose %d micro-batches (%.3f ms), want the fastest, %d (%.3f ms)", pl.MicroBatches, pl.StepMS, fastest.MicroBatches, fastest.StepMS)
		case margin > gain && (pl.MicroBatches != 32 || pl.StepMS != preferred.StepMS):
			t.Errorf("margin %.4f above the gain %.4f: chose %d micro-batches (%.3f ms), want the preferred 32 (%.3f ms)", margin, gain, pl.MicroBatches, pl.StepMS, preferred.StepMS)
		case margin > 0 && margin < gain && (pl.MicroBatches == 32 || pl.StepMS > fastest.StepMS*(1+margin)):
			t.Errorf("margin %.4f below the gain %.4f: chose %d micro-batches (%.3f ms), want another within the margin of %.3f ms", margin, gain, pl.MicroBatches, pl.StepMS, fastest.StepMS)
		}
	}
}
