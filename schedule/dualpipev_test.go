package schedule

import (
	"math"
	"slices"
	"testing"
)

// TestDualPipeVBubble: on unit costs (F = I = W = 1 per stage, half that per
// chunk) dualpipev passes Check and idles (p-1)/2 units on every stage, for
// every size Build accepts, exactly as TheoreticalBubble states; below 2p
// micro-batches Build and TheoreticalBubble refuse it.
func TestDualPipeVBubble(t *testing.T) {
	for p := 1; p <= 8; p++ {
		for m := 1; m <= 32; m++ {
			bubble, ok := TheoreticalBubble("dualpipev", p, m, 2)
			s, err := Build("dualpipev", p, m, 2)
			if m < 2*p {
				if err == nil || ok {
					t.Errorf("p=%d m=%d: Build error %v, TheoreticalBubble ok %v; want both refused", p, m, err, ok)
				}
				continue
			}
			if err != nil || !ok {
				t.Fatalf("p=%d m=%d: Build error %v, TheoreticalBubble ok %v", p, m, err, ok)
			}
			if err := s.Check(); err != nil {
				t.Fatalf("p=%d m=%d: Check: %v", p, m, err)
			}
			tl, err := Simulate(s, UniformCosts(p, 1, 2, 0))
			if err != nil {
				t.Fatalf("p=%d m=%d: %v", p, m, err)
			}
			if want := float64(3*m) + float64(p-1)/2; tl.Makespan != want {
				t.Errorf("p=%d m=%d: makespan %v, want %v", p, m, tl.Makespan, want)
			}
			for st, b := range tl.Bubble {
				if math.Abs(b-bubble) > 1e-12 {
					t.Errorf("p=%d m=%d stage %d: bubble %v, TheoreticalBubble %v", p, m, st, b, bubble)
				}
			}
		}
	}
}

// TestDualPipeVPeak: every stage holds at most 2p+1 micro-batch chunks, and
// reaches it: DualPipe's "PP+1" activations per device, PP = 2p model stages
// and one model stage's activations of one micro-batch (one chunk) the unit;
// zb-v holds one chunk less.
func TestDualPipeVPeak(t *testing.T) {
	for p := 1; p <= 8; p++ {
		for m := 2 * p; m <= 32; m++ {
			got := mustBuild(t, "dualpipev", p, m, 2).PeakInFlight()
			if slices.Min(got) != 2*p+1 || slices.Max(got) != 2*p+1 {
				t.Errorf("p=%d m=%d: PeakInFlight %v, want %d (PP+1) on every stage", p, m, got, 2*p+1)
			}
			if zv := mustBuild(t, "zb-v", p, m, 2).PeakInFlight(); slices.Max(zv) != 2*p {
				t.Errorf("p=%d m=%d: zb-v PeakInFlight %v, want %d", p, m, zv, 2*p)
			}
		}
	}
}

// TestDualPipeVPairedBlocks relates dualPipeVBubble to DualPipe's
// (PP/2-1)(F&B + B - 3W): played with each overlapped pair as one block
// (it starts when both its inputs are in and its outputs leave at its end,
// F&B = F + B) the same order idles p-1 units per stage on unit costs, the
// formula's (p-1)(1/2 + 1 + 1 - 3/2); run as two actions it idles half that.
func TestDualPipeVPairedBlocks(t *testing.T) {
	for p := 1; p <= 8; p++ {
		for m := 2 * p; m <= 32; m++ {
			s := mustBuild(t, "dualpipev", p, m, 2)
			idle := playPaired(t, s) - float64(3*m)
			fc, bc, wc := 0.5, 1.0, 0.5 // a chunk's F, B and W
			if paper := float64(p-1) * ((fc + bc) + bc - 3*wc); idle != paper {
				t.Errorf("p=%d m=%d: paired idle %v, want %v", p, m, idle, paper)
			}
		}
	}
}

// playPaired returns the makespan of s on unit costs with free transfers,
// each forward that DualPipeV overlaps with the next action (a backward of
// the other chunk; not the last stage's first such pair) run with it as one
// block.
func playPaired(t *testing.T, s *Schedule) float64 {
	t.Helper()
	x, err := s.validate()
	if err != nil {
		t.Fatal(err)
	}
	p := s.Stages
	blocks := make([][][]Action, p)
	for st, list := range s.Actions {
		unpaired := st == p-1 // DualPipeV does not overlap the last stage's first pair
		for j := 0; j < len(list); j++ {
			a := list[j]
			if a.Kind == Forward && j+1 < len(list) && list[j+1].Kind == Backward && list[j+1].Chunk != a.Chunk {
				if !unpaired {
					blocks[st] = append(blocks[st], list[j:j+2])
					j++
					continue
				}
				unpaired = false
			}
			blocks[st] = append(blocks[st], list[j:j+1])
		}
	}
	cost := map[Kind]float64{Forward: 0.5, Backward: 1, Input: 0.5, Weight: 0.5}
	end := make([]float64, len(x.pos))
	for i := range end {
		end[i] = -1
	}
	next, free := make([]int, p), make([]float64, p)
	for moved := true; moved; {
		moved = false
		for st := range p {
		blocks:
			for ; next[st] < len(blocks[st]); next[st]++ {
				b := blocks[st][next[st]]
				start, d := free[st], 0.0
				for _, a := range b {
					for _, dep := range x.deps(a) {
						if slices.Contains(b, dep) {
							continue
						}
						e := end[x.slot(dep)]
						if e < 0 {
							break blocks
						}
						start = max(start, e)
					}
					d += cost[a.Kind]
				}
				free[st] = start + d
				for _, a := range b {
					end[x.slot(a)] = free[st]
				}
				moved = true
			}
		}
	}
	for st := range p {
		if next[st] < len(blocks[st]) {
			t.Fatalf("p=%d m=%d: paired play stalls on stage %d at %v", p, s.MicroBatches, st, blocks[st][next[st]])
		}
	}
	return slices.Max(free)
}

