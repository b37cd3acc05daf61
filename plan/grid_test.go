package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// withReplicas makes p a problem with r replicas of a random all-reduce
// cost, its micro-batch counts narrowed to those that divide the replicas'
// batch.
func withReplicas(r *rand.Rand, p Problem, replicas int) Problem {
	p.Replicas = replicas
	p.Layers = slices.Clone(p.Layers)
	for k := range p.Layers {
		p.Layers[k].GradBytes = int64(1000 + r.IntN(20000))
	}
	p.AllReduceBytesPerMS = float64(1+r.IntN(4)) * 1000
	p.AllReduceLatencyMS = 0.05 * float64(r.IntN(3))
	if r.IntN(2) == 0 {
		p.BucketBytes = int64(2000 + r.IntN(8000))
	}
	per := p.Batch / replicas
	if p.MicroBatches > 0 && per%p.MicroBatches != 0 {
		p.MicroBatches = per
	}
	p.Candidates = slices.DeleteFunc(slices.Clone(p.Candidates), func(m int) bool { return per%m != 0 })
	if p.MicroBatches == 0 && len(p.Candidates) == 0 {
		p.Candidates = []int{1}
	}
	return p
}

// TestSolveWithReplicasMatchesBruteForce: with the all-reduce charged, the
// search still finds the fastest split (its bounds stay below what the
// simulator says), and Evaluate agrees with the plan.
func TestSolveWithReplicasMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := range 300 {
		p := withReplicas(r, randomProblem(r, r.IntN(10)-2), []int{2, 4}[r.IntN(2)])
		if trial%3 == 1 {
			_, need := brute(t, p)
			p.MemoryLimit = need + r.Int64N(need/2+1)
		}
		want, _ := brute(t, p)
		name := fmt.Sprintf("trial %d (%d layers, %d stages, %d replicas)", trial, len(p.Layers), p.Stages, p.Replicas)
		got, err := Solve(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 {
			t.Fatalf("%s: step %v with %v (%s, m=%d), brute force finds %v", name, got.StepMS, got.Boundaries, got.Schedule, got.MicroBatches, want)
		}
		again, err := Evaluate(p, got.Boundaries, got.Schedule, got.MicroBatches, got.Recompute)
		if err != nil || again.StepMS != got.StepMS || !slices.Equal(again.AllReduceMS, got.AllReduceMS) {
			t.Fatalf("%s: Evaluate gives %+v (%v), Solve %+v", name, again, err, got)
		}
		if got.Replicas != p.Replicas || len(got.AllReduceMS) != p.Stages || len(got.ExposedMS) != p.Stages {
			t.Fatalf("%s: plan %+v lacks the replicas' figures", name, got)
		}
	}
}

// TestBoundsWithAllReduce is TestBoundsNeverExceedTheSimulator with
// replicas, whose all-reduces the bounds count.
func TestBoundsWithAllReduce(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for trial := range 200 {
		n, stages := 4+r.IntN(20), 2+r.IntN(5)
		stages = min(stages, n)
		p := randomProblem(r, r.IntN(n))
		for len(p.Layers) < n {
			p.Layers = append(p.Layers, randomProblem(r, -1).Layers...)
		}
		p.Layers, p.Stages, p.Batch = p.Layers[:n], stages, 64
		p = withReplicas(r, p, []int{2, 4, 8}[r.IntN(3)])
		if r.IntN(2) == 0 { // all-reduces that dwarf the compute
			p.AllReduceBytesPerMS /= 100
		}
		m := []int{1, 2, 4, 8}[r.IntN(4)]
		for _, name := range Schedules() {
			d, err := newModel(p)
			if err != nil {
				t.Fatal(err)
			}
			c, err := d.candidate(name, m, false)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.prepare(); err != nil {
				t.Fatal(err)
			}
			b := &bnb{c: c}
			for range 5 {
				cuts := []int{0}
				for s := 1; s < stages; s++ {
					cuts = append(cuts, cuts[s-1]+1+r.IntN(n-cuts[s-1]-(stages-s)))
				}
				pl, err := c.simulate(cuts)
				if err != nil {
					t.Fatal(err)
				}
				if lb := b.bound(cuts); lb > above(pl.StepMS) {
					t.Fatalf("trial %d, %s, m=%d, R=%d, split %v: bound %v above the simulated %v", trial, name, m, p.Replicas, cuts, lb, pl.StepMS)
				}
			}
		}
	}
}

