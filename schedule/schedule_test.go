package schedule

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func mustBuild(t *testing.T, name string, p, m, v int) *Schedule {
	t.Helper()
	s, err := Build(name, p, m, v)
	if err != nil {
		t.Fatalf("Build(%q, %d, %d, %d): %v", name, p, m, v, err)
	}
	return s
}

func mustParse(t *testing.T, text string) *Schedule {
	t.Helper()
	s, err := ParseGrid(text)
	if err != nil {
		t.Fatalf("ParseGrid: %v\n%s", err, text)
	}
	return s
}

// allowed restates Build's size rules, independently of build.go.
func allowed(name string, p, m, v int) bool {
	switch name {
	case "gpipe", "1f1b", "zb-h1":
		return p >= 1 && m >= 1 && v == 1
	case "interleaved", "interleaved-zb":
		return p >= 2 && m >= 1 && v >= 2 && m%p == 0
	case "zb-v":
		return p >= 1 && 2*m >= 3*p-1 && v == 2
	case "dualpipev":
		return p >= 1 && m >= 2*p && v == 2
	}
	return false
}

// wantPeak is the stated PeakInFlight of stage st.
func wantPeak(t *testing.T, name string, st, p, m, v int) int {
	switch name {
	case "gpipe":
		return m
	case "1f1b":
		return min(p-st, m)
	case "interleaved":
		return min(2*(p-st-1)+(v-1)*p+1, m*v)
	case "zb-h1":
		return min(p, m)
	case "zb-v":
		// Chunk 0 runs ahead of chunk 1 by 2p-1-st micro-batches.
		return min(m, 2*p-1-st) + min(m, st+1)
	case "dualpipev":
		// DualPipe's "PP+1" chunks, PP = 2p model stages.
		return 2*p + 1
	case "interleaved-zb":
		// Interleaved 1F1B's first stage's peak, on every stage.
		return min((v+1)*p-1, m*v)
	}
	t.Fatalf("no expected PeakInFlight for %q", name)
	return 0
}

// wantMakespan is the makespan with uniform F = 1, B = 2 (I = W = 1).
func wantMakespan(t *testing.T, name string, p, m, v int) float64 {
	switch name {
	case "gpipe", "1f1b":
		return float64(m+p-1) * 3
	case "interleaved":
		return float64(3*m) + 3*float64(p-1)/float64(v)
	case "zb-h1":
		if m < p {
			return float64(2*m + 2*p - 1)
		}
		return float64(3*m + p - 1)
	case "zb-v", "dualpipev":
		return float64(3*m) + float64(p-1)/2
	case "interleaved-zb":
		return float64(3*m) + float64(p-1)/float64(v)
	}
	t.Fatalf("no expected makespan for %q", name)
	return 0
}

// TestBuiltins checks every built-in schedule over a grid of sizes against
// the stated properties: built exactly when the rules allow, valid, each
// action once, the stated activation peak, and a simulated bubble and
// makespan equal to the closed forms.
func TestBuiltins(t *testing.T) {
	for _, name := range Names() {
		for p := 1; p <= 8; p++ {
			for m := 1; m <= 32; m++ {
				for v := 1; v <= 4; v++ {
					t.Run(fmt.Sprintf("%s/p%d/m%d/v%d", name, p, m, v), func(t *testing.T) {
						testBuiltin(t, name, p, m, v)
					})
				}
			}
		}
	}
}

func testBuiltin(t *testing.T, name string, p, m, v int) {
	s, err := Build(name, p, m, v)
	_, theoryOK := TheoreticalBubble(name, p, m, v)
	if ok := allowed(name, p, m, v); (err == nil) != ok || theoryOK != ok {
		t.Fatalf("Build error %v, TheoreticalBubble ok %v; want allowed %v", err, theoryOK, ok)
	}
	if err != nil {
		if s != nil {
			t.Fatalf("Build returned a schedule with error %v", err)
		}
		return
	}
	if s.Name != name || s.Stages != p || s.MicroBatches != m || s.Chunks != v || len(s.Actions) != p {
		t.Fatalf("header = %q %d %d %d with %d lists", s.Name, s.Stages, s.MicroBatches, s.Chunks, len(s.Actions))
	}
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}

	// Each action exactly once, on its own list, counted independently of
	// Check: F and B per (chunk, micro-batch), or F, I and W for zb-h1, zb-v
	// and interleaved-zb; dualpipev has F and either B or I and W.
	split := name == "zb-h1" || name == "zb-v" || name == "interleaved-zb"
	kinds := []Kind{Forward, Backward}
	if split {
		kinds = []Kind{Forward, Input, Weight}
	}
	seen := map[Action]int{}
	for st, list := range s.Actions {
		if want := len(kinds) * m * v; len(list) != want && name != "dualpipev" {
			t.Errorf("stage %d has %d actions, want %d", st, len(list), want)
		}
		for _, a := range list {
			if a.Stage != st {
				t.Errorf("stage %d list holds %v", st, a)
			}
			seen[a]++
		}
	}
	for st := range p {
		for _, k := range kinds {
			for c := range v {
				for i := range m {
					a := Action{Stage: st, Kind: k, MicroBatch: i, Chunk: c}
					if name == "dualpipev" && k == Backward && seen[a] == 0 {
						a.Kind = Input // and its W: a split backward
						if w := (Action{Stage: st, Kind: Weight, MicroBatch: i, Chunk: c}); seen[w] != 1 {
							t.Errorf("%v appears %d times", w, seen[w])
						}
					}
					if seen[a] != 1 {
						t.Errorf("%v appears %d times", a, seen[a])
					}
				}
			}
		}
	}

	want := make([]int, p)
	for st := range want {
		want[st] = wantPeak(t, name, st, p, m, v)
	}
	got := s.PeakInFlight()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PeakInFlight = %v, want %v", got, want)
	}
	if name == "zb-h1" {
		// The pipeline's peak is 1F1B's, reached on 1F1B's first stage.
		if slices.Max(got) != slices.Max(mustBuild(t, "1f1b", p, m, 1).PeakInFlight()) {
			t.Errorf("PeakInFlight = %v, above 1f1b's peak", got)
		}
	}
	if name == "interleaved-zb" {
		// No stage holds more than interleaved's first stage.
		if peak := slices.Max(mustBuild(t, "interleaved", p, m, v).PeakInFlight()); slices.Max(got) != peak {
			t.Errorf("PeakInFlight = %v, want at most interleaved's peak of %d, reached", got, peak)
		}
	}
	if name == "zb-v" || name == "dualpipev" {
		// A chunk holds half a stage's layers: no stage stashes more than
		// 1F1B's first stage, two chunks for each of its micro-batches (and
		// one chunk more for dualpipev, DualPipe's PP+1).
		peak1F1B := slices.Max(mustBuild(t, "1f1b", p, m, 1).PeakInFlight())
		limit := 2 * peak1F1B
		if name == "dualpipev" {
			limit++
		}
		if slices.Max(got) > limit {
			t.Errorf("PeakInFlight = %v chunks, above %d, twice 1f1b's peak of %d (plus one for dualpipev)", got, limit, peak1F1B)
		}
		if s.Placement != V {
			t.Errorf("placement %v, want v", s.Placement)
		}
	} else if s.Placement != Loop {
		t.Errorf("placement %v, want loop", s.Placement)
	}

	bubble, ok := TheoreticalBubble(name, p, m, v)
	if !ok {
		t.Fatalf("TheoreticalBubble not ok")
	}
	costs := [][2]float64{{1, 2}}
	if !split && name != "dualpipev" { // the others hold for any uniform f and b
		costs = append(costs, [2]float64{1, 1}, [2]float64{2, 1})
	}
	for _, fb := range costs {
		f, b := fb[0], fb[1]
		tl, err := Simulate(s, UniformCosts(p, f, b, 0))
		if err != nil {
			t.Fatalf("Simulate f=%v b=%v: %v", f, b, err)
		}
		if want := wantMakespan(t, name, p, m, v) * (f + b) / 3; math.Abs(tl.Makespan-want) > 1e-9 {
			t.Errorf("f=%v b=%v: makespan %v, want %v", f, b, tl.Makespan, want)
		}
		for st := range p {
			if math.Abs(tl.Bubble[st]-bubble) > 1e-12 {
				t.Errorf("f=%v b=%v: stage %d bubble %v, want %v", f, b, st, tl.Bubble[st], bubble)
			}
			if want := float64(m) * (f + b); math.Abs(tl.Busy[st]-want) > 1e-9 {
				t.Errorf("f=%v b=%v: stage %d busy %v, want %v", f, b, st, tl.Busy[st], want)
			}
		}
		if !reflect.DeepEqual(tl.PeakInFlight, want) {
			t.Errorf("timeline PeakInFlight = %v, want %v", tl.PeakInFlight, want)
		}
	}
}

