package plan

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// splits calls f with every contiguous split of n layers into p stages.
func splits(n, p int, f func([]int)) {
	cuts := make([]int, p)
	var rec func(s int)
	rec = func(s int) {
		if s == p {
			f(cuts)
			return
		}
		for c := cuts[s-1] + 1; c <= n-(p-s); c++ {
			cuts[s] = c
			rec(s + 1)
		}
	}
	rec(1)
}

// brute simulates every split of every candidate and returns the fastest step
// time among those within the memory limit (+Inf if none), and the smallest
// largest stage memory of any split (the smallest limit that fits).
func brute(t *testing.T, p Problem) (step float64, need int64) {
	t.Helper()
	step, need = math.Inf(1), math.MaxInt64
	counts := []int{p.MicroBatches}
	if p.MicroBatches == 0 {
		counts = p.Candidates
	}
	names := p.Schedules
	if len(names) == 0 {
		names = []string{"1f1b"}
	}
	for _, m := range counts {
		for _, name := range names {
			for _, recompute := range recomputeChoices(p, name) {
				splits(len(p.Layers), p.Stages, func(cuts []int) {
					pl, err := Evaluate(p, cuts, name, m, recompute)
					if err != nil {
						t.Fatalf("Evaluate(%v, %s, %d, recompute %v): %v", cuts, name, m, recompute, err)
					}
					peak := slices.Max(pl.MemoryBytes)
					need = min(need, peak)
					if p.MemoryLimit == 0 || peak <= p.MemoryLimit {
						step = min(step, pl.StepMS)
					}
				})
			}
		}
	}
	return step, need
}

// randomProblem draws a small problem; with heavy >= 0 that layer is 8x
// costlier and wider than the others.
func randomProblem(r *rand.Rand, heavy int) Problem {
	n := 2 + r.IntN(7)
	if heavy >= n {
		heavy = r.IntN(n)
	}
	layers := make([]Layer, n)
	for k := range layers {
		w := 1.0
		if k == heavy {
			w = 8
		}
		f := w * (0.5 + r.Float64())
		l := Layer{
			Name:       fmt.Sprintf("l%d", k),
			F:          f,
			B:          f * (1.5 + r.Float64()),
			ActBytes:   int64(w * float64(1000+r.IntN(4000))),
			ParamBytes: int64(w * float64(2000+r.IntN(8000))),
			OutBytes:   int64(w * float64(100+r.IntN(900))),
		}
		if r.IntN(2) == 0 {
			l.I = l.B * (0.3 + 0.4*r.Float64())
			l.W = l.B - l.I
		}
		layers[k] = l
	}
	all := Schedules()
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	p := Problem{
		Layers:             layers,
		Stages:             2 + r.IntN(min(3, n-1)),
		Batch:              16,
		MicroBatch:         []int{1, 2, 4}[r.IntN(3)],
		OverheadMS:         0.05 * float64(r.IntN(3)),
		Schedules:          all[:1+r.IntN(len(all))],
		TransferBytesPerMS: float64(r.IntN(3)) * 1000,
		LatencyMS:          0.01 * float64(r.IntN(3)),
	}
	if r.IntN(2) == 0 {
		p.MicroBatches = []int{1, 2, 4, 8, 16}[r.IntN(5)]
	} else {
		p.Candidates = []int{16, 2, 4, 8, 1}[:1+r.IntN(5)]
	}
	if r.IntN(2) == 0 {
		p.Recompute, p.InputBytes = true, int64(100+r.IntN(900))
	}
	return p
}

func TestSolveMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var solved, refused, recomputed int
	for trial := range 600 {
		heavy := -1
		if trial%2 == 0 {
			heavy = r.IntN(8)
		}
		p := randomProblem(r, heavy)
		free := p
		_, need := brute(t, free)
		switch trial % 4 {
		case 1: // a limit some splits meet
			p.MemoryLimit = need + r.Int64N(need/2+1)
		case 2: // a limit only the leanest split meets
			p.MemoryLimit = need
		case 3: // nothing fits
			p.MemoryLimit = need - 1 - r.Int64N(need/4+1)
		}
		want, _ := brute(t, p)
		name := fmt.Sprintf("trial %d (%d layers, %d stages, limit %d)", trial, len(p.Layers), p.Stages, p.MemoryLimit)
		got, err := Solve(p)
		if math.IsInf(want, 1) {
			if err == nil {
				t.Fatalf("%s: got plan %+v, want a memory error", name, got)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("smallest limit that fits is %d bytes", need)) {
				t.Fatalf("%s: error %q does not give the smallest limit %d", name, err, need)
			}
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 {
			t.Fatalf("%s: step %v with %v (%s, m=%d), brute force finds %v", name, got.StepMS, got.Boundaries, got.Schedule, got.MicroBatches, want)
		}
		if p.MemoryLimit > 0 && slices.Max(got.MemoryBytes) > p.MemoryLimit {
			t.Fatalf("%s: memory %v over the limit", name, got.MemoryBytes)
		}
		if got.Recompute && !p.Recompute {
			t.Fatalf("%s: recomputing, which the problem does not allow", name)
		}
		again, err := Evaluate(p, got.Boundaries, got.Schedule, got.MicroBatches, got.Recompute)
		if err != nil {
			t.Fatalf("%s: Evaluate: %v", name, err)
		}
		if again.StepMS != got.StepMS || !slices.Equal(again.Bubble, got.Bubble) || !slices.Equal(again.MemoryBytes, got.MemoryBytes) {
			t.Fatalf("%s: Evaluate gives %+v, Solve %+v", name, again, got)
		}
		if got.Recompute {
			recomputed++
		}
		solved++
	}
	t.Logf("%d plans matched brute force (%d recomputing), %d memory errors checked", solved, recomputed, refused)
	if recomputed == 0 {
		t.Error("no plan recomputed: the trials never needed it to fit")
	}
}

// uniform returns n identical layers, with layer heavy (if any) 8x costlier.
func uniform(n, heavy int) []Layer {
	layers := make([]Layer, n)
	for k := range layers {
		w := 1.0
		if k == heavy {
			w = 8
		}
		layers[k] = Layer{Name: fmt.Sprint(k), F: w, B: 2 * w, ActBytes: int64(w * 100), ParamBytes: int64(w * 1000), OutBytes: 10}
	}
	return layers
}

func TestHeavyLayerIsolated(t *testing.T) {
	for _, sched := range Schedules() {
		for heavy := range 8 {
			p := Problem{Layers: uniform(8, heavy), Stages: 4, MicroBatches: 8, Batch: 8, MicroBatch: 1, Schedules: []string{sched}}
			pl, err := Solve(p)
			if err != nil {
				t.Fatal(err)
			}
			// The heavy layer's stage holds it alone: with 7 light layers
			// left for 3 stages, anything else makes that stage the
			// bottleneck for nothing.
			s, _ := slices.BinarySearch(pl.Boundaries, heavy+1)
			start, end := pl.Boundaries[s-1], len(p.Layers)
			if s < len(pl.Boundaries) {
				end = pl.Boundaries[s]
			}
			if start != heavy || end != heavy+1 {
				t.Errorf("%s, heavy layer %d: boundaries %v put it in [%d, %d)", sched, heavy, pl.Boundaries, start, end)
			}
		}
	}
}

func TestBalancedSplit(t *testing.T) {
	p := Problem{Layers: uniform(12, -1), Stages: 4, MicroBatches: 8, Batch: 8, MicroBatch: 1}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pl.Boundaries, []int{0, 3, 6, 9}) || pl.Schedule != "1f1b" {
		t.Fatalf("got %+v, want the even split under 1f1b", pl)
	}
	// 1F1B with uniform stages: (m + p - 1) * (F + B).
	if want := float64(8+3) * 9; pl.StepMS != want {
		t.Fatalf("step %v, want %v", pl.StepMS, want)
	}
}