// TestReplicasShareTheBatch: R replicas whose all-reduce costs nothing run
// the step of one pipeline on Batch/R samples, and so R times the samples
// per second.
func TestReplicasShareTheBatch(t *testing.T) {
	one := Problem{Layers: uniform(6, 2), Stages: 3, Batch: 8, MicroBatch: 1, Candidates: []int{1, 2, 4, 8}, Schedules: Schedules(), OverheadMS: 0.1, LatencyMS: 0.05}
	two := one
	two.Batch, two.Replicas = 16, 2
	a, err := Solve(one)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Solve(two)
	if err != nil {
		t.Fatal(err)
	}
	if a.StepMS != b.StepMS || !slices.Equal(a.Boundaries, b.Boundaries) || a.MicroBatches != b.MicroBatches {
		t.Fatalf("one replica of 8: %+v; two of 16: %+v", a, b)
	}
	if math.Abs(b.SamplesPerSecond-2*a.SamplesPerSecond) > 1e-9 || a.SamplesPerSecond != 8000/a.StepMS {
		t.Errorf("samples/s %v and %v, want %v and twice that", a.SamplesPerSecond, b.SamplesPerSecond, 8000/a.StepMS)
	}
	if !slices.Equal(b.AllReduceMS, []float64{0, 0, 0}) || a.AllReduceMS != nil {
		t.Errorf("all-reduce times %v and %v", a.AllReduceMS, b.AllReduceMS)
	}
}

// TestOneStageChargesTheWholeAllReduce: a single stage has nothing left to
// compute when it hands its gradients over, so the step is its compute plus
// the ring's time; and the all-reduce's flat copy counts in its memory.
func TestOneStageChargesTheWholeAllReduce(t *testing.T) {
	layers := uniform(2, -1)
	layers[0].GradBytes, layers[1].GradBytes = 3000, 1000
	p := Problem{Layers: layers, Stages: 1, MicroBatches: 2, Batch: 8, MicroBatch: 1, Replicas: 2,
		AllReduceBytesPerMS: 100, AllReduceLatencyMS: 0.5, BucketBytes: 1500}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	// 4 samples of 2 layers at F = 1, B = 2; then 2·1/2·4000/100 = 40 ms
	// and 3 buckets of 2 messages.
	ar := 40 + 3*2*0.5
	if pl.StepMS != 24+ar || !slices.Equal(pl.AllReduceMS, []float64{ar}) || !slices.Equal(pl.ExposedMS, []float64{ar}) {
		t.Errorf("got step %v, all-reduce %v, exposed %v; want %v, [%v], [%v]", pl.StepMS, pl.AllReduceMS, pl.ExposedMS, 24+ar, ar, ar)
	}
	// 2000 bytes of parameters and state, one stashed micro-batch (1F1B on
	// one stage) of 2 samples of 200 bytes, and the 4000 gradient bytes
	// again.
	if want := int64(2000 + 2*200 + 4000); pl.MemoryBytes[0] != want {
		t.Errorf("memory %d, want %d", pl.MemoryBytes[0], want)
	}
	if want := (schedule.RingAllReduce{Replicas: 2, Bandwidth: 100, Latency: 0.5, BucketBytes: 1500}).Time(4000); want != ar {
		t.Fatalf("the ring's time is %v, the test assumes %v", want, ar)
	}
}