// TestShapes pins the exact order of each built-in, as documented on Build.
func TestShapes(t *testing.T) {
	for p := 1; p <= 6; p++ {
		for m := 1; m <= 10; m++ {
			g := mustBuild(t, "gpipe", p, m, 1)
			o := mustBuild(t, "1f1b", p, m, 1)
			for st := range p {
				var wantG []Action
				for i := range m {
					wantG = append(wantG, Action{Stage: st, Kind: Forward, MicroBatch: i})
				}
				for i := range m {
					wantG = append(wantG, Action{Stage: st, Kind: Backward, MicroBatch: i})
				}
				if !reflect.DeepEqual(g.Actions[st], wantG) {
					t.Errorf("gpipe p=%d m=%d stage %d = %v", p, m, st, g.Actions[st])
				}

				list := o.Actions[st]
				w := min(p-st-1, m)
				j := 0
				expect := func(k Kind, i int) {
					t.Helper()
					if want := (Action{Stage: st, Kind: k, MicroBatch: i}); j >= len(list) || list[j] != want {
						t.Fatalf("1f1b p=%d m=%d stage %d position %d: got %v, want %v", p, m, st, j, list, want)
					}
					j++
				}
				for i := range w {
					expect(Forward, i)
				}
				for i := range m - w {
					expect(Forward, w+i)
					expect(Backward, i)
				}
				for i := m - w; i < m; i++ {
					expect(Backward, i)
				}
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name    string
		p, m, v int
		want    string
	}{
		{"zb", 2, 2, 1, `unknown schedule "zb" (known: gpipe, 1f1b, interleaved, zb-h1, zb-v, interleaved-zb, dualpipev)`},
		{"", 2, 2, 1, `unknown schedule "" (known: gpipe, 1f1b, interleaved, zb-h1, zb-v, interleaved-zb, dualpipev)`},
		{"gpipe", 0, 2, 1, "stages must be >= 1, got 0"},
		{"1f1b", -3, 2, 1, "stages must be >= 1, got -3"},
		{"1f1b", 2, 0, 1, "micro-batches must be >= 1, got 0"},
		{"1f1b", 2, 2, 0, "chunks must be >= 1, got 0"},
		{"gpipe", 2, 2, 2, "gpipe needs chunks == 1, got 2"},
		{"1f1b", 4, 8, 3, "1f1b needs chunks == 1, got 3"},
		{"zb-h1", 4, 8, 2, "zb-h1 needs chunks == 1, got 2"},
		{"interleaved", 4, 8, 1, "interleaved needs chunks >= 2, got 1"},
		{"interleaved", 1, 8, 2, "interleaved needs stages >= 2, got 1"},
		{"interleaved", 3, 8, 2, "interleaved needs micro_batches to be a multiple of stages (8 micro-batches, 3 stages)"},
		{"interleaved", 4, 2, 2, "interleaved needs micro_batches to be a multiple of stages (2 micro-batches, 4 stages)"},
		{"interleaved", 4, 0, 2, "micro-batches must be >= 1, got 0"},
		{"zb-v", 4, 8, 1, "zb-v needs chunks == 2 (one model stage on the way down the V and one on the way up), got 1"},
		{"zb-v", 4, 8, 3, "zb-v needs chunks == 2 (one model stage on the way down the V and one on the way up), got 3"},
		{"zb-v", 4, 5, 2, "zb-v needs micro_batches >= 6 for 4 stages (3*stages/2, rounded down: with fewer it cannot hide the first micro-batch's trip down and up the V), got 5"},
		{"zb-v", 3, 3, 2, "zb-v needs micro_batches >= 4 for 3 stages (3*stages/2, rounded down: with fewer it cannot hide the first micro-batch's trip down and up the V), got 3"},
		{"interleaved-zb", 4, 8, 1, "interleaved-zb needs chunks >= 2, got 1"},
		{"interleaved-zb", 1, 8, 2, "interleaved-zb needs stages >= 2, got 1"},
		{"interleaved-zb", 3, 8, 2, "interleaved-zb needs micro_batches to be a multiple of stages (8 micro-batches, 3 stages)"},
		{"dualpipev", 4, 8, 1, "dualpipev needs chunks == 2 (one model stage on the way down the V and one on the way up), got 1"},
		{"dualpipev", 4, 7, 2, "dualpipev needs micro_batches >= 8 for 4 stages (2*stages, DualPipeV's rule: every stage's steady state must run at least once), got 7"},
		{"dualpipev", 1, 1, 2, "dualpipev needs micro_batches >= 2 for 1 stages (2*stages, DualPipeV's rule: every stage's steady state must run at least once), got 1"},
	}
	for _, tt := range tests {
		s, err := Build(tt.name, tt.p, tt.m, tt.v)
		if err == nil || err.Error() != tt.want || s != nil {
			t.Errorf("Build(%q, %d, %d, %d) = %v, %v; want error %q", tt.name, tt.p, tt.m, tt.v, s, err, tt.want)
		}
		if f, ok := TheoreticalBubble(tt.name, tt.p, tt.m, tt.v); ok || f != 0 {
			t.Errorf("TheoreticalBubble(%q, %d, %d, %d) = %v, %v; want 0, false", tt.name, tt.p, tt.m, tt.v, f, ok)
		}
	}
}

func TestTheoreticalBubble(t *testing.T) {
	tests := []struct {
		name    string
		p, m, v int
		want    float64
		wantOK  bool
	}{
		{"gpipe", 4, 8, 1, 3.0 / 11, true},
		{"1f1b", 4, 8, 1, 3.0 / 11, true},
		{"1f1b", 1, 5, 1, 0, true},
		{"interleaved", 4, 8, 2, 3.0 / 19, true}, // 3/(2*8+3)
		{"interleaved", 4, 8, 4, 3.0 / 35, true},
		{"interleaved", 2, 2, 3, 1.0 / 7, true},
		{"zb-h1", 4, 8, 1, 3.0 / 27, true}, // 3/(3*8+3): a third of 1f1b's idle time
		{"zb-h1", 4, 4, 1, 3.0 / 15, true},
		{"zb-h1", 4, 2, 1, 5.0 / 11, true}, // m < p: (2p-1-m)/(2m+2p-1)
		{"zb-h1", 1, 3, 1, 0, true},
		{"zb-v", 4, 8, 2, 3.0 / 51, true}, // 3/(6*8+3): the start-up skew of 3 half-forwards
		{"zb-v", 4, 6, 2, 3.0 / 39, true},
		{"zb-v", 2, 3, 2, 1.0 / 19, true},
		{"zb-v", 1, 1, 2, 0, true},
		{"zb-v", 4, 5, 2, 0, false},
		{"zb-v", 4, 8, 1, 0, false},
		{"interleaved-zb", 4, 8, 2, 3.0 / 51, true}, // 3/(3*2*8+3): a third of interleaved's idle time
		{"interleaved-zb", 4, 8, 4, 3.0 / 99, true},
		{"interleaved-zb", 2, 4, 2, 1.0 / 25, true},
		{"interleaved-zb", 4, 6, 2, 0, false},
		{"interleaved-zb", 4, 8, 1, 0, false},
		{"dualpipev", 4, 8, 2, 3.0 / 51, true}, // zb-v's: the start-up skew of 3 half-forwards
		{"dualpipev", 4, 10, 2, 3.0 / 63, true},
		{"dualpipev", 1, 2, 2, 0, true},
		{"dualpipev", 4, 7, 2, 0, false},
		{"nope", 4, 8, 1, 0, false},
		{"gpipe", 0, 8, 1, 0, false},
		{"gpipe", 4, 0, 1, 0, false},
		{"gpipe", 4, 8, 2, 0, false},
		{"interleaved", 4, 6, 2, 0, false},
	}
	for _, tt := range tests {
		got, ok := TheoreticalBubble(tt.name, tt.p, tt.m, tt.v)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("TheoreticalBubble(%q, %d, %d, %d) = %v, %v; want %v, %v", tt.name, tt.p, tt.m, tt.v, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestNames(t *testing.T) {
	got := Names()
	if want := []string{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "interleaved-zb", "dualpipev"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	got[0] = "mutated"
	if Names()[0] != "gpipe" {
		t.Fatal("Names returns shared storage")
	}
}

// TestCheckRejects feeds broken schedules to Check and Simulate, which must
// both report the first offending action in the same words.
func TestCheckRejects(t *testing.T) {
	gpipe := func(mutate func(s *Schedule)) func(t *testing.T) *Schedule {
		return func(t *testing.T) *Schedule {
			s := mustBuild(t, "gpipe", 2, 2, 1)
			mutate(s)
			return s
		}
	}
	interleaved := func(mutate func(s *Schedule)) func(t *testing.T) *Schedule {
		return func(t *testing.T) *Schedule {
			s := mustBuild(t, "interleaved", 2, 2, 2)
			mutate(s)
			return s
		}
	}
	grid := func(text string) func(t *testing.T) *Schedule {
		return func(t *testing.T) *Schedule { return mustParse(t, text) }
	}
	tests := []struct {
		name  string
		sched func(t *testing.T) *Schedule
		want  string
	}{
		{"duplicate", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1F1 1B0 1B1 1B1`),
			"stage 1: action 1B1 appears twice (positions 3 and 4)"},
		{"duplicate reported at its first repeat", grid(`
stage 0: 0F0 0F1 0B0 0F0 0B1 0B0
stage 1: 1F0 1F1 1B0 1B1`),
			"stage 0: action 0F0 appears twice (positions 0 and 3)"},
		{"missing", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1B0 1B1`),
			"stage 1: missing action 1F1"},
		{"missing backward", grid(`
stage 0: 0F0 0F1 0B0
stage 1: 1F0 1F1 1B0 1B1`),
			"stage 0: missing action 0B1"},
		{"wrong list", grid(`
stage 0: 0F0 0B0 0B1
stage 1: 1F0 0F1 1F1 1B0 1B1`),
			"stage 1: action 0F1 at position 1: belongs on stage 0's list"},
		{"backward before forward", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1B1 1F1 1B0`),
			"stage 1: action 1B1 at position 1 comes before 1F1 at position 2"},
		{"deadlock", grid(`
stage 0: 0F0 0B0 0F1 0B1
stage 1: 1F1 1F0 1B0 1B1`),
			"deadlock: stage 0 waits at 0B0 for 1B0; stage 1 waits at 1F1 for 0F1"},
		{"deadlock blocks downstream", grid(`
stage 0: 0F0 0B0 0F1 0B1
stage 1: 1F1 1F0 1B0 1B1
stage 2: 2F0 2B0 2F1 2B1`),
			"deadlock: stage 0 waits at 0B0 for 1B0; stage 1 waits at 1F1 for 0F1; stage 2 waits at 2F0 for 1F0"},
		{"deadlock after progress", grid(`
stage 0: 0F0 0F1 0B1 0B0
stage 1: 1F0 1B0 1F1 1B1
stage 2: 2F0 2F1 2B1 2B0`),
			"deadlock: stage 0 waits at 0B1 for 1B1; stage 1 waits at 1B0 for 2B0; stage 2 waits at 2F1 for 1F1"},
		{"micro-batch out of range", gpipe(func(s *Schedule) { s.Actions[0][1].MicroBatch = 5 }),
			"stage 0: action 0F5 at position 1: micro-batch 5 out of range [0, 2)"},
		{"negative micro-batch", gpipe(func(s *Schedule) { s.Actions[1][3].MicroBatch = -1 }),
			"stage 1: action 1B-1 at position 3: micro-batch -1 out of range [0, 2)"},
		{"stage out of range", gpipe(func(s *Schedule) { s.Actions[1][0].Stage = 7 }),
			"stage 1: action 7F0 at position 0: stage 7 out of range [0, 2)"},
		{"bad kind", gpipe(func(s *Schedule) { s.Actions[0][2].Kind = 9 }),
			"stage 0: action 0Kind(9)0 at position 2: unknown kind 9"},
		{"chunk", gpipe(func(s *Schedule) { s.Actions[0][0].Chunk = 1 }),
			"stage 0: action 0F0c1 at position 0: chunk 1 out of range [0, 1)"},
		{"chunk out of range", interleaved(func(s *Schedule) { s.Actions[1][1].Chunk = 2 }),
			"stage 1: action 1F1c2 at position 1: chunk 2 out of range [0, 2)"},
		{"negative chunk", interleaved(func(s *Schedule) { s.Actions[1][4].Chunk = -1 }),
			"stage 1: action 1F1c-1 at position 4: chunk -1 out of range [0, 2)"},
		{"missing chunk", interleaved(func(s *Schedule) { s.Actions[1] = slices.Delete(s.Actions[1], 4, 5) }),
			"stage 1: missing action 1F1c1"},
		{"I without W", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1I0 1F1 1I1 1W1`),
			"stage 1: missing action 1W0"},
		{"W without I", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1B0 1F1 1W1`),
			"stage 1: missing action 1I1"},
		{"no backward on a split stage", grid(`
stage 0: 0F0 0F1 0I0 0W0
stage 1: 1F0 1B0 1F1 1B1`),
			"stage 0: missing action 0I1"},
		{"W before I", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1W0 1I0 1F1 1I1 1W1`),
			"stage 1: action 1W0 at position 1 comes before 1I0 at position 2"},
		{"I before F", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1I0 1F0 1W0 1F1 1I1 1W1`),
			"stage 1: action 1I0 at position 0 comes before 1F0 at position 1"},
		{"B together with I", grid(`
stage 0: 0F0 0F1 0B0 0I1 0B1 0W1
stage 1: 1F0 1F1 1B0 1B1`),
			"stage 0: action 0B1 at position 4: conflicts with 0I1 at position 3 (a backward is either B, or I and W)"},
		{"W together with B", grid(`
stage 0: 0F0 0F1 0B0 0B1
stage 1: 1F0 1B0 1F1 1B1 1W1`),
			"stage 1: action 1W1 at position 4: conflicts with 1B1 at position 3 (a backward is either B, or I and W)"},
		{"duplicate W", grid(`
stage 0: 0F0 0I0 0W0 0W0
stage 1: 1F0 1B0`),
			"stage 0: action 0W0 appears twice (positions 2 and 3)"},
		{"split deadlock", grid(`
stage 0: 0F0 0I0 0W0 0F1 0I1 0W1
stage 1: 1F0 1F1 1I0 1W0 1I1 1W1`),
			"deadlock: stage 0 waits at 0I0 for 1I0; stage 1 waits at 1F1 for 0F1"},
		{"split waits for a full backward", grid(`
stage 0: 0F0 0I0 0W0 0F1 0I1 0W1
stage 1: 1F0 1F1 1B0 1B1`),
			"deadlock: stage 0 waits at 0I0 for 1B0; stage 1 waits at 1F1 for 0F1"},
		{"interleaved deadlock", grid(`
stage 0: 0F0c1 0F0 0B0c1 0B0
stage 1: 1F0 1F0c1 1B0c1 1B0`),
			"deadlock: stage 0 waits at 0F0c1 for 1F0; stage 1 waits at 1F0 for 0F0"},
		{"interleaved deadlock on the ring", interleaved(func(s *Schedule) {
			// stage 0 runs chunk 0's backward of micro-batch 0 before chunk
			// 1's, which it needs first.
			l := s.Actions[0]
			i, j := slices.Index(l, Action{Stage: 0, Kind: Backward}), slices.Index(l, Action{Stage: 0, Kind: Backward, Chunk: 1})
			l[i], l[j] = l[j], l[i]
		}),
			"deadlock: stage 0 waits at 0B0 for 1B0; stage 1 waits at 1B0 for 0B0c1"},
		{"no chunks", gpipe(func(s *Schedule) { s.Chunks = 0 }),
			"chunks must be >= 1, got 0"},
		{"too few lists", gpipe(func(s *Schedule) { s.Actions = s.Actions[:1] }),
			"schedule has 1 stage lists, want 2"},
		{"no stages", gpipe(func(s *Schedule) { s.Stages = 0 }),
			"stages must be >= 1, got 0"},
		{"no micro-batches", gpipe(func(s *Schedule) { s.MicroBatches = 0 }),
			"micro-batches must be >= 1, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.sched(t)
			if err := s.Check(); err == nil || err.Error() != tt.want {
				t.Errorf("Check() = %v\nwant      %s", err, tt.want)
			}
			tl, err := Simulate(s, UniformCosts(s.Stages, 1, 2, 0.5))
			if err == nil || err.Error() != tt.want || tl != nil {
				t.Errorf("Simulate() = %v\nwant        %s", err, tt.want)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Forward: "F", Backward: "B", Input: "I", Weight: "W", Recompute: "RF", 5: "Kind(5)", 7: "Kind(7)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

func TestActionString(t *testing.T) {
	tests := []struct {
		a    Action
		want string
	}{
		{Action{Stage: 2, Kind: Forward, MicroBatch: 0}, "2F0"},
		{Action{Stage: 3, Kind: Backward, MicroBatch: 12}, "3B12"},
		{Action{Stage: 10, Kind: Forward, MicroBatch: 7, Chunk: 2}, "10F7c2"},
		{Action{Stage: 0, Kind: Input, MicroBatch: 3}, "0I3"},
		{Action{Stage: 1, Kind: Weight, MicroBatch: 2, Chunk: 1}, "1W2c1"},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.a, got, tt.want)
		}
	}
}

func TestParseActionRoundTrip(t *testing.T) {
	n := 0
	for st := 0; st <= 20; st++ {
		for _, k := range []Kind{Forward, Backward, Input, Weight} {
			for i := 0; i <= 130; i += 1 + i/8 {
				for c := 0; c <= 2; c++ {
					a := Action{Stage: st, Kind: k, MicroBatch: i, Chunk: c}
					got, err := ParseAction(a.String())
					if err != nil || got != a {
						t.Fatalf("ParseAction(%q) = %v, %v; want %v", a.String(), got, err, a)
					}
					n++
				}
			}
		}
	}
	if n < 2000 {
		t.Fatalf("only %d round trips", n)
	}
}

func TestParseActionErrors(t *testing.T) {
	tests := []struct{ in, why string }{
		{"", "missing or invalid stage number"},
		{"F0", "missing or invalid stage number"},
		{"-1F0", "missing or invalid stage number"},
		{" 2F0", "missing or invalid stage number"},
		{"99999999999999999999F0", "missing or invalid stage number"},
		{"2", "missing kind"},
		{"2X0", `unknown kind 'X'`},
		{"2f0", `unknown kind 'f'`},
		{"2i0", `unknown kind 'i'`},
		{"2w0", `unknown kind 'w'`},
		{"2FF0", "missing or invalid micro-batch number"},
		{"2F", "missing or invalid micro-batch number"},
		{"2F-1", "missing or invalid micro-batch number"},
		{"2F0c", "missing or invalid chunk number"},
		{"2F0 ", `unexpected " " after the action`},
		{"2F0x", `unexpected "x" after the action`},
		{"2F0c1c2", `unexpected "c2" after the action`},
	}
	for _, tt := range tests {
		a, err := ParseAction(tt.in)
		if err == nil {
			t.Errorf("ParseAction(%q) = %v, want error", tt.in, a)
			continue
		}
		want := fmt.Sprintf("parse action %q: %s (want <stage><F|B|I|W|RF><micro-batch>[c<chunk>], e.g. \"2F0\")", tt.in, tt.why)
		if err.Error() != want {
			t.Errorf("ParseAction(%q) error\n got %s\nwant %s", tt.in, err, want)
		}
	}
}

func TestRecvFromSendTo(t *testing.T) {
	tests := []struct {
		a              string
		stages, chunks int
		recv, send     int
		model          int
	}{
		{"0F0", 1, 1, -1, -1, 0},
		{"0B0", 1, 1, -1, -1, 0},
		{"0I0", 1, 1, -1, -1, 0},
		{"0W0", 1, 1, -1, -1, 0},
		{"0F3", 3, 1, -1, 1, 0},
		{"1F3", 3, 1, 0, 2, 1},
		{"2F3", 3, 1, 1, -1, 2},
		{"0B3", 3, 1, 1, -1, 0},
		{"1B3", 3, 1, 2, 0, 1},
		{"2B3", 3, 1, -1, 1, 2},
		{"0I3", 3, 1, 1, -1, 0},
		{"1I3", 3, 1, 2, 0, 1},
		{"2I3", 3, 1, -1, 1, 2},
		{"1W3", 3, 1, -1, -1, 1},
		{"2W3", 3, 1, -1, -1, 2},
		// Two chunks on three stages: model stages 0..5, stage s holds s and s+3.
		{"0F1", 3, 2, -1, 1, 0},
		{"2F1", 3, 2, 1, 0, 2}, // the ring: the last stage feeds stage 0's chunk 1
		{"0F1c1", 3, 2, 2, 1, 3},
		{"2F1c1", 3, 2, 1, -1, 5},
		{"2B1c1", 3, 2, -1, 1, 5},
		{"0B1c1", 3, 2, 1, 2, 3}, // and the gradient goes back the same way
		{"2B1", 3, 2, 0, 1, 2},
		{"0B1", 3, 2, 1, -1, 0},
		{"0I1c1", 3, 2, 1, 2, 3},
		{"2I1c1", 3, 2, -1, 1, 5},
		{"1W1c1", 3, 2, -1, -1, 4},
		{"1F0c2", 2, 3, 0, -1, 5},
		{"1F0c2", 2, 4, 0, 0, 5},
		{"1F0c3", 2, 4, 0, -1, 7},
		// One stage with several chunks passes between its own chunks.
		{"0F0", 1, 2, -1, 0, 0},
		{"0F0c1", 1, 2, 0, -1, 1},
		{"0B0c1", 1, 2, -1, 0, 1},
		{"0B0", 1, 2, 0, -1, 0},
	}
	for _, tt := range tests {
		a, err := ParseAction(tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.RecvFrom(tt.stages, tt.chunks); got != tt.recv {
			t.Errorf("%s.RecvFrom(%d, %d) = %d, want %d", tt.a, tt.stages, tt.chunks, got, tt.recv)
		}
		if got := a.SendTo(tt.stages, tt.chunks); got != tt.send {
			t.Errorf("%s.SendTo(%d, %d) = %d, want %d", tt.a, tt.stages, tt.chunks, got, tt.send)
		}
		if got := a.ModelStage(tt.stages); got != tt.model {
			t.Errorf("%s.ModelStage(%d) = %d, want %d", tt.a, tt.stages, got, tt.model)
		}
	}
}

func TestGridRoundTrip(t *testing.T) {
	for _, s := range roundTripSchedules(t) {
		g := s.Grid()
		back := mustParse(t, g)
		if !sameSchedule(back, s) {
			t.Errorf("%s p=%d m=%d v=%d: round trip differs:\n%s\nvs\n%s", s.Name, s.Stages, s.MicroBatches, s.Chunks, g, back.Grid())
		}
		if back.Grid() != g {
			t.Errorf("%s p=%d m=%d v=%d: Grid not stable", s.Name, s.Stages, s.MicroBatches, s.Chunks)
		}
	}
}

func TestParseGridLenient(t *testing.T) {
	s := mustParse(t, "# my schedule\n\n  stage 0 :  0F0   0B0 \nstage 1:\n")
	want := &Schedule{Stages: 2, MicroBatches: 1, Chunks: 1, Actions: [][]Action{
		{{Stage: 0, Kind: Forward}, {Stage: 0, Kind: Backward}},
		{},
	}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	if err := s.Check(); err == nil || err.Error() != "stage 1: missing action 1F0" {
		t.Fatalf("Check() = %v", err)
	}
}

func TestParseGridErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "no stage lines found"},
		{"# nothing\n", "no stage lines found"},
		{"stage 0 0F0", `line 1: want "stage N: actions...", got "stage 0 0F0"`},
		{"stag 0: 0F0", `line 1: want "stage N: actions...", got "stag 0: 0F0"`},
		{"stage: 0F0", `line 1: want "stage N: actions...", got "stage: 0F0"`},
		{"stage 1: 1F0", `line 1: want stage 0, got "1"`},
		{"stage 0: 0F0\nstage 0: 0B0", `line 2: want stage 1, got "0"`},
		{"stage x: 0F0", `line 1: want stage 0, got "x"`},
		{"stage 0: 0F0 0Q0", `line 1, column 14: parse action "0Q0": unknown kind 'Q' (want <stage><F|B|I|W|RF><micro-batch>[c<chunk>], e.g. "2F0")`},
		{"stage 0: 0F0\n\n  stage 1:\t1F0   1F1x 1B0", `line 3, column 18: parse action "1F1x": unexpected "x" after the action (want <stage><F|B|I|W|RF><micro-batch>[c<chunk>], e.g. "2F0")`},
	}
	for _, tt := range tests {
		s, err := ParseGrid(tt.in)
		if err == nil || err.Error() != tt.want {
			t.Errorf("ParseGrid(%q) = %v, %v\nwant error %s", tt.in, s, err, tt.want)
		}
	}
}

const golden1F1BGrid = `stage 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7
stage 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7
stage 2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7
stage 3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7
`

// With f=1, b=2: the fill (stage s starts at s), the steady F/B alternation,
// and the drain mirror the fill, giving (p-1)*(f+b) = 9 idle slots per stage.
const golden1F1BText = `makespan 33, slot 1
         0         10        20        30
stage 0: FFFF......BBFBBFBBFBBFBB.BB.BB.BB  bubble 27.3%
stage 1: .FFF....BBFBBFBBFBBFBBFBB.BB.BB..  bubble 27.3%
stage 2: ..FF..BBFBBFBBFBBFBBFBBFBB.BB....  bubble 27.3%
stage 3: ...FBBFBBFBBFBBFBBFBBFBBFBB......  bubble 27.3%
`

func TestGolden1F1B(t *testing.T) {
	s := mustBuild(t, "1f1b", 4, 8, 1)
	if got := s.Grid(); got != golden1F1BGrid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, golden1F1BGrid)
	}
	tl, err := Simulate(s, UniformCosts(4, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(1); got != golden1F1BText {
		t.Errorf("Text:\n%s\nwant:\n%s", got, golden1F1BText)
	}
	// A coarser slot samples the middle of each slot; a non-positive slot means 1.
	if got := tl.Text(0); got != golden1F1BText {
		t.Errorf("Text(0):\n%s", got)
	}
	// Half-width slots draw every character twice; the ruler marks every 10 slots.
	var want strings.Builder
	want.WriteString("makespan 33, slot 0.5\n")
	want.WriteString("         0         5         10        15        20        25        30\n")
	for _, line := range strings.Split(golden1F1BText, "\n")[2:6] {
		head, row, _ := strings.Cut(line, ": ")
		row, tail, _ := strings.Cut(row, "  ")
		want.WriteString(head + ": ")
		for _, r := range row {
			want.WriteString(string(r) + string(r))
		}
		want.WriteString("  " + tail + "\n")
	}
	if got := tl.Text(0.5); got != want.String() {
		t.Errorf("Text(0.5):\n%s\nwant:\n%s", got, want.String())
	}
	// The last ruler label is not cut off when it runs past the rows.
	if got := strings.Split(tl.Text(3), "\n")[1]; got != "         0         30" {
		t.Errorf("Text(3) ruler = %q", got)
	}
}

func TestGridPadsStageNumbers(t *testing.T) {
	g := mustBuild(t, "gpipe", 11, 1, 1).Grid()
	if !strings.HasPrefix(g, "stage  0: 0F0 0B0\n") || !strings.Contains(g, "\nstage 10: 10F0 10B0\n") {
		t.Errorf("Grid:\n%s", g)
	}
}

// TestSimulateByHand checks one step worked out on paper, with per-stage costs
// and a transfer cost: 0F0 [0,1], transfer to 1.5, 1F0 [1.5,3.5], 1B0 [3.5,7.5]
// from the local loss, transfer to 8, 0B0 [8,11].
func TestSimulateByHand(t *testing.T) {
	s := mustBuild(t, "1f1b", 2, 1, 1)
	tl, err := Simulate(s, Costs{F: []float64{1, 2}, B: []float64{3, 4}, Transfer: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	want := &Timeline{
		Makespan: 11,
		Spans: [][]Span{
			{{Action{Stage: 0, Kind: Forward}, 0, 1}, {Action{Stage: 0, Kind: Backward}, 8, 11}},
			{{Action{Stage: 1, Kind: Forward}, 1.5, 3.5}, {Action{Stage: 1, Kind: Backward}, 3.5, 7.5}},
		},
		Busy:         []float64{4, 6},
		PeakInFlight: []int{1, 1},
	}
	for st, b := range []float64{7.0 / 11, 5.0 / 11} {
		if math.Abs(tl.Bubble[st]-b) > 1e-12 {
			t.Errorf("stage %d bubble %v, want %v", st, tl.Bubble[st], b)
		}
	}
	tl.Bubble = nil
	if !reflect.DeepEqual(tl, want) {
		t.Fatalf("got %+v\nwant %+v", tl, want)
	}
}

// TestSimulateGPipeTransfer: with a transfer cost t, gpipe's fill and drain
// each pay p-1 transfers, so the makespan is (m+p-1)*(f+b) + 2*(p-1)*t.
func TestSimulateGPipeTransfer(t *testing.T) {
	for p := 1; p <= 6; p++ {
		for m := 1; m <= 12; m++ {
			s := mustBuild(t, "gpipe", p, m, 1)
			tl, err := Simulate(s, UniformCosts(p, 1, 2, 0.25))
			if err != nil {
				t.Fatal(err)
			}
			if want := float64(m+p-1)*3 + 2*float64(p-1)*0.25; tl.Makespan != want {
				t.Errorf("p=%d m=%d: makespan %v, want %v", p, m, tl.Makespan, want)
			}
		}
	}
}

// TestSimulateInvariants checks, on non-uniform costs, what any valid timeline
// must satisfy: stages never overlap their own actions, spans follow list
// order, each action lasts its stage's cost divided by the chunks, and each
// starts as soon as its stage is free and its inputs (worked out here from
// the model-stage rule, not by the simulator's code) have arrived.
func TestSimulateInvariants(t *testing.T) {
	costs := []Costs{
		{F: []float64{1, 3, 0.5, 2}, B: []float64{2, 1, 4, 2.5}, Transfer: 0.75},
		{F: []float64{1, 3, 0.5, 2}, B: []float64{2, 1, 4, 2.5}, I: []float64{1.5, 0.25, 1, 2}, W: []float64{0.5, 1, 3, 0.5}, Transfer: 0.3},
	}
	sizes := map[string][][3]int{
		"gpipe":          {{4, 7, 1}},
		"1f1b":           {{4, 7, 1}, {4, 2, 1}},
		"interleaved":    {{4, 8, 2}, {4, 4, 3}},
		"zb-h1":          {{4, 7, 1}, {4, 2, 1}},
		"interleaved-zb": {{4, 8, 2}, {4, 4, 3}},
	}
	for _, name := range Names() {
		for _, size := range sizes[name] {
			p, m, v := size[0], size[1], size[2]
			for ci, c := range costs {
				s := mustBuild(t, name, p, m, v)
				tl, err := Simulate(s, c)
				if err != nil {
					t.Fatal(err)
				}
				again, _ := Simulate(s, c)
				if !reflect.DeepEqual(tl, again) {
					t.Fatalf("%s: Simulate is not deterministic", name)
				}
				checkTimeline(t, fmt.Sprintf("%s p=%d m=%d v=%d costs %d", name, p, m, v, ci), s, tl, c)
			}
		}
	}
}

func checkTimeline(t *testing.T, what string, s *Schedule, tl *Timeline, c Costs) {
	t.Helper()
	p, v := s.Stages, s.Chunks
	end := map[Action]float64{}
	for _, spans := range tl.Spans {
		for _, sp := range spans {
			end[sp.Action] = sp.End
		}
	}
	inputs := func(a Action) []Action {
		ms := a.Chunk*p + a.Stage
		at := func(k Kind, ms int) Action {
			return Action{Stage: ms % p, Kind: k, MicroBatch: a.MicroBatch, Chunk: ms / p}
		}
		switch a.Kind {
		case Forward:
			if ms > 0 {
				return []Action{at(Forward, ms-1)}
			}
		case Backward, Input:
			in := []Action{at(Forward, ms)}
			if ms < p*v-1 {
				g := at(Backward, ms+1)
				if _, ok := end[g]; !ok {
					g = at(Input, ms+1)
				}
				in = append(in, g)
			}
			return in
		case Weight:
			return []Action{at(Input, ms)}
		}
		return nil
	}
	cost := func(a Action) float64 {
		d := map[Kind]float64{Forward: c.F[a.Stage], Backward: c.B[a.Stage], Input: c.B[a.Stage] / 2, Weight: c.B[a.Stage] / 2}[a.Kind]
		if a.Kind == Input && c.I != nil {
			d = c.I[a.Stage]
		}
		if a.Kind == Weight && c.W != nil {
			d = c.W[a.Stage]
		}
		return d / float64(v)
	}
	for st, spans := range tl.Spans {
		if len(spans) != len(s.Actions[st]) {
			t.Fatalf("%s: stage %d has %d spans", what, st, len(spans))
		}
		prev, busy := 0.0, 0.0
		for j, sp := range spans {
			a := sp.Action
			if a != s.Actions[st][j] {
				t.Errorf("%s: stage %d span %d = %+v out of order", what, st, j, sp)
			}
			if d := sp.End - sp.Start; math.Abs(d-cost(a)) > 1e-12 {
				t.Errorf("%s: %v lasts %v, want %v", what, a, d, cost(a))
			}
			ready := prev
			for _, in := range inputs(a) {
				e, ok := end[in]
				if !ok {
					t.Fatalf("%s: %v has no span", what, in)
				}
				if in.Stage != a.Stage {
					e += c.Transfer
					if in.Kind == Forward && a.RecvFrom(p, v) != in.Stage || in.Kind != Forward && in.SendTo(p, v) != a.Stage {
						t.Errorf("%s: %v's input %v disagrees with RecvFrom/SendTo", what, a, in)
					}
				}
				ready = max(ready, e)
			}
			if sp.Start != ready {
				t.Errorf("%s: %v starts at %v, want %v (stage free and inputs in)", what, a, sp.Start, ready)
			}
			prev = sp.End
			busy += sp.End - sp.Start
		}
		if tl.Makespan < prev {
			t.Errorf("%s: makespan %v before stage %d ends at %v", what, tl.Makespan, st, prev)
		}
		if math.Abs(tl.Busy[st]-busy) > 1e-9 {
			t.Errorf("%s: stage %d busy %v, spans add to %v", what, st, tl.Busy[st], busy)
		}
	}
}

func TestSimulateCostErrors(t *testing.T) {
	s := mustBuild(t, "gpipe", 2, 2, 1)
	tests := []struct {
		c    Costs
		want string
	}{
		{Costs{F: []float64{1, 1}, B: []float64{1, 1}, I: []float64{1}}, "costs have 1 input-gradient entries, want 2 (or none, for B/2)"},
		{Costs{F: []float64{1, 1}, B: []float64{1, 1}, W: []float64{1, 1, 1}}, "costs have 3 weight entries, want 2 (or none, for B/2)"},
		{Costs{F: []float64{1, 1}, B: []float64{1, 1}, I: []float64{1, -1}}, "stage 1: costs must be finite and >= 0, got F=1 B=1 I=-1"},
		{Costs{F: []float64{1, 1}, B: []float64{1, 1}, I: []float64{1, 1}, W: []float64{1, math.Inf(1)}}, "stage 1: costs must be finite and >= 0, got F=1 B=1 I=1 W=+Inf"},
		{Costs{F: []float64{1, 1}, B: []float64{1, 1}, W: []float64{math.NaN(), 1}}, "stage 0: costs must be finite and >= 0, got F=1 B=1 W=NaN"},
		{UniformCosts(3, 1, 1, 0), "costs have 3 forward and 3 backward entries, want 2 each"},
		{Costs{F: []float64{1, 1}}, "costs have 2 forward and 0 backward entries, want 2 each"},
		{UniformCosts(2, -1, 1, 0), "stage 0: costs must be finite and >= 0, got F=-1 B=1"},
		{UniformCosts(2, 1, math.NaN(), 0), "stage 0: costs must be finite and >= 0, got F=1 B=NaN"},
		{UniformCosts(2, 1, math.Inf(1), 0), "stage 0: costs must be finite and >= 0, got F=1 B=+Inf"},
		{UniformCosts(2, 1, 1, -0.5), "transfer cost must be finite and >= 0, got -0.5"},
	}
	for _, tt := range tests {
		if _, err := Simulate(s, tt.c); err == nil || err.Error() != tt.want {
			t.Errorf("Simulate(%+v) = %v, want %q", tt.c, err, tt.want)
		}
	}
}

func TestSimulateZeroCosts(t *testing.T) {
	s := mustBuild(t, "1f1b", 3, 2, 1)
	tl, err := Simulate(s, UniformCosts(3, 0, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if tl.Makespan != 0 || !reflect.DeepEqual(tl.Bubble, []float64{0, 0, 0}) {
		t.Fatalf("got %+v", tl)
	}
	if got, want := tl.Text(1), "makespan 0, slot 1\n\nstage 0:   bubble 0.0%\nstage 1:   bubble 0.0%\nstage 2:   bubble 0.0%\n"; got != want {
		t.Errorf("Text:\n%q\nwant\n%q", got, want)
	}
}

// TestInterleavedShapes pins the interleaved order, restated here as nested
// loops: forwards walk groups of p micro-batches, chunk by chunk; backwards
// the same with the chunks reversed; stage s runs
// min(2(p-s-1) + (v-1)p, m*v) warm-up forwards, then alternates.
func TestInterleavedShapes(t *testing.T) {
	for p := 2; p <= 6; p++ {
		for m := p; m <= 4*p; m += p {
			for v := 2; v <= 4; v++ {
				s := mustBuild(t, "interleaved", p, m, v)
				for st := range p {
					var fwd, bwd []Action
					for g := 0; g < m; g += p {
						for c := range v {
							for i := g; i < g+p; i++ {
								fwd = append(fwd, Action{Stage: st, Kind: Forward, MicroBatch: i, Chunk: c})
								bwd = append(bwd, Action{Stage: st, Kind: Backward, MicroBatch: i, Chunk: v - 1 - c})
							}
						}
					}
					warm := min(2*(p-st-1)+(v-1)*p, m*v)
					want := slices.Clone(fwd[:warm])
					for j := range m*v - warm {
						want = append(want, fwd[warm+j], bwd[j])
					}
					want = append(want, bwd[m*v-warm:]...)
					if !reflect.DeepEqual(s.Actions[st], want) {
						t.Errorf("p=%d m=%d v=%d stage %d:\n got %v\nwant %v", p, m, v, st, s.Actions[st], want)
					}
				}
			}
		}
	}
}

// TestZBH1BeatsOneFOneB: with F = I = W = 1 (a full backward of 2), zb-h1
// idles p-1 units per stage where 1f1b idles 3(p-1), so its makespan is
// 2(p-1) shorter, at the same peak of in-flight micro-batches.
func TestZBH1BeatsOneFOneB(t *testing.T) {
	for p := 2; p <= 8; p++ {
		for m := p; m <= 32; m++ {
			c := UniformCosts(p, 1, 2, 0)
			zb, err := Simulate(mustBuild(t, "zb-h1", p, m, 1), c)
			if err != nil {
				t.Fatal(err)
			}
			ob, err := Simulate(mustBuild(t, "1f1b", p, m, 1), c)
			if err != nil {
				t.Fatal(err)
			}
			if !(zb.Makespan < ob.Makespan) || ob.Makespan-zb.Makespan != float64(2*(p-1)) {
				t.Errorf("p=%d m=%d: zb-h1 makespan %v, 1f1b %v", p, m, zb.Makespan, ob.Makespan)
			}
			if slices.Max(zb.PeakInFlight) != slices.Max(ob.PeakInFlight) {
				t.Errorf("p=%d m=%d: zb-h1 peak %v, 1f1b %v", p, m, zb.PeakInFlight, ob.PeakInFlight)
			}
		}
	}
}

const goldenZBH1Grid = `stage 0: 0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7
stage 1: 1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 1I6 1W5 1I7 1W6 1W7
stage 2: 2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 2I7 2W5 2W6 2W7
stage 3: 3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7
`

// With F = I = W = 1 each stage idles p-1 = 3 units: stage s waits s units
// before its first forward and 3-s for its first input gradient, and the
// deferred weight passes fill the drain (compare golden1F1BText's 9).
const goldenZBH1Text = `makespan 27, slot 1
         0         10        20
stage 0: FFFF...IWFIWFIWFIWFIWIWIWIW  bubble 11.1%
stage 1: .FFF..IFIWFIWFIWFIWFIWIWIWW  bubble 11.1%
stage 2: ..FF.IFIFIWFIWFIWFIWFIWIWWW  bubble 11.1%
stage 3: ...FIFIFIFIWFIWFIWFIWFIWWWW  bubble 11.1%
`

func TestGoldenZBH1(t *testing.T) {
	s := mustBuild(t, "zb-h1", 4, 8, 1)
	if got := s.Grid(); got != goldenZBH1Grid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, goldenZBH1Grid)
	}
	tl, err := Simulate(s, UniformCosts(4, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(1); got != goldenZBH1Text {
		t.Errorf("Text:\n%s\nwant:\n%s", got, goldenZBH1Text)
	}
}

const goldenInterleavedGrid = `stage 0: 0F0 0F1 0F0c1 0F1c1 0F2 0B0c1 0F3 0B1c1 0F2c1 0B0 0F3c1 0B1 0B2c1 0B3c1 0B2 0B3
stage 1: 1F0 1F1 1F0c1 1B0c1 1F1c1 1B1c1 1F2 1B0 1F3 1B1 1F2c1 1B2c1 1F3c1 1B3c1 1B2 1B3
`

// Chunk 1 (lower case) runs between the two halves of chunk 0's work; with
// F = 1 and B = 2 per stage each chunk's actions take half that, and the idle
// time per stage halves to (p-1)(F+B)/v = 1.5.
const goldenInterleavedText = `makespan 13.5, slot 0.5
         0         5         10
stage 0: FFffF.bbFbbfBBfBB.bb.bbBBBB  bubble 11.1%
stage 1: .FFfbbfbbFBBFBBfbbfbbBBBB..  bubble 11.1%
`

func TestGoldenInterleaved(t *testing.T) {
	s := mustBuild(t, "interleaved", 2, 4, 2)
	if got := s.Grid(); got != goldenInterleavedGrid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, goldenInterleavedGrid)
	}
	tl, err := Simulate(s, UniformCosts(2, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(0.5); got != goldenInterleavedText {
		t.Errorf("Text:\n%s\nwant:\n%s", got, goldenInterleavedText)
	}
}

const goldenInterleavedZBGrid = `stage 0: 0F0 0F1 0F0c1 0F1c1 0F2 0I0c1 0W0c1 0F3 0I1c1 0W1c1 0F2c1 0I0 0W0 0F3c1 0I1 0I2c1 0W1 0W2c1 0I3c1 0I2 0I3 0W3c1 0W2 0W3
stage 1: 1F0 1F1 1F0c1 1I0c1 1F1c1 1I1c1 1F2 1I0 1W0c1 1F3 1I1 1W1c1 1F2c1 1I2c1 1W0 1F3c1 1I3c1 1I2 1I3 1W1 1W2c1 1W3c1 1W2 1W3
`

// interleaved's forwards and backwards (as input-gradient passes), with the
// weight passes where interleaved's stage would wait: each stage idles one
// chunk forward, (p-1)/v = 0.5 (compare goldenInterleavedText's 1.5).
const goldenInterleavedZBText = `makespan 12.5, slot 0.5
         0         5         10
stage 0: FFffFiwFiwfIWfIiWwiIIwWW.  bubble 4.0%
stage 1: .FFfifiFIwFIwfiWfiIIWwwWW  bubble 4.0%
`

func TestGoldenInterleavedZB(t *testing.T) {
	s := mustBuild(t, "interleaved-zb", 2, 4, 2)
	if got := s.Grid(); got != goldenInterleavedZBGrid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, goldenInterleavedZBGrid)
	}
	tl, err := Simulate(s, UniformCosts(2, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(0.5); got != goldenInterleavedZBText {
		t.Errorf("Text:\n%s\nwant:\n%s", got, goldenInterleavedZBText)
	}
}

// TestInterleavedZBKeepsInterleavedOrder: with its weight passes left out,
// each interleaved-zb stage runs interleaved's list with every B an I.
func TestInterleavedZBKeepsInterleavedOrder(t *testing.T) {
	for p := 2; p <= 6; p++ {
		for m := p; m <= 4*p; m += p {
			for v := 2; v <= 4; v++ {
				zb := mustBuild(t, "interleaved-zb", p, m, v)
				il := mustBuild(t, "interleaved", p, m, v)
				for st := range p {
					var got []Action
					for _, a := range zb.Actions[st] {
						if a.Kind != Weight {
							got = append(got, a)
						}
					}
					want := slices.Clone(il.Actions[st])
					for j := range want {
						if want[j].Kind == Backward {
							want[j].Kind = Input
						}
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("p=%d m=%d v=%d stage %d without W:\n got %v\nwant %v", p, m, v, st, got, want)
					}
				}
			}
		}
	}
}

// TestInterleavedZBLimitIsLeast: the in-flight limit interleaved-zb keeps,
// min((v+1)p-1, m*v) micro-batch chunks, is the least that lets interleaved's
// order run at all: stage 0 runs that many forwards before its first
// input-gradient pass, so with one fewer the list scheduling stalls, and says
// so.
func TestInterleavedZBLimitIsLeast(t *testing.T) {
	for p := 2; p <= 6; p++ {
		for m := p; m <= 4*p; m += p {
			for v := 2; v <= 4; v++ {
				limit := min((v+1)*p-1, m*v)
				_, err := splitList(p, m, v, limit-1, func(s int) []Action { return interleavedOrder(s, p, m, v, Input) })
				if want := fmt.Sprintf("(p=%d, m=%d, v=%d)", p, m, v); err == nil || !strings.Contains(err.Error(), "list scheduling stalled") || !strings.Contains(err.Error(), want) {
					t.Errorf("p=%d m=%d v=%d: limit %d gave %v, want a stall", p, m, v, limit-1, err)
				}
			}
		}
	}
}

// TestSimulateSplitByHand: zb-h1 on two stages, one micro-batch, with explicit
// I and W costs and a transfer: 0F0 [0,1], transfer to 1.5, 1F0 [1.5,3.5],
// 1I0 [3.5,6.5], 1W0 [6.5,7.5]; 1I0's gradient reaches stage 0 at 7: 0I0
// [7,8], 0W0 [8,10].
func TestSimulateSplitByHand(t *testing.T) {
	s := mustBuild(t, "zb-h1", 2, 1, 1)
	tl, err := Simulate(s, Costs{F: []float64{1, 2}, B: []float64{3, 4}, I: []float64{1, 3}, W: []float64{2, 1}, Transfer: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	a := func(st int, k Kind) Action { return Action{Stage: st, Kind: k} }
	want := &Timeline{
		Makespan: 10,
		Spans: [][]Span{
			{{a(0, Forward), 0, 1}, {a(0, Input), 7, 8}, {a(0, Weight), 8, 10}},
			{{a(1, Forward), 1.5, 3.5}, {a(1, Input), 3.5, 6.5}, {a(1, Weight), 6.5, 7.5}},
		},
		Busy:         []float64{4, 6},
		Bubble:       []float64{0.6, 0.4},
		PeakInFlight: []int{1, 1},
	}
	if !reflect.DeepEqual(tl, want) {
		t.Fatalf("got %+v\nwant %+v", tl, want)
	}
	// Without I and W the split is B/2 each.
	tl, err = Simulate(s, Costs{F: []float64{1, 2}, B: []float64{3, 4}, Transfer: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	// 1I0 [3.5,5.5], 0I0 [6,7.5], 0W0 [7.5,9].
	if got := tl.Spans[0][2]; got != (Span{a(0, Weight), 7.5, 9}) || tl.Makespan != 9 {
		t.Errorf("0W0 = %+v, makespan %v; want [7.5, 9], 9", got, tl.Makespan)
	}
}

// TestSimulateInterleavedByHand: two stages, two chunks, two micro-batches,
// F = 1 and B = 2 per stage (so 0.5 and 1 per chunk) and a transfer of 0.25,
// including across the ring from stage 1's chunk 0 to stage 0's chunk 1.
func TestSimulateInterleavedByHand(t *testing.T) {
	s := mustBuild(t, "interleaved", 2, 2, 2)
	tl, err := Simulate(s, UniformCosts(2, 1, 2, 0.25))
	if err != nil {
		t.Fatal(err)
	}
	a := func(text string) Action {
		x, err := ParseAction(text)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	want := [][]Span{
		{{a("0F0"), 0, 0.5}, {a("0F1"), 0.5, 1}, {a("0F0c1"), 1.5, 2}, {a("0F1c1"), 2, 2.5},
			{a("0B0c1"), 4, 5}, {a("0B1c1"), 5.5, 6.5}, {a("0B0"), 6.5, 7.5}, {a("0B1"), 8, 9}},
		{{a("1F0"), 0.75, 1.25}, {a("1F1"), 1.25, 1.75}, {a("1F0c1"), 2.25, 2.75}, {a("1B0c1"), 2.75, 3.75},
			{a("1F1c1"), 3.75, 4.25}, {a("1B1c1"), 4.25, 5.25}, {a("1B0"), 5.25, 6.25}, {a("1B1"), 6.75, 7.75}},
	}
	if !reflect.DeepEqual(tl.Spans, want) || tl.Makespan != 9 || !reflect.DeepEqual(tl.Busy, []float64{6, 6}) {
		t.Fatalf("got %v makespan %v busy %v\nwant %v", tl.Spans, tl.Makespan, tl.Busy, want)
	}
	if !reflect.DeepEqual(tl.PeakInFlight, []int{4, 3}) {
		t.Errorf("PeakInFlight = %v", tl.PeakInFlight)
	}
}

func TestUniformCosts(t *testing.T) {
	c := UniformCosts(2, 1, 3, 0.5)
	want := Costs{F: []float64{1, 1}, B: []float64{3, 3}, Transfer: 0.5}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("UniformCosts = %+v", c)
	}
	for _, tt := range []struct {
		a    string
		v    int
		want float64
	}{
		{"0F0", 1, 1}, {"0B0", 1, 3}, {"0I0", 1, 1.5}, {"1W0", 1, 1.5},
		{"0F0c1", 2, 0.5}, {"0B0", 2, 1.5}, {"1I0c2", 3, 0.5}, {"1W0", 4, 0.375},
	} {
		a, _ := ParseAction(tt.a)
		if got := c.duration(a, tt.v); got != tt.want {
			t.Errorf("%s with %d chunks lasts %v, want %v", tt.a, tt.v, got, tt.want)
		}
	}
}

func TestPeakInFlight(t *testing.T) {
	tests := []struct {
		grid string
		want []int
	}{
		{"stage 0: 0F0 0F1 0B0 0B1", []int{2}},
		// Activations stay until W, not I.
		{"stage 0: 0F0 0F1 0I0 0F2 0W0 0I1 0I2 0W1 0W2", []int{3}},
		{"stage 0: 0F0 0I0 0W0 0F1 0I1 0W1 0F2 0B2", []int{1}},
		// Chunks count separately.
		{"stage 0: 0F0 0F0c1 0B0c1 0F1 0F1c1 0B1c1 0B0 0B1", []int{3}},
	}
	for _, tt := range tests {
		s := mustParse(t, tt.grid)
		if err := s.Check(); err != nil {
			t.Fatalf("%s: %v", tt.grid, err)
		}
		if got := s.PeakInFlight(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: PeakInFlight = %v, want %v", tt.grid, got, tt.want)
		}
	}
}

// roundTripSchedules returns built-in schedules of assorted sizes.
func roundTripSchedules(t *testing.T) []*Schedule {
	var out []*Schedule
	for _, size := range [][4]any{
		{"gpipe", 1, 1, 1}, {"gpipe", 1, 3, 1}, {"gpipe", 3, 1, 1}, {"gpipe", 4, 8, 1}, {"gpipe", 12, 5, 1},
		{"1f1b", 1, 1, 1}, {"1f1b", 1, 3, 1}, {"1f1b", 3, 1, 1}, {"1f1b", 4, 8, 1}, {"1f1b", 12, 5, 1},
		{"interleaved", 2, 2, 2}, {"interleaved", 4, 8, 2}, {"interleaved", 3, 6, 4}, {"interleaved", 12, 12, 3},
		{"zb-h1", 1, 1, 1}, {"zb-h1", 1, 3, 1}, {"zb-h1", 3, 1, 1}, {"zb-h1", 4, 8, 1}, {"zb-h1", 12, 5, 1},
		{"interleaved-zb", 2, 2, 2}, {"interleaved-zb", 4, 8, 2}, {"interleaved-zb", 3, 6, 4}, {"interleaved-zb", 12, 12, 3},
	} {
		out = append(out, mustBuild(t, size[0].(string), size[1].(int), size[2].(int), size[3].(int)))
	}
	return out
}

func sameSchedule(a, b *Schedule) bool {
	return a.Stages == b.Stages && a.MicroBatches == b.MicroBatches && a.Chunks == b.Chunks && reflect.DeepEqual(a.Actions, b.Actions)
}

func TestLoadRoundTrip(t *testing.T) {
	for _, s := range roundTripSchedules(t) {
		what := fmt.Sprintf("%s p=%d m=%d v=%d", s.Name, s.Stages, s.MicroBatches, s.Chunks)
		var csvText, yamlText bytes.Buffer
		if err := s.WriteCSV(&csvText); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteYAML(&yamlText); err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct{ format, text string }{
			{"csv", csvText.String()},
			{"grid", s.Grid()},
			{"yaml", yamlText.String()},
		} {
			back, err := Load(strings.NewReader(tt.text), tt.format)
			if err != nil {
				t.Fatalf("%s: Load %s: %v\n%s", what, tt.format, err, tt.text)
			}
			if !sameSchedule(back, s) {
				t.Errorf("%s: %s round trip differs:\n%s\nvs\n%s", what, tt.format, tt.text, back.Grid())
			}
			if wantName := map[bool]string{true: s.Name}[tt.format == "yaml"]; back.Name != wantName {
				t.Errorf("%s: %s round trip names it %q", what, tt.format, back.Name)
			}
			if err := back.Check(); err != nil {
				t.Errorf("%s: %s: Check: %v", what, tt.format, err)
			}
		}
	}
	if got := csvOf(t, mustBuild(t, "1f1b", 2, 2, 1)); got != "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n" {
		t.Errorf("WriteCSV = %q", got)
	}
	// An empty stage list keeps its row.
	s := &Schedule{Stages: 2, MicroBatches: 1, Chunks: 1, Actions: [][]Action{{{Kind: Forward}}, {}}}
	back, err := Load(strings.NewReader(csvOf(t, s)), "csv")
	if err != nil || !sameSchedule(back, s) {
		t.Errorf("empty row: %+v, %v", back, err)
	}
}

func csvOf(t *testing.T, s *Schedule) string {
	var b strings.Builder
	if err := s.WriteCSV(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestLoadHandWritten reads schedules as people write them: CSV with blank
// cells (as torch.distributed.pipelining pads its rows) and spaces, YAML in
// block style with a name.
func TestLoadHandWritten(t *testing.T) {
	want := &Schedule{Stages: 2, MicroBatches: 2, Chunks: 2, Actions: [][]Action{
		{{0, Forward, 0, 0}, {0, Forward, 0, 1}, {0, Input, 0, 1}, {0, Input, 0, 0}, {0, Weight, 0, 1}, {0, Weight, 0, 0}, {0, Forward, 1, 0}, {0, Forward, 1, 1}, {0, Backward, 1, 1}, {0, Backward, 1, 0}},
		{{1, Forward, 0, 0}, {1, Forward, 0, 1}, {1, Input, 0, 1}, {1, Weight, 0, 1}, {1, Input, 0, 0}, {1, Weight, 0, 0}, {1, Forward, 1, 0}, {1, Forward, 1, 1}, {1, Backward, 1, 1}, {1, Backward, 1, 0}},
	}}
	inputs := []struct{ format, text string }{
		{"csv", "0F0,,0F0c1,0I0c1,0I0,0W0c1,0W0,0F1,0F1c1,0B1c1,0B1\n" +
			" 1F0 ,1F0c1,1I0c1,1W0c1,1I0,1W0,1F1,1F1c1,1B1c1,1B1,,\n"},
		{"yaml", `# two stages, two chunks
name: by hand
stages:
  - [0F0, 0F0c1, 0I0c1, 0I0, 0W0c1, 0W0, 0F1, 0F1c1, 0B1c1, 0B1]
  -
    - 1F0
    - 1F0c1
    - 1I0c1
    - 1W0c1
    - 1I0
    - 1W0
    - 1F1
    - 1F1c1
    - 1B1c1
    - 1B1
`},
		{"grid", "# two stages, two chunks\nstage 0: 0F0 0F0c1 0I0c1 0I0 0W0c1 0W0 0F1 0F1c1 0B1c1 0B1\nstage 1: 1F0 1F0c1 1I0c1 1W0c1 1I0 1W0 1F1 1F1c1 1B1c1 1B1\n"},
	}
	for _, in := range inputs {
		s, err := Load(strings.NewReader(in.text), in.format)
		if err != nil {
			t.Fatalf("%s: %v", in.format, err)
		}
		if !sameSchedule(s, want) {
			t.Errorf("%s: got %+v", in.format, s)
		}
		if err := s.Check(); err != nil {
			t.Errorf("%s: Check: %v", in.format, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	const want = ` (want <stage><F|B|I|W|RF><micro-batch>[c<chunk>], e.g. "2F0")`
	tests := []struct{ format, in, want string }{
		{"csv", "0F0,0F1,0B0,0B1\n1F0,1X0\n", `csv row 2, column 2: parse action "1X0": unknown kind 'X'` + want},
		{"csv", "0F0,,0B0c\n", `csv row 1, column 3: parse action "0B0c": missing or invalid chunk number` + want},
		{"csv", "0F0,\"0B0\n", `csv: parse error on line 1, column 10: extraneous or missing " in quoted-field`},
		{"csv", "", "csv: no rows found"},
		{"grid", "stage 0: 0F0 0B0\nstage 1: 1F0 1B0 1b0\n", `line 2, column 18: parse action "1b0": unknown kind 'b'` + want},
		{"grid", "", "no stage lines found"},
		{"yaml", "stages:\n  - [0F0, 0B0]\n  - [1F0, 1Q0]\n", `yaml line 3, column 11: parse action "1Q0": unknown kind 'Q'` + want},
		{"yaml", "stages:\n  - [0F0, 0B0]\n  -\n    - 1F0\n    - 1B0x\n", `yaml line 5, column 7: parse action "1B0x": unexpected "x" after the action` + want},
		{"yaml", "", `yaml: want a mapping with a "stages" key, got an empty document`},
		{"yaml", "- 0F0\n", `yaml line 1, column 1: want a mapping with a "stages" key`},
		{"yaml", "name: x\n", `yaml line 1, column 1: missing key "stages"`},
		{"yaml", "name: [x]\nstages: []\n", `yaml line 1, column 7: want the schedule's name as a string`},
		{"yaml", "stage: [[0F0]]\n", `yaml line 1, column 1: unknown key "stage" (want name, placement, stages)`},
		{"yaml", "stages: 3\n", `yaml line 1, column 9: want "stages" to be a list of lists of actions, one per stage`},
		{"yaml", "stages: []\n", `yaml line 1, column 9: no stages found`},
		{"yaml", "stages:\n  - 0F0\n", `yaml line 2, column 5: want stage 0's list of actions`},
		{"yaml", "stages: [[0F0], [[1F0]]]\n", `yaml line 1, column 18: want an action such as "1F0" in stage 1's list`},
		{"yaml", "stages: [\n", "yaml: line 1: did not find expected node content"},
		{"json", "{}", `unknown schedule format "json" (known: csv, grid, yaml)`},
	}
	for _, tt := range tests {
		s, err := Load(strings.NewReader(tt.in), tt.format)
		if err == nil || err.Error() != tt.want || s != nil {
			t.Errorf("Load(%q, %s) = %v, %v\nwant error %s", tt.in, tt.format, s, err, tt.want)
		}
	}
	if _, err := Load(iotest.ErrReader(errors.New("disk on fire")), "csv"); err == nil || err.Error() != "read csv schedule: disk on fire" {
		t.Errorf("Load(failing reader) = %v", err)
	}
	if got := Formats(); !reflect.DeepEqual(got, []string{"csv", "grid", "yaml"}) {
		t.Errorf("Formats() = %v", got)
	}
}

// TestLoadThenCheck: a loaded schedule that parses but cannot run is
// rejected by Check, naming the action.
func TestLoadThenCheck(t *testing.T) {
	tests := []struct{ format, in, want string }{
		{"csv", "0F0,0I0,0W0\n1F0,1W0,1I0\n", "stage 1: action 1W0 at position 1 comes before 1I0 at position 2"},
		{"csv", "0F0,0I0,0W0\n1F0,1I0\n", "stage 1: missing action 1W0"},
		{"yaml", "stages: [[0F0, 0B0, 0I0], [1F0, 1B0]]", "stage 0: action 0I0 at position 2: conflicts with 0B0 at position 1 (a backward is either B, or I and W)"},
		{"grid", "stage 0: 0F0c1 0F0 0B0 0B0c1\nstage 1: 1F0 1F0c1 1B0c1 1B0\n", "deadlock: stage 0 waits at 0F0c1 for 1F0; stage 1 waits at 1F0 for 0F0"},
	}
	for _, tt := range tests {
		s, err := Load(strings.NewReader(tt.in), tt.format)
		if err != nil {
			t.Fatalf("Load(%q): %v", tt.in, err)
		}
		if err := s.Check(); err == nil || err.Error() != tt.want {
			t.Errorf("Check(%q) = %v\nwant %s", tt.in, err, tt.want)
		}
	}
}

func TestSplitsBackward(t *testing.T) {
	for _, name := range Names() {
		v := 1
		if name == "interleaved" || name == "zb-v" || name == "interleaved-zb" || name == "dualpipev" {
			v = 2
		}
		s := mustBuild(t, name, 4, 8, v)
		if got, want := s.SplitsBackward(), name == "zb-h1" || name == "zb-v" || name == "interleaved-zb" || name == "dualpipev"; got != want {
			t.Errorf("%s: SplitsBackward() = %v, want %v", name, got, want)
		}
	}
	if !mustParse(t, "stage 0: 0F0 0F1 0B0 0I1 0W1").SplitsBackward() {
		t.Error("a schedule splitting one backward does not split")
	}
}

func TestReadFilePicksFormatByExtension(t *testing.T) {
	want, err := Build("1f1b", 2, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var csv, yml strings.Builder
	if err := want.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	if err := want.WriteYAML(&yml); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"s.csv": csv.String(), "s.yml": yml.String(), "s.txt": want.Grid()}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Grid() != want.Grid() {
			t.Errorf("%s read back as\n%s", name, got.Grid())
		}
	}
	if _, err := ReadFile(filepath.Join(dir, "absent.csv")); err == nil {
		t.Error("missing file accepted")
	}
}

// TestSimulateGap: a stage's hand-off separates its actions, not a step's
// first from nothing, and counts as idle time; a bad one is refused.
func TestSimulateGap(t *testing.T) {
	s, err := Build("gpipe", 1, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := UniformCosts(1, 1, 2, 0)
	c.Gap = []float64{0.5}
	tl, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	var starts []float64
	for _, sp := range tl.Spans[0] {
		starts = append(starts, sp.Start)
	}
	if !slices.Equal(starts, []float64{0, 1.5, 3, 5.5}) || tl.Makespan != 7.5 || tl.Busy[0] != 6 || math.Abs(tl.Bubble[0]-0.2) > 1e-12 {
		t.Errorf("starts %v, makespan %v, busy %v, bubble %v; want [0 1.5 3 5.5], 7.5, 6, 0.2", starts, tl.Makespan, tl.Busy[0], tl.Bubble[0])
	}
	for _, bad := range [][]float64{{-1}, {0, 0}} {
		c.Gap = bad
		if _, err := Simulate(s, c); err == nil || !strings.Contains(err.Error(), "hand-off") {
			t.Errorf("gap %v: %v", bad, err)
		}
	}
}