func TestMemoryLimitExcludesSplits(t *testing.T) {
	// Four equal layers (1000 parameter bytes each) on 2 stages under 1f1b
	// with 4 micro-batches: stage 0 stashes 2 micro-batches, stage 1 one.
	// Layers 0 and 1 keep 1000 activation bytes, layers 2 and 3 keep 100.
	// The even split is the fastest but needs 2000 + 2*2000 = 6000 bytes on
	// stage 0; cutting after layer 0 needs 1000 + 2*1000 = 3000 and
	// 3000 + 1200 = 4200, the least any split needs.
	p := Problem{Layers: uniform(4, -1), Stages: 2, MicroBatches: 4, Batch: 4, MicroBatch: 1}
	p.Layers[0].ActBytes, p.Layers[1].ActBytes = 1000, 1000
	free, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(free.Boundaries, []int{0, 2}) || !slices.Equal(free.MemoryBytes, []int64{6000, 2200}) {
		t.Fatalf("unlimited: got %+v", free)
	}
	p.MemoryLimit = 5999
	lim, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lim.Boundaries, []int{0, 1}) || !slices.Equal(lim.MemoryBytes, []int64{3000, 4200}) {
		t.Fatalf("limited: got %+v, want the cut after layer 0", lim)
	}
	if lim.StepMS <= free.StepMS {
		t.Fatalf("limited split %v ms should be slower than the free one %v ms", lim.StepMS, free.StepMS)
	}

	// Below that nothing fits, and the error says how much would.
	p.MemoryLimit = 4199
	_, err = Solve(p)
	if err == nil || !strings.Contains(err.Error(), "memory limit of 4199 bytes") ||
		!strings.Contains(err.Error(), "smallest limit that fits is 4200 bytes (1f1b, 4 micro-batches)") {
		t.Fatalf("got error %v", err)
	}
	// gpipe stashes all 4 micro-batches on every stage: its leanest split
	// (the same cut) needs 3000 + 4*1200 = 7800 bytes on stage 1.
	p.Schedules, p.MemoryLimit = []string{"gpipe"}, 6000
	if _, err = Solve(p); err == nil || !strings.Contains(err.Error(), "smallest limit that fits is 7800 bytes (gpipe, 4 micro-batches)") {
		t.Fatalf("got error %v", err)
	}
}

// TestSplitScheduleCountsSplitActivations: under zb-h1 a stage is charged its
// layers' SplitActBytes (what a micro-batch keeps until its weight pass),
// under 1f1b their ActBytes; a layer without SplitActBytes counts ActBytes
// under both.
func TestSplitScheduleCountsSplitActivations(t *testing.T) {
	p := Problem{Layers: uniform(4, -1), Stages: 2, MicroBatches: 4, Batch: 4, MicroBatch: 1}
	p.Layers[1].SplitActBytes, p.Layers[3].SplitActBytes = 1000, 500
	// 1f1b stashes 2 micro-batches on stage 0 and 1 on stage 1, zb-h1 2 on
	// both (its weight passes keep them longer).
	for _, c := range []struct {
		sched string
		want  []int64
	}{
		{"1f1b", []int64{2000 + 2*200, 2000 + 200}},
		{"zb-h1", []int64{2000 + 2*1100, 2000 + 2*600}},
	} {
		p.Schedules = []string{c.sched}
		pl, err := Solve(p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(pl.Boundaries, []int{0, 2}) || !slices.Equal(pl.MemoryBytes, c.want) {
			t.Errorf("%s: got %v, memory %v; want the even split, memory %v", c.sched, pl.Boundaries, pl.MemoryBytes, c.want)
		}
	}
	p.Layers[0].SplitActBytes = -1
	if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), "byte counts must be >= 0") {
		t.Errorf("negative SplitActBytes: %v", err)
	}
}