// TestAllReduceMovesTheSplit: layer 1 computes nothing but has gradients,
// so either stage may hold it at the same compute; on the last stage its
// all-reduce hides in the time stage 0 still spends on its last backward
// (2 ms; the all-reduce takes 1.5), on stage 0 it would add to the step.
func TestAllReduceMovesTheSplit(t *testing.T) {
	layers := []Layer{{F: 1, B: 2}, {GradBytes: 1500}, {F: 1, B: 2}}
	p := Problem{Layers: layers, Stages: 2, MicroBatches: 4, Batch: 8, MicroBatch: 1, Replicas: 2, AllReduceBytesPerMS: 1000}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pl.Boundaries, []int{0, 1}) || !slices.Equal(pl.AllReduceMS, []float64{0, 1.5}) || !slices.Equal(pl.ExposedMS, []float64{0, 0}) {
		t.Fatalf("got %v, all-reduce %v, exposed %v; want layer 1 on stage 1, hidden", pl.Boundaries, pl.AllReduceMS, pl.ExposedMS)
	}
	other, err := Evaluate(p, []int{0, 2}, "1f1b", 4, false)
	if err != nil {
		t.Fatal(err)
	}
	if other.StepMS != pl.StepMS+1.5 {
		t.Errorf("layer 1 on stage 0: step %v, want %v + 1.5", other.StepMS, pl.StepMS)
	}
}

