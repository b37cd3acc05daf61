package schedule

import "testing"

func TestPeakMemoryOf1F1B(t *testing.T) {
	s, err := Build("1f1b", 4, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := s.PeakMemory(func(int, int) ChunkMemory { return ChunkMemory{Machine: 10} })
	for st, n := range got {
		if want := int64(10 * (4 - st)); n != want {
			t.Errorf("stage %d: %d bytes, want %d (1F1B keeps p-s micro-batches)", st, n, want)
		}
	}
}

// TestPeakMemoryMixedBackward: on a chunk that splits some backwards, a full
// backward runs as I then W, after which the weight program's registers are
// held as after a W.
func TestPeakMemoryMixedBackward(t *testing.T) {
	mem := func(int, int) ChunkMemory { return ChunkMemory{Machine: 10, Stash: 3, Weight: 5} }
	s := mustParse(t, "stage 0: 0F0 0F1 0B0 0I1 0W1")
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	// Two machines, the weight registers from B0, then I1's stash.
	if got := s.PeakMemory(mem); got[0] != 2*10+5+3 {
		t.Errorf("peak %d bytes, want %d", got[0], 2*10+5+3)
	}
	// Not split: B0 leaves no weight registers, and there are none to hold.
	s = mustParse(t, "stage 0: 0F0 0F1 0B0 0B1")
	if got := s.PeakMemory(mem); got[0] != 2*10 {
		t.Errorf("fused: peak %d bytes, want %d", got[0], 2*10)
	}
}

// TestPeakMemoryIsSteadyAfterTwoSteps: pools grown in one step are whole
// from the start of the next, which can then hold more than the first did
// (interleaved-zb recomputing, where a chunk's stash pool reaches its size
// at the end of the step while the next step's forwards keep their
// inputs); a third step repeats the second, for every builtin, split and
// recomputing or not.
func TestPeakMemoryIsSteadyAfterTwoSteps(t *testing.T) {
	mem := func(st, ch int) ChunkMemory {
		return ChunkMemory{Machine: int64(576 - 64*ch - 32*st), Stash: int64(240 - 64*ch - 32*st), Weight: 28, Input: 128}
	}
	grew := false
	for _, name := range Names() {
		for _, recompute := range []bool{false, true} {
			p, m, v := 2, 4, 1
			switch name {
			case "interleaved", "interleaved-zb", "zb-v", "dualpipev":
				v = 2
			}
			s, err := Build(name, p, m, v)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if recompute {
				s = s.WithRecompute(func(int, int) bool { return true })
			}
			one, two, three := s.peakMemory(mem, 1), s.peakMemory(mem, 2), s.peakMemory(mem, 3)
			for st := range two {
				if three[st] != two[st] || two[st] < one[st] {
					t.Errorf("%s recompute %v stage %d: %d, %d, %d bytes over 1, 2, 3 steps", name, recompute, st, one[st], two[st], three[st])
				}
				grew = grew || two[st] > one[st]
				if name == "interleaved-zb" && recompute && two[st] == one[st] {
					t.Errorf("interleaved-zb recomputing, stage %d: the second step holds no more than the first (%d bytes)", st, one[st])
				}
			}
		}
	}
	if !grew {
		t.Error("no schedule holds more in its second step: the test no longer looks at the right case")
	}
}
