package schedule

import (
	"fmt"
	"strings"
	"testing"
)

// TestWithRecomputeOnEveryBuiltin: recomputing every chunk of every
// built-in schedule still passes Check, lowers and plays the same as its
// compute; each stage's busy time grows by exactly its micro-batches'
// forwards, and every RF sits right before its B or I.
func TestWithRecomputeOnEveryBuiltin(t *testing.T) {
	for _, name := range Names() {
		for p := 1; p <= 4; p++ {
			for _, m := range []int{4, 8, 12} {
				for v := 1; v <= 2; v++ {
					s, err := Build(name, p, m, v)
					if err != nil {
						continue
					}
					t.Run(fmt.Sprintf("%s/p%d/m%d/v%d", name, p, m, v), func(t *testing.T) {
						testRecomputeAll(t, s)
					})
				}
			}
		}
	}
}

func testRecomputeAll(t *testing.T, s *Schedule) {
	r := s.WithRecompute(func(int, int) bool { return true })
	if err := r.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for st, list := range r.Actions {
		if got, want := len(list), len(s.Actions[st])+s.MicroBatches*s.Chunks; got != want {
			t.Fatalf("stage %d: %d actions, want %d", st, got, want)
		}
		for j, a := range list {
			if a.Kind != Recompute {
				continue
			}
			next := list[j+1]
			if (next.Kind != Backward && next.Kind != Input) || next.MicroBatch != a.MicroBatch || next.Chunk != a.Chunk {
				t.Fatalf("stage %d: %v is followed by %v, not its backward", st, a, next)
			}
		}
	}
	if s.Actions[0][0].Kind == Recompute || RecomputesChunk(s.Actions[0], 0) {
		t.Fatal("WithRecompute changed its receiver")
	}
	costs := UniformCosts(s.Stages, 1, 2, 0.25)
	before, err := Simulate(s, costs)
	if err != nil {
		t.Fatal(err)
	}
	after, err := Simulate(r, costs)
	if err != nil {
		t.Fatal(err)
	}
	for st := range s.Stages {
		if d := after.Busy[st] - before.Busy[st]; !near(d, float64(s.MicroBatches)) {
			t.Errorf("stage %d: busy %v more, want %d forwards' worth", st, d, s.MicroBatches)
		}
	}
	if after.Makespan < before.Makespan {
		t.Errorf("recomputing shortened the step: %v < %v", after.Makespan, before.Makespan)
	}
	l, err := Lower(r)
	if err != nil {
		t.Fatalf("Lower: %v", err)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("lowered Check: %v", err)
	}
	played, err := l.Simulate(costs)
	if err != nil {
		t.Fatal(err)
	}
	if !near(played.Makespan, after.Makespan) {
		t.Errorf("lowered makespan %v, compute %v", played.Makespan, after.Makespan)
	}
	back, err := ParseLoweredGrid(l.Grid())
	if err != nil {
		t.Fatalf("the lowered grid does not parse back: %v", err)
	}
	if back.Grid() != l.Grid() {
		t.Errorf("grid round trip:\n%s\nwant\n%s", back.Grid(), l.Grid())
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestRecomputeOnlyWhereAsked: the pass touches the chunks it is asked to
// and no other, and leaves a chunk that already recomputes alone.
func TestRecomputeOnlyWhereAsked(t *testing.T) {
	s, err := Build("interleaved", 2, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	r := s.WithRecompute(func(st, c int) bool { return st == 1 && c == 0 })
	for st, list := range r.Actions {
		for c := range 2 {
			if got, want := RecomputesChunk(list, c), st == 1 && c == 0; got != want {
				t.Errorf("stage %d chunk %d recomputes: %v, want %v", st, c, got, want)
			}
		}
	}
	again := r.WithRecompute(func(int, int) bool { return true })
	if got, want := len(again.Actions[1]), len(r.Actions[1])+4; got != want {
		t.Errorf("recomputing twice: stage 1 has %d actions, want %d (one RF per micro-batch of the other chunk)", got, want)
	}
	if err := again.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckRejectsMisplacedRecompute names the offending action.
func TestCheckRejectsMisplacedRecompute(t *testing.T) {
	for _, c := range []struct{ grid, want string }{
		{"stage 0: 0F0 0F1 0B0 0RF1 0B1", "stage 0: action 0RF1 at position 3: chunk 0 keeps micro-batch 0's activations, so it must keep every one's (recompute all or none)"},
		{"stage 0: 0F0 0F1 0RF0 0B0 0RF1 0B1 0RF1", "appears twice"},
		{"stage 0: 0RF0 0F0 0F1 0B0 0RF1 0B1", "action 0RF0 at position 0 comes before 0F0 at position 1"},
		{"stage 0: 0F0 0F1 0B0 0RF0 0RF1 0B1", "action 0B0 at position 2 comes before 0RF0 at position 3"},
		{"stage 0: 0F0 0F1 0RF0 0B0 0B1", "stage 0: missing action 0RF1 (chunk 0 recomputes micro-batch 0, so it must recompute every one)"},
	} {
		s, err := ParseGrid(c.grid)
		if err != nil {
			t.Fatalf("%q: %v", c.grid, err)
		}
		err = s.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: Check() = %v, want an error containing %q", c.grid, err, c.want)
		}
	}
	s, err := ParseGrid("stage 0: 0F0 0F1 0RF1 0RF0 0B0 0B1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(); err != nil {
		t.Errorf("recomputing ahead of the backward is allowed: %v", err)
	}
}

// TestRecomputeParses: RF round-trips as an action and as a compute op, and
// does not collide with a reduction's "R".
func TestRecomputeParses(t *testing.T) {
	for _, want := range []Action{{Stage: 2, Kind: Recompute, MicroBatch: 7}, {Stage: 0, Kind: Recompute, MicroBatch: 1, Chunk: 1}} {
		got, err := ParseAction(want.String())
		if err != nil || got != want {
			t.Errorf("ParseAction(%q) = %v, %v", want.String(), got, err)
		}
	}
	if o, err := ParseOp("2RF0c1"); err != nil || o.Kind != Compute || o.Action.Kind != Recompute {
		t.Errorf("ParseOp(2RF0c1) = %v (%v), %v", o, o.Kind, err)
	}
	if o, err := ParseOp("2Rc1"); err != nil || o.Kind != ReduceGrad || o.Action.Chunk != 1 {
		t.Errorf("ParseOp(2Rc1) = %v (%v), %v", o, o.Kind, err)
	}
	if _, err := ParseAction("2R0"); err == nil || !strings.Contains(err.Error(), `recomputation is "RF"`) {
		t.Errorf(`ParseAction("2R0") = %v, want a hint at "RF"`, err)
	}
}

// TestPeakMemoryWithRecompute: 1F1B's stage s keeps p-s machines' worth of
// activations, or with recomputation one machine and p-s inputs, of which
// the machine holds one.
func TestPeakMemoryWithRecompute(t *testing.T) {
	const p, machine, input = 4, 100, 1
	s, err := Build("1f1b", p, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	mem := func(int, int) ChunkMemory { return ChunkMemory{Machine: machine, Input: input} }
	kept := s.PeakMemory(mem)
	r := s.WithRecompute(func(st, _ int) bool { return st < 2 })
	recomputed := r.PeakMemory(mem)
	for st := range p {
		want := int64(machine * (p - st))
		if st < 2 {
			want = machine + int64(input*(p-st-1))
		}
		if recomputed[st] != want {
			t.Errorf("stage %d: %d bytes with recomputation, want %d (kept: %d)", st, recomputed[st], want, kept[st])
		}
	}
	// Split backwards keep their I-to-W stash whether or not they recompute.
	z, err := Build("zb-h1", p, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	stash := func(int, int) ChunkMemory { return ChunkMemory{Machine: machine, Input: input, Stash: 10, Weight: 5} }
	zr, zk := z.WithRecompute(func(int, int) bool { return true }).PeakMemory(stash), z.PeakMemory(stash)
	for st, got := range zr {
		// Only a stage with several micro-batches in flight saves.
		if got > zk[st] || st == 0 && got >= zk[st] || got < machine+5 {
			t.Errorf("zb-h1 stage %d: %d bytes recomputing, %d keeping", st, got, zk[st])
		}
	}
}

func TestRecomputes(t *testing.T) {
	s, err := Build("1f1b", 3, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Recomputes() || !s.WithRecompute(func(st, _ int) bool { return st == 2 }).Recomputes() || s.WithRecompute(func(int, int) bool { return false }).Recomputes() {
		t.Error("Recomputes does not say whether a stage recomputes")
	}
}
