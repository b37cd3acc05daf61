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

// randomVProblem draws a small problem of 2 or 3 stages with at least two
// layers a stage, planned for the named V schedule at 4 or 8 micro-batches.
func randomVProblem(r *rand.Rand, name string) Problem {
	p := randomProblem(r, -1)
	p.Stages = 2 + r.IntN(2)
	for len(p.Layers) < 2*p.Stages+r.IntN(3) {
		p.Layers = append(p.Layers, p.Layers[r.IntN(len(p.Layers))])
	}
	p.Schedules, p.MicroBatches, p.Candidates = []string{name}, 0, []int{4, 8}
	return p
}

// TestZBVMatchesBruteForce: on problems small enough to search to the end,
// Solve's zb-v plan is as fast as the fastest of every V split within the
// memory limit, each stage charged its two chunks' own layers.
func TestZBVMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 60 {
		p := randomVProblem(r, "zb-v")
		want, need := math.Inf(1), int64(math.MaxInt64)
		for _, m := range p.Candidates {
			splits(len(p.Layers), 2*p.Stages, func(cuts []int) {
				pl, err := Evaluate(p, cuts, "zb-v", m, false)
				if err != nil {
					t.Fatalf("Evaluate(%v, zb-v, %d): %v", cuts, m, err)
				}
				need = min(need, slices.Max(pl.MemoryBytes))
				if p.MemoryLimit == 0 || slices.Max(pl.MemoryBytes) <= p.MemoryLimit {
					want = min(want, pl.StepMS)
				}
			})
		}
		if trial%2 == 1 { // a limit only some splits meet, then the brute force again
			p.MemoryLimit = need + r.Int64N(need/4+1)
			want = math.Inf(1)
			for _, m := range p.Candidates {
				splits(len(p.Layers), 2*p.Stages, func(cuts []int) {
					if pl, _ := Evaluate(p, cuts, "zb-v", m, false); slices.Max(pl.MemoryBytes) <= p.MemoryLimit {
						want = min(want, pl.StepMS)
					}
				})
			}
		}
		name := fmt.Sprintf("trial %d (%d layers, %d stages, limit %d)", trial, len(p.Layers), p.Stages, p.MemoryLimit)
		if trial%5 == 4 { // nothing fits: the error gives the smallest limit that does
			tight := p
			tight.MemoryLimit = need - 1
			if _, err := Solve(tight); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the smallest limit that fits is %d bytes (zb-v", need)) {
				t.Fatalf("%s: with limit %d: %v, want the smallest limit %d", name, need-1, err, need)
			}
		}
		got, err := Solve(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if math.Abs(got.StepMS-want) > 1e-9 || got.Schedule != "zb-v" || len(got.Boundaries) != 2*p.Stages {
			t.Fatalf("%s: step %v with %v (%s), brute force finds %v", name, got.StepMS, got.Boundaries, got.Schedule, want)
		}
		if p.MemoryLimit > 0 && slices.Max(got.MemoryBytes) > p.MemoryLimit {
			t.Fatalf("%s: memory %v over the limit", name, got.MemoryBytes)
		}
	}
}

// simulatesChunks evaluates a V split of p's layers under the named
// schedule, with p.MicroBatches, and checks its step against the simulator's
// on each chunk's own layers (I and W half of B each) and the given
// transfer cost; it returns the plan.
func simulatesChunks(t *testing.T, p Problem, name string, cuts []int, transfer float64) *Plan {
	t.Helper()
	pl, err := Evaluate(p, cuts, name, p.MicroBatches, false)
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedule.Build(name, p.Stages, p.MicroBatches, 2)
	if err != nil {
		t.Fatal(err)
	}
	c := schedule.UniformCosts(p.Stages, 0, 0, transfer)
	top := s.Topology()
	c.Chunks = make([][]schedule.ChunkCost, p.Stages)
	for st := range c.Chunks {
		c.Chunks[st] = make([]schedule.ChunkCost, 2)
	}
	for k, i := range cuts {
		j := len(p.Layers)
		if k+1 < len(cuts) {
			j = cuts[k+1]
		}
		var x schedule.ChunkCost
		for _, l := range p.Layers[i:j] {
			x.F, x.B, x.I, x.W = x.F+l.F, x.B+l.B, x.I+l.B/2, x.W+l.B/2
		}
		st, ch := top.Locate(k)
		c.Chunks[st][ch] = x
	}
	tl, err := schedule.Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(tl.Makespan-pl.StepMS) > 1e-9 {
		t.Errorf("%s: step %v, the simulator on per-chunk costs %v", name, pl.StepMS, tl.Makespan)
	}
	return pl
}

// TestZBVChargesEachChunkItsLayers: a V split's step is the simulator's on
// per-chunk costs, its memory each chunk's parameters plus its peak
// micro-batches (zb-v's min(m, 2p-1-s) and min(m, s+1)) of its activations,
// and the turn of the V costs no transfer.
func TestZBVChargesEachChunkItsLayers(t *testing.T) {
	layers := uniform(6, 4) // layer 4, stage 1's chunk 1 below, is 8x
	p := Problem{Layers: layers, Stages: 2, Batch: 8, MicroBatch: 2, MicroBatches: 4, LatencyMS: 5}
	cuts := []int{0, 2, 3, 4} // stage 0: layers 0-1 and 4-5; stage 1: layer 2 and layer 3
	pl := simulatesChunks(t, p, "zb-v", cuts, 5)
	// Stage 0 holds min(4, 3) micro-batches on chunk 0 and min(4, 1) on
	// chunk 1; stage 1 two on each.
	want := []int64{2*1000 + 3*2*100 + 1000 + 8000 + 1*(100+800), 1000 + 2*100 + 1000 + 2*100}
	if !slices.Equal(pl.MemoryBytes, want) {
		t.Errorf("memory %v, want %v", pl.MemoryBytes, want)
	}
	if _, err := Evaluate(p, []int{0, 3}, "zb-v", 4, false); err == nil || !strings.Contains(err.Error(), "2 boundaries for 2 stages of 2 model stages each under zb-v") {
		t.Errorf("one boundary per stage: %v", err)
	}
}

// TestZBVSkipsTooFewMicroBatches: a micro-batch count zb-v does not take is
// left out of its candidates, not an error, unless none is left.
func TestZBVSkipsTooFewMicroBatches(t *testing.T) {
	p := Problem{Layers: uniform(8, -1), Stages: 4, Batch: 16, MicroBatch: 1, Candidates: []int{1, 2, 8}, Schedules: []string{"zb-v", "1f1b"}}
	pl, err := Solve(p)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Schedule != "zb-v" || pl.MicroBatches != 8 {
		t.Errorf("plan %s with %d micro-batches, want zb-v with 8 (the fastest with F = I = W)", pl.Schedule, pl.MicroBatches)
	}
	p.Candidates, p.Schedules = []int{1, 2}, []string{"zb-v"}
	if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), "zb-v needs micro_batches >= 6 for 4 stages") {
		t.Errorf("only too few micro-batches: %v", err)
	}
	p.Layers = uniform(7, -1)
	p.Candidates = []int{8}
	if _, err := Solve(p); err == nil || !strings.Contains(err.Error(), "7 layers cannot fill the 8 model stages of zb-v on 4 stages") {
		t.Errorf("too few layers: %v", err)
	}
}