func TestChoosesMicroBatches(t *testing.T) {
	base := Problem{Layers: uniform(8, 2), Stages: 4, Batch: 32, MicroBatch: 4, OverheadMS: 0.5,
		Schedules: []string{"gpipe", "1f1b", "zb-h1"}, LatencyMS: 0.2}
	counts := []int{32, 1, 2, 4, 8, 16}
	best, bestM := math.Inf(1), 0
	for _, m := range slices.Sorted(slices.Values(counts)) {
		p := base
		p.MicroBatches = m
		pl, err := Solve(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("m=%2d: %.3f ms (%s, %v)", m, pl.StepMS, pl.Schedule, pl.Boundaries)
		if pl.StepMS < below(best) {
			best, bestM = pl.StepMS, m
		}
	}
	p := base
	p.Candidates = counts
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if pl.MicroBatches != bestM || pl.StepMS != best {
		t.Fatalf("chose m=%d (%v ms), want m=%d (%v ms)", pl.MicroBatches, pl.StepMS, bestM, best)
	}
	// The overhead makes the extremes lose: neither 1 (no overlap) nor 32
	// (all overhead) micro-batches.
	if bestM == 1 || bestM == 32 {
		t.Fatalf("best micro-batch count %d is an extreme", bestM)
	}
}

func TestTiesPreferFewerMicroBatchesThenScheduleOrder(t *testing.T) {
	// One stage: no pipeline, so every schedule and micro-batch count
	// without overhead gives the same step time.
	p := Problem{Layers: uniform(3, -1), Stages: 1, Batch: 8, MicroBatch: 1,
		Candidates: []int{8, 4, 2}, Schedules: []string{"zb-h1", "gpipe"}}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if pl.MicroBatches != 2 || pl.Schedule != "zb-h1" || pl.StepMS != 8*9 {
		t.Fatalf("got %+v", pl)
	}
}

func TestBadInputs(t *testing.T) {
	ok := Problem{Layers: uniform(4, -1), Stages: 2, MicroBatches: 4, Batch: 8, MicroBatch: 1}
	for _, tc := range []struct {
		name string
		edit func(*Problem)
		want string
	}{
		{"too few layers", func(p *Problem) { p.Stages = 5 }, "4 layers cannot fill 5 stages"},
		{"no stages", func(p *Problem) { p.Stages = 0 }, "stages must be >= 1"},
		{"no batch", func(p *Problem) { p.Batch = 0 }, "batch"},
		{"m does not divide", func(p *Problem) { p.MicroBatches = 3 }, "3 micro-batches"},
		{"bad candidate", func(p *Problem) { p.MicroBatches, p.Candidates = 0, []int{2, 5} }, "5 micro-batches"},
		{"no candidates", func(p *Problem) { p.MicroBatches = 0 }, "Candidates"},
		{"interleaved", func(p *Problem) { p.Schedules = []string{"interleaved"} }, `"interleaved" not supported`},
		{"negative cost", func(p *Problem) { p.Layers = uniform(4, -1); p.Layers[1].B = -1 }, "layer 1"},
		{"NaN", func(p *Problem) { p.Layers = uniform(4, -1); p.Layers[2].F = math.NaN() }, "layer 2"},
		{"negative limit", func(p *Problem) { p.MemoryLimit = -1 }, "memory limit"},
		{"negative latency", func(p *Problem) { p.LatencyMS = -1 }, "latency"},
	} {
		p := ok
		tc.edit(&p)
		if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	for _, b := range [][]int{{0}, {1, 2}, {0, 0}, {0, 4}, {0, 3, 2}} {
		if _, err := Evaluate(ok, b, "1f1b", 4, false); err == nil {
			t.Errorf("Evaluate accepted boundaries %v", b)
		}
	}
	if _, err := Evaluate(ok, []int{0, 2}, "1f1b", 3, false); err == nil {
		t.Error("Evaluate accepted 3 micro-batches for a batch of 8")
	}
}

func TestScalesWithMicroBatchSize(t *testing.T) {
	// Measured at micro-batch 2; a batch of 8 in 2 micro-batches runs
	// micro-batches of 4: twice the measured costs and activations.
	p := Problem{Layers: []Layer{{F: 1, B: 2, ActBytes: 3, ParamBytes: 10, OutBytes: 1000}}, Stages: 1,
		MicroBatches: 2, Batch: 8, MicroBatch: 2, OverheadMS: 0.5}
	pl, err := Evaluate(p, []int{0}, "gpipe", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * (2*1 + 0.5 + 2*2 + 0.5); pl.StepMS != want {
		t.Errorf("step %v, want %v", pl.StepMS, want)
	}
	if want := int64(10 + 2*6); pl.MemoryBytes[0] != want {
		t.Errorf("memory %v, want %v", pl.MemoryBytes[0], want)
	}
}

func TestMediumProblemsMatchBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 25 {
		p := randomProblem(r, r.IntN(12))
		n := 9 + r.IntN(4)
		p.Layers = append(p.Layers, randomProblem(r, -1).Layers...)
		for len(p.Layers) < n {
			p.Layers = append(p.Layers, p.Layers[r.IntN(len(p.Layers))])
		}
		p.Layers = p.Layers[:n]
		p.Stages = 3 + r.IntN(3)
		p.Schedules = Schedules()
		p.MicroBatches, p.Candidates = 0, []int{2, 4, 8, 16}
		if trial%2 == 1 {
			_, need := brute(t, p)
			p.MemoryLimit = need + need/4
		}
		want, _ := brute(t, p)
		got, err := Solve(p)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 {
			t.Fatalf("trial %d (%d layers, %d stages): step %v with %v (%s, m=%d), brute force finds %v",
				trial, n, p.Stages, got.StepMS, got.Boundaries, got.Schedule, got.MicroBatches, want)
		}
	}
}

// TestBoundsNeverExceedTheSimulator checks the search's lower bound on whole
// splits against the simulator, for every schedule, on splits good and bad.
func TestBoundsNeverExceedTheSimulator(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 300 {
		n, stages := 4+r.IntN(30), 2+r.IntN(7)
		if stages > n {
			stages = n
		}
		p := randomProblem(r, r.IntN(n))
		for len(p.Layers) < n {
			p.Layers = append(p.Layers, randomProblem(r, -1).Layers...)
		}
		p.Layers, p.Stages, p.Batch = p.Layers[:n], stages, 64
		m := []int{1, 2, 4, 8, 16, 32, 64}[r.IntN(7)]
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
					t.Fatalf("trial %d, %s, m=%d, split %v: bound %v above the simulated %v", trial, name, m, cuts, lb, pl.StepMS)
				}
			}
		}
	}
}

