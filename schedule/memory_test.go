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