// TestGridsCommunicationFreePrefersReplicas: with no transfers, overheads
// or all-reduce costs, replicas have no bubble, so the grid with one stage
// and all processes as replicas is fastest.
func TestGridsCommunicationFreePrefersReplicas(t *testing.T) {
	p := Problem{Layers: uniform(8, -1), Batch: 16, MicroBatch: 1, Candidates: []int{1, 2, 4, 8, 16}, Schedules: Schedules()}
	best, grids, err := SolveGrids(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(grids) != 3 || grids[0].Stages != 4 || grids[1].Replicas != 2 || grids[2].Replicas != 4 {
		t.Fatalf("grids %+v, want 4×1, 2×2, 1×4", grids)
	}
	if best != grids[2].Plan || best.Replicas != 4 || len(best.Boundaries) != 1 {
		t.Fatalf("best %+v, want the 1×4 grid's", best)
	}
	// One stage of 8 layers on 4 samples: 4·8·(1+2).
	if best.StepMS != 96 || best.SamplesPerSecond != 16000.0/96 {
		t.Errorf("1×4: step %v, %v samples/s", best.StepMS, best.SamplesPerSecond)
	}
	checkGrids(t, p, best, grids)
}

// TestGridsHugeAllReducePrefersStages: when reducing gradients costs far
// more than the pipeline's bubbles, the grid without replicas wins.
func TestGridsHugeAllReducePrefersStages(t *testing.T) {
	layers := uniform(8, -1)
	for k := range layers {
		layers[k].GradBytes = 1 << 20
	}
	p := Problem{Layers: layers, Batch: 16, MicroBatch: 1, Candidates: []int{1, 2, 4, 8, 16}, Schedules: Schedules(),
		AllReduceBytesPerMS: 1000, AllReduceLatencyMS: 0.1}
	best, grids, err := SolveGrids(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	if best != grids[0].Plan || best.Replicas != 1 || len(best.Boundaries) != 4 {
		t.Fatalf("best %+v, want the 4×1 grid's", best)
	}
	for _, g := range grids[1:] {
		if slices.Max(g.Plan.ExposedMS) <= 0 {
			t.Errorf("%d×%d: all-reduce hidden: %+v", g.Stages, g.Replicas, g.Plan)
		}
	}
	checkGrids(t, p, best, grids)
}

// checkGrids holds each grid's plan to Solve's for that grid, and best to
// the fastest.
func checkGrids(t *testing.T, p Problem, best *Plan, grids []Grid) {
	t.Helper()
	for _, g := range grids {
		if g.Plan == nil {
			continue
		}
		q := p
		q.Stages, q.Replicas = g.Stages, g.Replicas
		q.Candidates = slices.DeleteFunc(slices.Clone(q.Candidates), func(m int) bool { return q.Batch%(g.Replicas*m) != 0 })
		want, err := Solve(q)
		if err != nil || want.StepMS != g.Plan.StepMS {
			t.Errorf("%d×%d: plan %+v, Solve %+v (%v)", g.Stages, g.Replicas, g.Plan, want, err)
		}
		if g.Plan.SamplesPerSecond > best.SamplesPerSecond {
			t.Errorf("%d×%d: %v samples/s beats the best's %v", g.Stages, g.Replicas, g.Plan.SamplesPerSecond, best.SamplesPerSecond)
		}
	}
}

// TestGridsMemoryLimit: one stage holding every layer does not fit, so the
// communication-free model settles for two stages of two replicas.
func TestGridsMemoryLimit(t *testing.T) {
	p := Problem{Layers: uniform(8, -1), Batch: 16, MicroBatch: 1, Candidates: []int{1, 2, 4, 8, 16}, Schedules: Schedules(), MemoryLimit: 7000}
	best, grids, err := SolveGrids(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	if grids[2].Plan != nil || grids[2].Err == nil || !strings.Contains(grids[2].Err.Error(), "memory limit") {
		t.Fatalf("1×4 under 7000 bytes: %+v", grids[2])
	}
	if best != grids[1].Plan || slices.Max(best.MemoryBytes) > p.MemoryLimit {
		t.Fatalf("best %+v, want the 2×2 grid's", best)
	}
}

func TestGridsWithoutPlans(t *testing.T) {
	p := Problem{Layers: uniform(3, -1), Batch: 6, MicroBatch: 1, Candidates: []int{1, 2, 3, 6}}
	best, grids, err := SolveGrids(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"4 stages for 3 layers", "", "4 replicas do not divide the batch of 6"}
	for k, g := range grids {
		got := ""
		if g.Err != nil {
			got = g.Err.Error()
		}
		if !strings.Contains(got, want[k]) || (want[k] == "") != (g.Plan != nil) {
			t.Errorf("%d×%d: %v, want %q", g.Stages, g.Replicas, g.Err, want[k])
		}
	}
	if best != grids[1].Plan {
		t.Errorf("best %+v, want 2×2's", best)
	}
	p.MicroBatches = 2 // 2 does not divide 2×2's replicas' batch of 3
	_, grids, err = SolveGrids(p, 4)
	if err == nil || !strings.Contains(err.Error(), "2×2: 2 micro-batches do not divide the replicas' batch of 3") {
		t.Fatalf("got %v", err)
	}
	if len(grids) != 3 {
		t.Errorf("grids %+v", grids)
	}
	if _, _, err := SolveGrids(p, 0); err == nil {
		t.Error("0 processes accepted")
	}
}

func TestReplicaBadInputs(t *testing.T) {
	ok := Problem{Layers: uniform(4, -1), Stages: 2, MicroBatches: 2, Batch: 8, MicroBatch: 1, Replicas: 2}
	if _, err := Solve(ok); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Problem)
		want string
	}{
		{"negative replicas", func(p *Problem) { p.Replicas = -1 }, "-1 replicas"},
		{"replicas do not divide", func(p *Problem) { p.Replicas = 3 }, "3 replicas: must be >= 1 and divide the batch of 8"},
		{"m does not divide the share", func(p *Problem) { p.MicroBatches = 8 }, "8 micro-batches: must be >= 1 and divide each of the 2 replicas' batch of 4"},
		{"negative latency", func(p *Problem) { p.AllReduceLatencyMS = -1 }, "all-reduce latency"},
		{"infinite speed", func(p *Problem) { p.AllReduceBytesPerMS = math.Inf(1) }, "all-reduce latency, speed"},
		{"negative bucket", func(p *Problem) { p.BucketBytes = -1 }, "bucket size"},
		{"negative gradient", func(p *Problem) { p.Layers = uniform(4, -1); p.Layers[3].GradBytes = -1 }, "layer 3"},
	} {
		p := ok
		tc.edit(&p)
		if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestCompareReductionsByHand: one stage of 2 layers (4000 gradient bytes,
// 3000 on server 0 and 1000 on server 1), 4 replicas of 2 micro-batches of
// one sample: the compute ends at 12 ms and the whole reduction follows.
// Across hosts 100 bytes/ms and 5 ms a message, within 1000 and 0.1, in 3
// buckets of at most 1500 bytes:
//
//   - ring: 2·3/4·4000/100 + 3 buckets × 6 messages × 5 = 150;
//   - reduce-to-one: (3+6-1) × 5 + (2·4000 + 5·1500)/100 = 195;
//   - hierarchical, 2 hosts of 2: per bucket 3 messages within (0.1) and 3
//     across (5); 4000 + 2·2000 bytes within, 3·2000 across: 113.9;
//   - servers: twice 5 + 4 workers × 3000 / 100 = 250.
func TestCompareReductionsByHand(t *testing.T) {
	layers := uniform(2, -1)
	layers[0].GradBytes, layers[1].GradBytes = 3000, 1000
	layers[0].ServerBytes, layers[1].ServerBytes = []int64{3000, 0}, []int64{0, 1000}
	p := Problem{Layers: layers, Stages: 1, MicroBatches: 2, Batch: 8, MicroBatch: 1, Replicas: 4,
		AllReduceBytesPerMS: 100, AllReduceLatencyMS: 5, BucketBytes: 1500,
		ReplicasPerHost: 2, WithinBytesPerMS: 1000, WithinLatencyMS: 0.1}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	got, best := CompareReductions(p, pl, Algorithms())
	want := map[string]float64{"ring": 150, "reduce-to-one": 195, "hierarchical": 113.9, "ps": 250}
	for _, r := range got {
		if r.Err != nil {
			t.Fatalf("%s: %v", r.Algorithm, r.Err)
		}
		if w := want[r.Algorithm]; math.Abs(r.Plan.StepMS-(12+w)) > 1e-9 || math.Abs(r.Plan.AllReduceMS[0]-w) > 1e-9 {
			t.Errorf("%s: step %v, reduction %v; want %v, %v", r.Algorithm, r.Plan.StepMS, r.Plan.AllReduceMS, 12+w, w)
		}
	}
	if best < 0 || got[best].Algorithm != "hierarchical" {
		t.Errorf("best %d, want hierarchical's", best)
	}
	if pl.StepMS != got[0].Plan.StepMS {
		t.Errorf("the plan, under the ring, %v; the comparison's ring %v", pl.StepMS, got[0].Plan.StepMS)
	}
	// Without servers' bytes, servers cannot be weighed; the rest can.
	p.Layers = uniform(2, -1)
	p.Layers[0].GradBytes, p.Layers[1].GradBytes = 3000, 1000
	got, best = CompareReductions(p, pl, []string{"ring", "ps"})
	if got[0].Err != nil || got[1].Err == nil || best != 0 {
		t.Errorf("no server bytes: %v, %v (best %d); want the ring alone", got[0].Err, got[1].Err, best)
	}
}

// TestServersChargedWithOneWorker: parameter servers push and pull even
// with one replica, from the stage's step end: under 1F1B on two stages
// with 2 micro-batches (F = 1, B = 2 a layer) stage 0 ends at 9 ms.
func TestServersChargedWithOneWorker(t *testing.T) {
	layers := uniform(2, -1)
	layers[0].ServerBytes, layers[1].ServerBytes = []int64{500}, []int64{100}
	p := Problem{Layers: layers, Stages: 2, MicroBatches: 2, Batch: 2, MicroBatch: 1, Algorithm: "ps", AllReduceBytesPerMS: 100}
	pl, err := Evaluate(p, []int{0, 1}, "1f1b", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pl.AllReduceMS, []float64{10, 2}) || pl.StepMS != 19 {
		t.Errorf("reductions %v, step %v; want [10 2], 19", pl.AllReduceMS, pl.StepMS)
	}
	p.Layers[1].ServerBytes = []int64{1, 2}
	if _, err := Evaluate(p, []int{0, 1}, "1f1b", 2, false); err == nil || err.Error() != "plan: layer 1 (1): bytes held by 2 servers, layer 0 by 1" {
		t.Errorf("uneven server counts: %v", err)
	}
}

// TestPerLayerBucketsByHand: zb-h1 on one stage of 2 layers (F = 1,
// I = W = 1 each), one micro-batch: F [0,2], I [2,4], W [4,6]. Of the 4000
// gradient bytes (3000 in layer 0, 1000 in layer 1) in buckets of 1000, at
// 100 bytes/ms on 2 replicas (10 ms a bucket), the last lies in layer 1,
// whose W is done halfway through the pass: it runs [5, 15], the other
// three after it, to 45, one ms before the chunk's whole all-reduce, [6, 46].
func TestPerLayerBucketsByHand(t *testing.T) {
	layers := uniform(2, -1)
	layers[0].GradBytes, layers[1].GradBytes = 3000, 1000
	p := Problem{Layers: layers, Stages: 1, MicroBatches: 1, Batch: 2, MicroBatch: 1, Replicas: 2,
		AllReduceBytesPerMS: 100, BucketBytes: 1000, Schedules: []string{"zb-h1"}}
	whole, err := Evaluate(p, []int{0}, "zb-h1", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	p.PerLayer = true
	layered, err := Evaluate(p, []int{0}, "zb-h1", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if whole.StepMS != 46 || layered.StepMS != 45 || !slices.Equal(layered.ExposedMS, []float64{39}) {
		t.Errorf("per chunk step %v, per layer %v (exposed %v); want 46, 45 ([39])", whole.StepMS, layered.StepMS, layered.ExposedMS)
	}
	// A fused backward reports no layer: 1f1b's buckets start at its end.
	fused, err := Evaluate(p, []int{0}, "1f1b", 1, false)
	if err != nil || fused.StepMS != 46 {
		t.Errorf("1f1b per layer: step %v (%v), want 46", fused.StepMS, err)
	}
	// Only the ring runs per layer.
	rs, _ := CompareReductions(p, layered, []string{"ring", "reduce-to-one"})
	p.PerLayer, p.Algorithm = false, "reduce-to-one"
	r2o, err := Evaluate(p, []int{0}, "zb-h1", 1, false)
	if err != nil || rs[0].Plan.StepMS != 45 || rs[1].Plan.StepMS != r2o.StepMS {
		t.Errorf("compared: ring %v, reduce-to-one %v; want 45, %v per chunk (%v)", rs[0].Plan.StepMS, rs[1].Plan.StepMS, r2o.StepMS, err)
	}
}

// TestSolvePerLayerMatchesBruteForce: with per-layer buckets, whose
// all-reduce may start before a stage's last backward ends, the search
// still finds the fastest split.
func TestSolvePerLayerMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for trial := range 100 {
		p := withReplicas(r, randomProblem(r, r.IntN(10)-2), 2)
		p.PerLayer, p.Schedules = true, []string{"zb-h1", "1f1b"}
		want, _ := brute(t, p)
		got, err := Solve(p)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 {
			t.Fatalf("trial %d: step %v with %v (%s), brute force finds %v", trial, got.StepMS, got.Boundaries, got.Schedule, want)
		}
	}
}

// TestServersChargeAVStageOnce: under zb-v a stage holds two chunks, and
// its worker pushes both chunks' gradients at once when its step ends: one
// stage, layers 0 (3000 bytes on server 0) and 1 (1000 on server 1), two
// workers at 100 bytes/ms take twice 2 × 3000 / 100 = 120 ms after the 6 ms
// of compute, not 120 + 40 for the chunks apart.
func TestServersChargeAVStageOnce(t *testing.T) {
	layers := uniform(2, -1)
	layers[0].ServerBytes, layers[1].ServerBytes = []int64{3000, 0}, []int64{0, 1000}
	p := Problem{Layers: layers, Stages: 1, MicroBatches: 1, Batch: 2, MicroBatch: 1, Replicas: 2, Algorithm: "ps", AllReduceBytesPerMS: 100}
	pl, err := Evaluate(p, []int{0, 1}, "zb-v", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if pl.StepMS != 126 || !slices.Equal(pl.AllReduceMS, []float64{120}) {
		t.Errorf("step %v, push and pull %v; want 126, [120]", pl.StepMS, pl.AllReduceMS)
	}
}
