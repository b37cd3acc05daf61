package schedule

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestTopologyPlacements: every placement puts each model stage on exactly
// one (stage, chunk), Locate inverts ModelStage, and under V neighbouring
// model stages sit on the same or neighbouring stages, never round a ring.
func TestTopologyPlacements(t *testing.T) {
	for _, pl := range []Placement{Loop, V} {
		for p := 1; p <= 8; p++ {
			for v := 1; v <= 4; v++ {
				tp := Topology{Stages: p, Chunks: v, Placement: pl}
				seen := make([]int, p*v)
				for st := range p {
					for c := range v {
						k := tp.ModelStage(st, c)
						if k != placedModelStage(pl, p, Action{Stage: st, Chunk: c}) {
							t.Fatalf("%v p%d: ModelStage(%d, %d) = %d", pl, p, st, c, k)
						}
						seen[k]++
						if s2, c2 := tp.Locate(k); s2 != st || c2 != c {
							t.Fatalf("%v p%d v%d: Locate(%d) = %d, %d, want %d, %d", pl, p, v, k, s2, c2, st, c)
						}
					}
				}
				for k, n := range seen {
					if n != 1 {
						t.Fatalf("%v p%d v%d: model stage %d placed %d times", pl, p, v, k, n)
					}
				}
				if pl != V {
					continue
				}
				for k := 0; k+1 < p*v; k++ {
					a, _ := tp.Locate(k)
					b, _ := tp.Locate(k + 1)
					if d := b - a; d < -1 || d > 1 {
						t.Fatalf("V p%d v%d: model stages %d and %d on stages %d and %d", p, v, k, k+1, a, b)
					}
				}
			}
		}
	}
	// ZB-V's V: stage s holds model stages s and 2p-1-s.
	tp := Topology{Stages: 4, Chunks: 2, Placement: V}
	for st, want := range [][2]int{{0, 7}, {1, 6}, {2, 5}, {3, 4}} {
		if got := [2]int{tp.ModelStage(st, 0), tp.ModelStage(st, 1)}; got != want {
			t.Errorf("stage %d holds %v, want %v", st, got, want)
		}
	}
}

