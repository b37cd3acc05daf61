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