// TestLargerProblem checks a realistic size: the plan is no slower than the
// bottleneck split, the choice among micro-batch counts agrees with solving
// each count alone, and repeated calls agree exactly.
func TestLargerProblem(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	layers := make([]Layer, 48)
	for k := range layers {
		f := 1 + r.Float64()
		if k%13 == 5 {
			f *= 4
		}
		layers[k] = Layer{F: f, B: 2 * f, ActBytes: 1 << 20, ParamBytes: 1 << 24, OutBytes: 1 << 18}
	}
	p := Problem{Layers: layers, Stages: 8, Batch: 64, MicroBatch: 1, OverheadMS: 0.05,
		Candidates: []int{4, 8, 16, 32}, Schedules: Schedules(), TransferBytesPerMS: 1 << 20, LatencyMS: 0.01}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(pl, again) {
		t.Fatalf("two calls disagree: %+v and %+v", pl, again)
	}
	t.Logf("%s, m=%d, %v: %.3f ms", pl.Schedule, pl.MicroBatches, pl.Boundaries, pl.StepMS)
	best := math.Inf(1)
	for _, m := range p.Candidates {
		for _, name := range p.Schedules {
			one := p
			one.MicroBatches, one.Schedules = m, []string{name}
			q, err := Solve(one)
			if err != nil {
				t.Fatal(err)
			}
			best = min(best, q.StepMS)
			d, _ := newModel(one)
			c, _ := d.candidate(name, m, false)
			if err := c.prepare(); err != nil {
				t.Fatal(err)
			}
			if q.StepMS > c.seed.StepMS {
				t.Errorf("%s, m=%d: plan %v ms slower than the seed %v ms", name, m, q.StepMS, c.seed.StepMS)
			}
		}
	}
	if math.Abs(pl.StepMS-best) > 1e-9 {
		t.Errorf("Solve over all candidates gives %v ms, the best single candidate %v ms", pl.StepMS, best)
	}
}