// TestVNeighbours pins where V's tensors go on three stages (model stages
// 0, 1, 2 down stages 0, 1, 2 on chunk 0, then 3, 4, 5 back up on chunk
// 1), the wire tags both ends use, and which way each crosses its link.
func TestVNeighbours(t *testing.T) {
	tp := Topology{Stages: 3, Chunks: 2, Placement: V}
	tests := []struct {
		a          string
		recv, send int
		model      int
	}{
		{"0F1", -1, 1, 0},
		{"1F1", 0, 2, 1},
		{"2F1", 1, 2, 2}, // the turn: chunk 0 hands its output to chunk 1 locally
		{"2F1c1", 2, 1, 3},
		{"1F1c1", 2, 0, 4},
		{"0F1c1", 1, -1, 5}, // stage 0 computes the loss
		{"0I1c1", -1, 1, 5},
		{"1I1c1", 0, 2, 4},
		{"2I1c1", 1, 2, 3},
		{"2I1", 2, 1, 2},
		{"0I1", 1, -1, 0},
		{"0B1", 1, -1, 0},
		{"1W1c1", -1, -1, 4},
	}
	for _, tt := range tests {
		a, err := ParseAction(tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.RecvFrom(a); got != tt.recv {
			t.Errorf("%s: RecvFrom = %d, want %d", tt.a, got, tt.recv)
		}
		if got := tp.SendTo(a); got != tt.send {
			t.Errorf("%s: SendTo = %d, want %d", tt.a, got, tt.send)
		}
		if got := tp.ModelStageOf(a); got != tt.model {
			t.Errorf("%s: ModelStageOf = %d, want %d", tt.a, got, tt.model)
		}
	}
	ops := []struct {
		op   string
		tag  int
		down bool
	}{
		{"0F1>1", 0, true},
		{"1F1<0", 0, true},
		{"2F1>2", 0, false}, // local: no link
		{"2F1c1<2", 0, false},
		{"2F1c1>1", 1, false}, // chunk 1's activation travels up the link stage 1 dials
		{"1F1c1<2", 1, false},
		{"1F1c1>0", 1, false},
		{"0I1c1>1", 1, true}, // and its gradient down
		{"1I1c1<0", 1, true},
		{"1I1<2", 0, false}, // chunk 0's gradient travels up beside chunk 1's activations
		{"1I1>0", 0, false},
	}
	for _, tt := range ops {
		o, err := ParseOp(tt.op)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.Tag(o); got != tt.tag {
			t.Errorf("%s: Tag = %d, want %d", tt.op, got, tt.tag)
		}
		if got := tp.Downstream(o); got != tt.down && o.Peer != o.Action.Stage {
			t.Errorf("%s: Downstream = %v, want %v", tt.op, got, tt.down)
		}
	}
	// Under Loop activations always travel down their link, gradients up,
	// the ring's included.
	loop := Topology{Stages: 2, Chunks: 2}
	for _, s := range []string{"1F0>0", "0F0>1", "0B0c1>1", "1B0>0"} {
		o, _ := ParseOp(s)
		if got, want := loop.Downstream(o), o.Kind == SendAct; got != want {
			t.Errorf("loop %s: Downstream = %v", s, got)
		}
	}
}

func TestTopologyEnds(t *testing.T) {
	tests := []struct {
		tp               Topology
		first, last      int
		ring, ringIfTied bool
	}{
		{Topology{Stages: 4, Chunks: 1}, 0, 3, false, true},
		{Topology{Stages: 4, Chunks: 2}, 0, 3, true, true},
		{Topology{Stages: 1, Chunks: 2}, 0, 0, false, false},
		{Topology{Stages: 4, Chunks: 2, Placement: V}, 0, 0, false, false},
		{Topology{Stages: 1, Chunks: 2, Placement: V}, 0, 0, false, false},
		{Topology{Stages: 3, Chunks: 3, Placement: V}, 0, 2, false, true},
	}
	for _, tt := range tests {
		first, last := tt.tp.TiedStages()
		if first != tt.first || last != tt.last || tt.tp.LossStage() != tt.last {
			t.Errorf("%+v: TiedStages = %d, %d; LossStage %d; want %d, %d", tt.tp, first, last, tt.tp.LossStage(), tt.first, tt.last)
		}
		if tt.tp.Ring(false) != tt.ring || tt.tp.Ring(true) != tt.ringIfTied {
			t.Errorf("%+v: Ring = %v, %v; want %v, %v", tt.tp, tt.tp.Ring(false), tt.tp.Ring(true), tt.ring, tt.ringIfTied)
		}
	}
}

func TestParsePlacement(t *testing.T) {
	for _, name := range Placements() {
		pl, err := ParsePlacement(name)
		if err != nil || pl.String() != name {
			t.Errorf("ParsePlacement(%q) = %v, %v", name, pl, err)
		}
	}
	if _, err := ParsePlacement("w"); err == nil || err.Error() != `unknown placement "w" (known: loop, v)` {
		t.Errorf("ParsePlacement(w): %v", err)
	}
}

// TestPlacementRoundTrip: every format carries a V schedule's placement
// (the lists alone would mean a Loop schedule's traffic), and a Loop
// schedule is written as it always was, without one.
func TestPlacementRoundTrip(t *testing.T) {
	s := mustBuild(t, "zb-v", 3, 5, 2)
	var csvText, yamlText bytes.Buffer
	if err := s.WriteCSV(&csvText); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteYAML(&yamlText); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Grid(), "placement: v\nstage 0: 0F0 ") || !strings.HasPrefix(csvText.String(), "placement: v\n0F0,") ||
		!strings.HasPrefix(yamlText.String(), "name: \"zb-v\"\nplacement: v\nstages:\n") {
		t.Fatalf("placement not written first:\n%s\n%s\n%s", s.Grid(), csvText.String(), yamlText.String())
	}
	dir := t.TempDir()
	for _, tt := range []struct{ format, file, text string }{
		{"csv", "s.csv", csvText.String()},
		{"grid", "s.txt", s.Grid()},
		{"yaml", "s.yaml", yamlText.String()},
	} {
		back, err := Load(strings.NewReader(tt.text), tt.format)
		if err != nil {
			t.Fatalf("%s: %v", tt.format, err)
		}
		if back.Placement != V || !sameSchedule(back, s) {
			t.Errorf("%s: placement %v, same lists %v", tt.format, back.Placement, sameSchedule(back, s))
		}
		path := filepath.Join(dir, tt.file)
		if err := os.WriteFile(path, []byte(tt.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if l, err := ReadLowered(path); err != nil || l.Placement != V {
			t.Errorf("%s: ReadLowered: %v", tt.format, err)
		}
	}
	l, err := Lower(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseLoweredGrid(l.Grid())
	if err != nil || back.Placement != V || !reflect.DeepEqual(back.Ops, l.Ops) {
		t.Fatalf("lowered grid round trip: %v", err)
	}
	path := filepath.Join(dir, "lowered.txt")
	if err := os.WriteFile(path, []byte(l.Grid()), 0o644); err != nil {
		t.Fatal(err)
	}
	if l2, err := ReadLowered(path); err != nil || l2.Placement != V || !reflect.DeepEqual(l2.Ops, l.Ops) {
		t.Fatalf("ReadLowered of a lowered V grid: %v", err)
	}
	// Without its placement the same lists are another schedule: lowered as
	// Loop, the turn's local hand-off becomes a send to stage 0 over a ring.
	loop := *s
	loop.Placement = Loop
	if ll, err := Lower(&loop); err == nil && reflect.DeepEqual(ll.Ops, l.Ops) {
		t.Error("the placement changes nothing in the lowered schedule")
	}

	plain := mustBuild(t, "1f1b", 2, 2, 1)
	var c, y bytes.Buffer
	if err := plain.WriteCSV(&c); err != nil {
		t.Fatal(err)
	}
	if err := plain.WriteYAML(&y); err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{plain.Grid(), c.String(), y.String()} {
		if strings.Contains(text, "placement") {
			t.Errorf("a loop schedule names its placement:\n%s", text)
		}
	}
	explicit, err := ParseGrid("placement: loop\n" + plain.Grid())
	if err != nil || explicit.Placement != Loop || !sameSchedule(explicit, plain) {
		t.Errorf("placement: loop: %v", err)
	}
}

func TestPlacementParseErrors(t *testing.T) {
	tests := []struct{ format, in, want string }{
		{"grid", "placement: w\nstage 0: 0F0 0B0", `line 1: unknown placement "w" (known: loop, v)`},
		{"grid", "placement: v\nplacement: v\nstage 0: 0F0 0B0", "line 2: a second placement line"},
		{"csv", "placement: x\n0F0,0B0\n", `csv line 1: unknown placement "x" (known: loop, v)`},
		{"csv", "placement: v\n0F0,0B0\nplacement: v\n", "csv line 3: a second placement row"},
		{"yaml", "placement: [v]\nstages: [[0F0, 0B0]]\n", "yaml line 1, column 12: want the placement's name (loop, v)"},
		{"yaml", "placement: u\nstages: [[0F0, 0B0]]\n", `yaml line 1, column 12: unknown placement "u" (known: loop, v)`},
	}
	for _, tt := range tests {
		s, err := Load(strings.NewReader(tt.in), tt.format)
		if err == nil || err.Error() != tt.want {
			t.Errorf("Load(%q, %s) = %v, %v\nwant error %s", tt.in, tt.format, s, err, tt.want)
		}
	}
}

// TestVLowered: at the turn of the V the last stage hands the activation and
// the gradient from one chunk to the other without a link (a send and a
// receive naming itself, which cost no transfer), no op crosses a ring, and
// a tied weight, whose halves stage 0 both holds, is summed there alone.
func TestVLowered(t *testing.T) {
	l, err := Lower(mustBuild(t, "zb-v", 3, 4, 2), AddSendRecv, AddReduceGrad, AddTiedSync(1))
	if err != nil {
		t.Fatal(err)
	}
	grid := l.Grid()
	for _, want := range []string{" 2F0 2F0>2 ", " 2F0c1<2 2F0c1 2F0c1>1 ", " 2I0c1 2I0c1>2 ", " 2I0<2 2I0 2I0>1 ", " 0T0\n"} {
		if !strings.Contains(grid, want) {
			t.Errorf("lowered zb-v lacks %q:\n%s", want, grid)
		}
	}
	for st, ops := range l.Ops {
		for _, o := range ops {
			if (o.isSend() || o.isRecv()) && (o.Peer-st > 1 || st-o.Peer > 1) {
				t.Errorf("stage %d: %v skips a stage", st, o)
			}
			if o.Kind == SyncTied && (st != 0 || o.Peer != -1) {
				t.Errorf("stage %d: %v: stage 0 holds both halves", st, o)
			}
		}
	}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	// With a transfer of 5, stage 2's chunk 1 starts micro-batch 0 right
	// where its chunk 0 ended it.
	tl, err := l.Simulate(UniformCosts(3, 1, 2, 5))
	if err != nil {
		t.Fatal(err)
	}
	var f0, f1 Span
	for _, sp := range tl.Spans[2] {
		switch sp.Action {
		case Action{Stage: 2, Kind: Forward}:
			f0 = sp
		case Action{Stage: 2, Kind: Forward, Chunk: 1}:
			f1 = sp
		}
	}
	if f1.Start != f0.End {
		t.Errorf("2F0c1 starts at %v, 2F0 ends at %v: the hand-off should be free", f1.Start, f0.End)
	}
	if want := 2 * (1.0/2 + 5); f0.Start != want {
		t.Errorf("2F0 starts at %v, want %v (two forwards and two transfers)", f0.Start, want)
	}
	bad := strings.Replace(grid, " 0T0\n", " 0T0~1\n", 1)
	if b, err := ParseLoweredGrid(bad); err == nil {
		if err := b.Check(); err == nil || !strings.Contains(err.Error(), "tied weights are both held by stage 0, which sums them alone") {
			t.Errorf("a tied exchange with stage 1: %v", err)
		}
	}
}

// TestVEvaluation: an evaluation pass under V sends each boundary's
// activation once (the turn's locally) and plays to the end.
func TestVEvaluation(t *testing.T) {
	for p := 1; p <= 8; p++ {
		tp := Topology{Stages: p, Chunks: 2, Placement: V}
		const batches = 5
		l := tp.LowerEvaluation(batches)
		sends, local, recvs := 0, 0, map[message]int{}
		for st, ops := range l.Ops {
			for _, o := range ops {
				switch {
				case o.isRecv():
					recvs[tp.message(o)]++
				case o.isSend():
					sends++
					if o.Peer == st {
						local++
					}
				}
			}
		}
		if want := (2*p - 1) * batches; sends != want || len(recvs) != want || local != batches {
			t.Fatalf("p%d: %d sends (%d local), %d messages received, want %d (%d local)", p, sends, local, len(recvs), want, batches)
		}
		if _, err := l.play(UniformCosts(p, 1, 1, 0.5)); err != nil {
			t.Fatalf("p%d: %v", p, err)
		}
	}
}

// TestZBVBeatsZBH1: with F = I = W, zb-v's idle time per stage is half a
// forward per stage the skew spans, (p-1)/2, against zb-h1's p-1 and 1F1B's
// 3(p-1); and no stage stashes more activations than 1F1B's first stage.
func TestZBVBeatsZBH1(t *testing.T) {
	for p := 2; p <= 8; p++ {
		for m := 2 * p; m <= 32; m++ {
			c := UniformCosts(p, 1, 2, 0)
			zv, err := Simulate(mustBuild(t, "zb-v", p, m, 2), c)
			if err != nil {
				t.Fatal(err)
			}
			zh, err := Simulate(mustBuild(t, "zb-h1", p, m, 1), c)
			if err != nil {
				t.Fatal(err)
			}
			if zh.Makespan-zv.Makespan != float64(p-1)/2 {
				t.Errorf("p=%d m=%d: zb-v makespan %v, zb-h1 %v", p, m, zv.Makespan, zh.Makespan)
			}
			// Chunks hold half a stage: 2p chunks are 1F1B's p micro-batches.
			if got := slices.Max(zv.PeakInFlight); got != 2*p || slices.Min(zv.PeakInFlight) != 2*p {
				t.Errorf("p=%d m=%d: zb-v peaks %v chunks, want %d on every stage", p, m, zv.PeakInFlight, 2*p)
			}
		}
	}
}

// TestZBVBelowMinimum: the sizes Build refuses are those where the
// construction cannot meet the bound: with m below 3p/2 (rounded down) its
// step is 3p-1-2m half-units longer than 3m + (p-1)/2.
func TestZBVBelowMinimum(t *testing.T) {
	for p := 2; p <= 16; p++ {
		for m := 1; m < 3*p/2; m++ {
			actions, err := perStage(zbVStage)(p, m, 2)
			if err != nil {
				t.Fatal(err)
			}
			s := &Schedule{Stages: p, MicroBatches: m, Chunks: 2, Placement: V, Actions: actions}
			tl, err := Simulate(s, UniformCosts(p, 1, 2, 0))
			if err != nil {
				t.Fatalf("p=%d m=%d: %v", p, m, err)
			}
			if bound := float64(3*m) + float64(p-1)/2; tl.Makespan != bound+float64(3*p-1-2*m)/2 {
				t.Errorf("p=%d m=%d: makespan %v, want the bound %v and %d half-units", p, m, tl.Makespan, bound, 3*p-1-2*m)
			}
			if _, err := Build("zb-v", p, m, 2); err == nil {
				t.Errorf("p=%d m=%d: Build accepts it", p, m)
			}
		}
	}
}

const goldenZBVGrid = `placement: v
stage 0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F0c1 0I0c1 0W0c1 0F1c1 0I1c1 0W1c1 0F2c1 0I2c1 0W2c1 0F3c1 0I3c1 0W3c1 0F7 0I0 0W0 0F4c1 0I4c1 0W4c1 0I1 0W1 0F5c1 0I5c1 0W5c1 0I2 0W2 0F6c1 0I6c1 0W6c1 0I3 0W3 0F7c1 0I7c1 0W7c1 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7
stage 1: 1F0 1F1 1F2 1F3 1F4 1F0c1 1F5 1F1c1 1I0c1 1W0c1 1F2c1 1I1c1 1W1c1 1F3c1 1I2c1 1W2c1 1F6 1I0 1W0 1F4c1 1I3c1 1W3c1 1F7 1I1 1W1 1F5c1 1I4c1 1W4c1 1I2 1W2 1F6c1 1I5c1 1W5c1 1I3 1W3 1F7c1 1I6c1 1W6c1 1I4 1I7c1 1I5 1W4 1I6 1W5 1I7 1W6 1W7c1 1W7
stage 2: 2F0 2F1 2F2 2F0c1 2F3 2F1c1 2F4 2F2c1 2I0c1 2W0c1 2F3c1 2I1c1 2W1c1 2F5 2I0 2W0 2F4c1 2I2c1 2W2c1 2F6 2I1 2W1 2F5c1 2I3c1 2W3c1 2F7 2I2 2W2 2F6c1 2I4c1 2W4c1 2I3 2W3 2F7c1 2I5c1 2W5c1 2I4 2I6c1 2I5 2I7c1 2I6 2W4 2I7 2W5 2W6c1 2W7c1 2W6 2W7
stage 3: 3F0 3F0c1 3F1 3F1c1 3F2 3F2c1 3F3 3F3c1 3I0c1 3W0c1 3F4 3I0 3W0 3F4c1 3I1c1 3W1c1 3F5 3I1 3W1 3F5c1 3I2c1 3W2c1 3F6 3I2 3W2 3F6c1 3I3c1 3W3c1 3F7 3I3 3W3 3F7c1 3I4c1 3W4c1 3I4 3I5c1 3I5 3I6c1 3I6 3I7c1 3I7 3W4 3W5c1 3W6c1 3W7c1 3W5 3W6 3W7
`

// With F = I = W = 1 per stage each chunk's pass takes half a unit: stage s
// works without a gap from s/2 to 24 + s/2 (a parallelogram), idle 1.5
// units of 25.5 (chunk 1's passes in lower case).
const goldenZBVText = `makespan 25.5, slot 0.5
         0         5         10        15        20        25
stage 0: FFFFFFFfiwfiwfiwfiwFIWfiwIWfiwIWfiwIWfiwIWIWIWIW...  bubble 5.9%
stage 1: .FFFFFfFfiwfiwfiwFIWfiwFIWfiwIWfiwIWfiwIiIWIWIWwW..  bubble 5.9%
stage 2: ..FFFfFfFfiwfiwFIWfiwFIWfiwFIWfiwIWfiwIiIiIWIWwwWW.  bubble 5.9%
stage 3: ...FfFfFfFfiwFIWfiwFIWfiwFIWfiwFIWfiwIiIiIiIWwwwWWW  bubble 5.9%
`

func TestGoldenZBV(t *testing.T) {
	s := mustBuild(t, "zb-v", 4, 8, 2)
	if got := s.Grid(); got != goldenZBVGrid {
		t.Errorf("Grid:\n%s\nwant:\n%s", got, goldenZBVGrid)
	}
	tl, err := Simulate(s, UniformCosts(4, 1, 2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := tl.Text(0.5); got != goldenZBVText {
		t.Errorf("Text:\n%s\nwant:\n%s", got, goldenZBVText)
	}
	if got, want := tl.Bubble[0], 3.0/51; math.Abs(got-want) > 1e-12 {
		t.Errorf("bubble %v, want %v", got, want)
	}
}

// TestChunkCosts: per-chunk costs replace the stage's v-th share chunk by
// chunk: halves of the stage's costs play exactly as the stage's costs do,
// uneven chunks make each stage as busy as its chunks add up to, and
// malformed entries are refused.
func TestChunkCosts(t *testing.T) {
	s := mustBuild(t, "zb-v", 3, 5, 2)
	even := UniformCosts(3, 1, 2, 0.25)
	even.Chunks = make([][]ChunkCost, 3)
	for st := range even.Chunks {
		even.Chunks[st] = []ChunkCost{{0.5, 1, 0.5, 0.5}, {0.5, 1, 0.5, 0.5}}
	}
	want, err := Simulate(s, UniformCosts(3, 1, 2, 0.25))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Simulate(s, even)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("halves: makespan %v, the stage's costs give %v", got.Makespan, want.Makespan)
	}
	uneven := even
	uneven.Chunks = [][]ChunkCost{{{1, 2, 1, 1}, {0.25, 0.5, 0.25, 0.25}}, {{0.5, 1, 0.5, 0.5}, {0.5, 1, 0.5, 0.5}}, {{0.1, 0.2, 0.1, 0.1}, {2, 4, 2, 2}}}
	tl, err := Simulate(s, uneven)
	if err != nil {
		t.Fatal(err)
	}
	for st, chunks := range uneven.Chunks {
		busy := 5 * (chunks[0].F + chunks[0].I + chunks[0].W + chunks[1].F + chunks[1].I + chunks[1].W)
		if math.Abs(tl.Busy[st]-busy) > 1e-9 {
			t.Errorf("stage %d busy %v, want %v", st, tl.Busy[st], busy)
		}
	}
	if tl.Makespan <= want.Makespan {
		t.Errorf("uneven chunks (stage 2's second three times a half) take %v, no longer than even ones' %v", tl.Makespan, want.Makespan)
	}
	for _, tc := range []struct {
		chunks [][]ChunkCost
		want   string
	}{
		{uneven.Chunks[:2], "costs have 2 per-chunk entries, want 3 (one per stage, or none)"},
		{[][]ChunkCost{uneven.Chunks[0], uneven.Chunks[1], uneven.Chunks[2][:1]}, "stage 2: costs have 1 per-chunk entries, want one per chunk, 2"},
		{[][]ChunkCost{uneven.Chunks[0], {{-1, 1, 1, 1}, {1, 1, 1, 1}}, uneven.Chunks[2]}, "stage 1 chunk 0: costs must be finite and >= 0"},
	} {
		bad := even
		bad.Chunks = tc.chunks
		if _, err := Simulate(s, bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Simulate: %v, want %q", err, tc.want)
		}
	}
}
