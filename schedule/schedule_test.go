package schedule

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

func mustBuild(t *testing.T, name string, p, m int) *Schedule {
	t.Helper()
	s, err := Build(name, p, m)
	if err != nil {
		t.Fatalf("Build(%q, %d, %d): %v", name, p, m, err)
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

// TestBuiltins checks every built-in schedule over a grid of sizes against
// the stated properties: valid, each action once, the stated activation peak,
// and a simulated bubble and makespan equal to the closed forms.
func TestBuiltins(t *testing.T) {
	for _, name := range Names() {
		for p := 1; p <= 8; p++ {
			for m := 1; m <= 32; m++ {
				t.Run(fmt.Sprintf("%s/p%d/m%d", name, p, m), func(t *testing.T) {
					s := mustBuild(t, name, p, m)
					if s.Name != name || s.Stages != p || s.MicroBatches != m || len(s.Actions) != p {
						t.Fatalf("header = %q %d %d with %d lists", s.Name, s.Stages, s.MicroBatches, len(s.Actions))
					}
					if err := s.Check(); err != nil {
						t.Fatalf("Check: %v", err)
					}

					// Each action exactly once, on its own list, counted
					// independently of Check.
					seen := map[Action]int{}
					for st, list := range s.Actions {
						if len(list) != 2*m {
							t.Errorf("stage %d has %d actions, want %d", st, len(list), 2*m)
						}
						for _, a := range list {
							if a.Stage != st {
								t.Errorf("stage %d list holds %v", st, a)
							}
							seen[a]++
						}
					}
					for st := range p {
						for _, k := range []Kind{Forward, Backward} {
							for i := range m {
								if a := (Action{Stage: st, Kind: k, MicroBatch: i}); seen[a] != 1 {
									t.Errorf("%v appears %d times", a, seen[a])
								}
							}
						}
					}

					want := make([]int, p)
					for st := range want {
						switch name {
						case "gpipe":
							want[st] = m
						case "1f1b":
							want[st] = min(p-st, m)
						default:
							t.Fatalf("no expected PeakInFlight for %q", name)
						}
					}
					if got := s.PeakInFlight(); !reflect.DeepEqual(got, want) {
						t.Errorf("PeakInFlight = %v, want %v", got, want)
					}

					bubble, ok := TheoreticalBubble(name, p, m)
					if !ok {
						t.Fatalf("TheoreticalBubble not ok")
					}
					for _, fb := range [][2]float64{{1, 1}, {1, 2}} {
						f, b := fb[0], fb[1]
						tl, err := Simulate(s, UniformCosts(p, f, b, 0))
						if err != nil {
							t.Fatalf("Simulate f=%v b=%v: %v", f, b, err)
						}
						if want := float64(m+p-1) * (f + b); tl.Makespan != want {
							t.Errorf("f=%v b=%v: makespan %v, want %v", f, b, tl.Makespan, want)
						}
						for st := range p {
							if math.Abs(tl.Bubble[st]-bubble) > 1e-12 {
								t.Errorf("f=%v b=%v: stage %d bubble %v, want %v", f, b, st, tl.Bubble[st], bubble)
							}
							if want := float64(m) * (f + b); tl.Busy[st] != want {
								t.Errorf("f=%v b=%v: stage %d busy %v, want %v", f, b, st, tl.Busy[st], want)
							}
						}
						if !reflect.DeepEqual(tl.PeakInFlight, want) {
							t.Errorf("timeline PeakInFlight = %v, want %v", tl.PeakInFlight, want)
						}
					}
				})
			}
		}
	}
}

// TestShapes pins the exact order of each built-in, as documented on Build.
func TestShapes(t *testing.T) {
	for p := 1; p <= 6; p++ {
		for m := 1; m <= 10; m++ {
			g := mustBuild(t, "gpipe", p, m)
			o := mustBuild(t, "1f1b", p, m)
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
		name string
		p, m int
		want string
	}{
		{"zb", 2, 2, `unknown schedule "zb" (known: gpipe, 1f1b)`},
		{"", 2, 2, `unknown schedule "" (known: gpipe, 1f1b)`},
		{"gpipe", 0, 2, "stages must be >= 1, got 0"},
		{"1f1b", -3, 2, "stages must be >= 1, got -3"},
		{"1f1b", 2, 0, "micro-batches must be >= 1, got 0"},
	}
	for _, tt := range tests {
		s, err := Build(tt.name, tt.p, tt.m)
		if err == nil || err.Error() != tt.want || s != nil {
			t.Errorf("Build(%q, %d, %d) = %v, %v; want error %q", tt.name, tt.p, tt.m, s, err, tt.want)
		}
	}
}

func TestTheoreticalBubble(t *testing.T) {
	tests := []struct {
		name   string
		p, m   int
		want   float64
		wantOK bool
	}{
		{"gpipe", 4, 8, 3.0 / 11, true},
		{"1f1b", 4, 8, 3.0 / 11, true},
		{"1f1b", 1, 5, 0, true},
		{"nope", 4, 8, 0, false},
		{"gpipe", 0, 8, 0, false},
		{"gpipe", 4, 0, 0, false},
	}
	for _, tt := range tests {
		got, ok := TheoreticalBubble(tt.name, tt.p, tt.m)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("TheoreticalBubble(%q, %d, %d) = %v, %v; want %v, %v", tt.name, tt.p, tt.m, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestNames(t *testing.T) {
	got := Names()
	if want := []string{"gpipe", "1f1b"}; !reflect.DeepEqual(got, want) {
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
			s := mustBuild(t, "gpipe", 2, 2)
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
			"stage 0: action 0F0c1 at position 0: chunk 1 not supported (must be 0)"},
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
	for k, want := range map[Kind]string{Forward: "F", Backward: "B", 7: "Kind(7)"} {
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
		for _, k := range []Kind{Forward, Backward} {
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
	if n < 1000 {
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
		want := fmt.Sprintf("parse action %q: %s (want <stage><F|B><micro-batch>, e.g. \"2F0\")", tt.in, tt.why)
		if err.Error() != want {
			t.Errorf("ParseAction(%q) error\n got %s\nwant %s", tt.in, err, want)
		}
	}
}

func TestRecvFromSendTo(t *testing.T) {
	tests := []struct {
		a          string
		stages     int
		recv, send int
	}{
		{"0F0", 1, -1, -1},
		{"0B0", 1, -1, -1},
		{"0F3", 3, -1, 1},
		{"1F3", 3, 0, 2},
		{"2F3", 3, 1, -1},
		{"0B3", 3, 1, -1},
		{"1B3", 3, 2, 0},
		{"2B3", 3, -1, 1},
	}
	for _, tt := range tests {
		a, err := ParseAction(tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.RecvFrom(tt.stages); got != tt.recv {
			t.Errorf("%s.RecvFrom(%d) = %d, want %d", tt.a, tt.stages, got, tt.recv)
		}
		if got := a.SendTo(tt.stages); got != tt.send {
			t.Errorf("%s.SendTo(%d) = %d, want %d", tt.a, tt.stages, got, tt.send)
		}
	}
}

func TestGridRoundTrip(t *testing.T) {
	for _, name := range Names() {
		for _, pm := range [][2]int{{1, 1}, {1, 3}, {3, 1}, {4, 8}, {12, 5}} {
			s := mustBuild(t, name, pm[0], pm[1])
			g := s.Grid()
			back := mustParse(t, g)
			if back.Stages != s.Stages || back.MicroBatches != s.MicroBatches || !reflect.DeepEqual(back.Actions, s.Actions) {
				t.Errorf("%s p=%d m=%d: round trip differs:\n%s\nvs\n%s", name, pm[0], pm[1], g, back.Grid())
			}
			if back.Grid() != g {
				t.Errorf("%s p=%d m=%d: Grid not stable", name, pm[0], pm[1])
			}
		}
	}
}

func TestParseGridLenient(t *testing.T) {
	s := mustParse(t, "# my schedule\n\n  stage 0 :  0F0   0B0 \nstage 1:\n")
	want := &Schedule{Stages: 2, MicroBatches: 1, Actions: [][]Action{
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
		{"stage 0: 0F0 0Q0", `line 1: parse action "0Q0": unknown kind 'Q' (want <stage><F|B><micro-batch>, e.g. "2F0")`},
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
	s := mustBuild(t, "1f1b", 4, 8)
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
	g := mustBuild(t, "gpipe", 11, 1).Grid()
	if !strings.HasPrefix(g, "stage  0: 0F0 0B0\n") || !strings.Contains(g, "\nstage 10: 10F0 10B0\n") {
		t.Errorf("Grid:\n%s", g)
	}
}

// TestSimulateByHand checks one step worked out on paper, with per-stage costs
// and a transfer cost: 0F0 [0,1], transfer to 1.5, 1F0 [1.5,3.5], 1B0 [3.5,7.5]
// from the local loss, transfer to 8, 0B0 [8,11].
func TestSimulateByHand(t *testing.T) {
	s := mustBuild(t, "1f1b", 2, 1)
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
			s := mustBuild(t, "gpipe", p, m)
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
// order, and every input arrives before its consumer starts.
func TestSimulateInvariants(t *testing.T) {
	c := Costs{F: []float64{1, 3, 0.5, 2}, B: []float64{2, 1, 4, 2.5}, Transfer: 0.75}
	for _, name := range Names() {
		s := mustBuild(t, name, 4, 7)
		tl, err := Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Simulate(s, c)
		if !reflect.DeepEqual(tl, again) {
			t.Fatalf("%s: Simulate is not deterministic", name)
		}
		end := map[Action]float64{}
		for _, spans := range tl.Spans {
			for _, sp := range spans {
				end[sp.Action] = sp.End
			}
		}
		for st, spans := range tl.Spans {
			if len(spans) != len(s.Actions[st]) {
				t.Fatalf("%s: stage %d has %d spans", name, st, len(spans))
			}
			prev := 0.0
			for j, sp := range spans {
				a := sp.Action
				if a != s.Actions[st][j] || sp.Start < prev {
					t.Errorf("%s: stage %d span %d = %+v out of order", name, st, j, sp)
				}
				prev = sp.End
				if src := a.RecvFrom(4); src >= 0 {
					if in := end[Action{Stage: src, Kind: a.Kind, MicroBatch: a.MicroBatch}] + c.Transfer; sp.Start < in {
						t.Errorf("%s: %v starts at %v before its input at %v", name, a, sp.Start, in)
					}
				}
			}
			if tl.Makespan < prev {
				t.Errorf("%s: makespan %v before stage %d ends at %v", name, tl.Makespan, st, prev)
			}
		}
	}
}

func TestSimulateCostErrors(t *testing.T) {
	s := mustBuild(t, "gpipe", 2, 2)
	tests := []struct {
		c    Costs
		want string
	}{
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
	s := mustBuild(t, "1f1b", 3, 2)
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