// goldenDualPipeVGrid is DualPipe's README example, 4 stages (8 model
// stages) and 10 micro-batches, as its figure draws it.
const goldenDualPipeVGrid = `placement: v
stage 0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F0c1 0I0c1 0W0c1 0F1c1 0I1c1 0W1c1 0F2c1 0I2c1 0W2c1 0F3c1 0F7 0B3c1 0F4c1 0B0 0F8 0B4c1 0F5c1 0B1 0F9 0B5c1 0F6c1 0B2 0B6c1 0F7c1 0B3 0B7c1 0F8c1 0B4 0B8c1 0F9c1 0B5 0B9c1 0I6 0W6 0I7 0W7 0I8 0W8 0I9 0W9
stage 1: 1F0 1F1 1F2 1F3 1F4 1F0c1 1F5 1F1c1 1I0c1 1W0c1 1F2c1 1I1c1 1W1c1 1F3c1 1F6 1B2c1 1F4c1 1B0 1F7 1B3c1 1F5c1 1B1 1F8 1B4c1 1F6c1 1B2 1F9 1B5c1 1F7c1 1B3 1B6c1 1F8c1 1B4 1B7c1 1F9c1 1B5 1B8c1 1B6 1I9c1 1I7 1W9c1 1I8 1W7 1I9 1W8 1W9
stage 2: 2F0 2F1 2F2 2F0c1 2F3 2F1c1 2F4 2F2c1 2I0c1 2W0c1 2F3c1 2F5 2B1c1 2F4c1 2B0 2F6 2B2c1 2F5c1 2B1 2F7 2B3c1 2F6c1 2B2 2F8 2B4c1 2F7c1 2B3 2F9 2B5c1 2F8c1 2B4 2B6c1 2F9c1 2B5 2B7c1 2B6 2B8c1 2I7 2I9c1 2I8 2W7 2I9 2W9c1 2W8 2W9
stage 3: 3F0 3F0c1 3F1 3F1c1 3F2 3F2c1 3F3 3F3c1 3F4 3B0c1 3F4c1 3B0 3F5 3B1c1 3F5c1 3B1 3F6 3B2c1 3F6c1 3B2 3F7 3B3c1 3F7c1 3B3 3F8 3B4c1 3F8c1 3B4 3F9 3B5c1 3F9c1 3B5 3B6c1 3B6 3B7c1 3B7 3I8c1 3I8 3I9c1 3I9 3W8c1 3W8 3W9c1 3W9
`

// On unit costs stage s idles s/2 before its first forward and half a unit
// before chunk 0's backward in each of step 5's 3-s pairs (chunk 1's passes
// in lower case).
const goldenDualPipeVText = `makespan 31.5, slot 0.5
         0         5         10        15        20        25        30
stage 0: FFFFFFFfiwfiwfiwfFbbfBBFbbfBBFbbfBBbbf.BBbbf.BBbbf.BBbbIWIWIWIW  bubble 4.8%
stage 1: .FFFFFfFfiwfiwfFbbfBBFbbfBBFbbfBBFbbfBBbbf.BBbbf.BBbbBBiIwIWIWW  bubble 4.8%
stage 2: ..FFFfFfFfiwfFbbfBBFbbfBBFbbfBBFbbfBBFbbfBBbbf.BBbbBBbbIiIWIwWW  bubble 4.8%
stage 3: ...FfFfFfFfFbbfBBFbbfBBFbbfBBFbbfBBFbbfBBFbbfBBbbBBbbBBiIiIwWwW  bubble 4.8%
`

func TestGoldenDualPipeV(t *testing.T) {
	s := mustBuild(t, "dualpipev", 4, 10, 2)
	if got := s.Grid(); got != goldenDualPipeVGrid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, goldenDualPipeVGrid)
	}
	tl, err := Simulate(s, UniformCosts(4, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(0.5); got != goldenDualPipeVText {
		t.Errorf("Text:\n%s\nwant:\n%s", got, goldenDualPipeVText)
	}
	// Both chunks mix whole and split backwards, so both engines are split.
	for st, list := range s.Actions {
		if !SplitsChunk(list, 0) || !SplitsChunk(list, 1) {
			t.Errorf("stage %d: SplitsChunk %v %v, want both", st, SplitsChunk(list, 0), SplitsChunk(list, 1))
		}
	}
}