func TestBudgetRunsOut(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	p := randomProblem(r, 3)
	for len(p.Layers) < 16 {
		p.Layers = append(p.Layers, randomProblem(r, -1).Layers...)
	}
	p.Layers, p.Stages, p.Schedules = p.Layers[:16], 4, Schedules()
	p.MicroBatches, p.Candidates = 0, []int{4, 8}
	exact, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func(b int) { searchBudget = b }(searchBudget)
	searchBudget = 1
	quick, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	check, err := Evaluate(p, quick.Boundaries, quick.Schedule, quick.MicroBatches, false)
	if err != nil {
		t.Fatal(err)
	}
	if quick.StepMS < exact.StepMS || check.StepMS != quick.StepMS {
		t.Fatalf("with no budget: %+v (evaluates to %v ms); exact: %+v", quick, check.StepMS, exact)
	}
}

// TestFixedActivationsDoNotScale: what a micro-batch keeps whatever its size
// (FixedActBytes) is charged per micro-batch in flight but never scaled by
// the micro-batch size, unlike ActBytes.
func TestFixedActivationsDoNotScale(t *testing.T) {
	// One layer, one stage, gpipe with m micro-batches of Batch/m samples,
	// measured at 8 samples: 800 bytes growing with the size, 5000 fixed.
	p := Problem{Layers: []Layer{{F: 1, B: 2, ActBytes: 800, FixedActBytes: 5000, ParamBytes: 10, OutBytes: 1}},
		Stages: 1, Batch: 16, MicroBatch: 8, Schedules: []string{"gpipe"}}
	for _, tc := range []struct {
		m    int
		want int64
	}{{1, 10 + 1*(1600+5000)}, {2, 10 + 2*(800+5000)}, {4, 10 + 4*(400+5000)}} {
		got, err := Evaluate(p, []int{0}, "gpipe", tc.m, false)
		if err != nil {
			t.Fatal(err)
		}
		if got.MemoryBytes[0] != tc.want {
			t.Errorf("%d micro-batches: %d bytes, want %d", tc.m, got.MemoryBytes[0], tc.want)
		}
	}
}

// TestRecomputeMemoryIsPeakMemory: a recomputing plan's stage memory is its
// parameters plus what schedule.PeakMemory says the stage's actions hold,
// one micro-batch's activations and the inputs of the others in flight, the
// same walk run.json's prediction takes.
func TestRecomputeMemoryIsPeakMemory(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for trial := range 50 {
		p := randomProblem(r, -1)
		p.Recompute, p.InputBytes, p.Schedules = true, int64(1+r.IntN(1000)), recomputing
		m := p.MicroBatches
		if m == 0 {
			m = p.Candidates[0]
		}
		for _, name := range recomputing {
			splits(len(p.Layers), p.Stages, func(cuts []int) {
				pl, err := Evaluate(p, cuts, name, m, true)
				if err != nil {
					t.Fatal(err)
				}
				d, _ := newModel(p)
				c, _ := d.candidate(name, m, true)
				sched := c.sched.WithRecompute(func(int, int) bool { return true })
				for s := range p.Stages {
					end := len(p.Layers)
					if s+1 < p.Stages {
						end = cuts[s+1]
					}
					act := math.Ceil(float64(d.act[end]-d.act[cuts[s]])*c.mbs/float64(p.MicroBatch)) + float64(d.fixed[end]-d.fixed[cuts[s]])
					peak := sched.PeakMemory(func(st, _ int) schedule.ChunkMemory {
						return schedule.ChunkMemory{Machine: int64(act), Input: int64(c.input(cuts[s]))}
					})[s]
					if want := d.param[end] - d.param[cuts[s]] + peak; pl.MemoryBytes[s] != want {
						t.Fatalf("trial %d %s %v stage %d: %d bytes, PeakMemory gives %d", trial, name, cuts, s, pl.MemoryBytes[s], want)
					}
				}
			})
		}
	}
}
