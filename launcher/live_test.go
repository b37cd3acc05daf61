package launcher

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestLiveBubble writes two stages' events in pieces, as flushes cut them, and
// checks the bubble of the complete steps: stage 0 busy 6 of a 10 ns window and
// stage 1 busy 2, so the mean idle fraction is (0.4 + 0.8) / 2.
func TestLiveBubble(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "events"), 0o755)
	files := make([]*os.File, 2)
	for i := range files {
		f, err := os.Create(filepath.Join(dir, "events", fmt.Sprintf("stage-%d.jsonl", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	ev := func(stage, step int, kind string, start, end int64) string {
		return fmt.Sprintf(`{"stage":%d,"step":%d,"kind":%q,"mb":0,"start_ns":%d,"end_ns":%d}`+"\n", stage, step, kind, start, end)
	}
	l := NewLive(dir, 2, 5)
	if _, _, ok := l.Bubble(); ok {
		t.Fatal("bubble before any step")
	}
	base := int64(1000)
	s0 := ev(0, 0, "F", base, base+3) + ev(0, 0, "B", base+4, base+7) + ev(0, 0, "OPT", base+11, base+12)
	s1 := ev(1, 0, "F", base+3, base+4) + ev(1, 0, "B", base+9, base+10)
	// A line cut in the middle must wait for its end.
	files[0].WriteString(s0[:len(s0)-7])
	files[1].WriteString(s1)
	l.Poll()
	if _, _, ok := l.Bubble(); ok {
		t.Fatal("a step counted before every stage finished it")
	}
	files[0].WriteString(s0[len(s0)-7:])
	files[1].WriteString(ev(1, 0, "OPT", base+10, base+11))
	l.Poll()
	b, slowest, ok := l.Bubble()
	if !ok || math.Abs(b-0.6) > 1e-12 || slowest != 0 {
		t.Errorf("bubble %v slowest %d ok %v, want 0.6, stage 0", b, slowest, ok)
	}
}
