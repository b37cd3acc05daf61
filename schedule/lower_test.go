package schedule

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// TestLowerBuiltins lowers every built-in schedule over p <= 8, m <= 32,
// v <= 4 and checks what the passes promise: the compute ops are the
// schedule's; every cross-model-stage tensor is sent once and received once,
// right around the compute that makes or needs it, with both ends agreeing on
// the peer and the wire tag (the rule the stage runtime uses: the chunk of the
// boundary's upstream model stage); one reduction per chunk, right after the
// chunk's last gradient op; Check passes; printing parses back; and the
// simulator gives the compute-only schedule's timeline exactly.
func TestLowerBuiltins(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, name := range Names() {
		for p := 1; p <= 8; p++ {
			for m := 1; m <= 32; m++ {
				for v := 1; v <= 4; v++ {
					if !allowed(name, p, m, v) {
						continue
					}
					s := mustBuild(t, name, p, m, v)
					l, err := Lower(s)
					if err != nil {
						t.Fatalf("%s p%d m%d v%d: %v", name, p, m, v, err)
					}
					what := fmt.Sprintf("%s p%d m%d v%d", name, p, m, v)
					checkLowered(t, what, s, l)
					costs := randomCosts(rng, p, s.SplitsBackward())
					want, err1 := Simulate(s, costs)
					got, err2 := l.Simulate(costs)
					if err1 != nil || err2 != nil {
						t.Fatalf("%s: simulate: %v, lowered: %v", what, err1, err2)
					}
					if !reflect.DeepEqual(want, got) {
						t.Fatalf("%s: the lowered schedule's timeline differs (makespan %v, want %v)", what, got.Makespan, want.Makespan)
					}
				}
			}
		}
	}
}

func randomCosts(rng *rand.Rand, p int, split bool) Costs {
	c := UniformCosts(p, 1, 2, rng.Float64())
	for st := range p {
		c.F[st], c.B[st] = 0.5+rng.Float64(), 1+2*rng.Float64()
	}
	if split {
		c.I, c.W = make([]float64, p), make([]float64, p)
		for st := range p {
			c.I[st], c.W[st] = c.B[st]*rng.Float64(), c.B[st]*rng.Float64()
		}
	}
	if rng.IntN(2) == 0 {
		c.Gap = make([]float64, p)
		for st := range p {
			c.Gap[st] = 0.3 * rng.Float64()
		}
	}
	return c
}

// placedModelStage restates the placements, independently of placement.go.
func placedModelStage(pl Placement, p int, a Action) int {
	if pl == V && a.Chunk%2 == 1 {
		return a.Chunk*p + p - 1 - a.Stage
	}
	return a.Chunk*p + a.Stage
}

func checkLowered(t *testing.T, what string, s *Schedule, l *Lowered) {
	t.Helper()
	if !sameSchedule(l.Compute(), s) {
		t.Fatalf("%s: the compute ops are not the schedule's", what)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("%s: Check: %v\n%s", what, err, l.Grid())
	}
	back, err := ParseLoweredGrid(l.Grid())
	if err != nil || !reflect.DeepEqual(back.Ops, l.Ops) {
		t.Fatalf("%s: the printed grid does not parse back (%v)", what, err)
	}
	p, v := l.Stages, l.Chunks
	sends, recvs := map[string]int{}, map[string]int{}
	for st, ops := range l.Ops {
		lastGrad := map[int]int{}
		for j, o := range ops {
			switch o.Kind {
			case Compute:
				ms := placedModelStage(s.Placement, p, o.Action)
				needsRecv := o.Action.Kind == Forward && ms > 0 || (o.Action.Kind == Backward || o.Action.Kind == Input) && ms < p*v-1
				if needsRecv && (j == 0 || !ops[j-1].isRecv() || ops[j-1].Action != o.Action) {
					t.Fatalf("%s: stage %d: %v is not right after its receive", what, st, o)
				}
				owesSend := o.Action.Kind == Forward && ms < p*v-1 || (o.Action.Kind == Backward || o.Action.Kind == Input) && ms > 0
				if owesSend && (j+1 == len(ops) || !ops[j+1].isSend() || ops[j+1].Action != o.Action) {
					t.Fatalf("%s: stage %d: %v is not right before its send", what, st, o)
				}
				if o.Action.Kind == Backward || o.Action.Kind == Weight {
					lastGrad[o.Action.Chunk] = j
					if owesSend {
						lastGrad[o.Action.Chunk] = j + 1
					}
				}
			case RecvAct, RecvGrad, SendAct, SendGrad:
				// The runtime's rule for the tag: a stage's chunk c, on its
				// upstream boundary, is tagged c, but under Loop stage 0 (fed
				// over the ring by the last stage) tags it c-1, and under V
				// the last stage's chunk 1 (fed by its own chunk 0) tags it 0.
				up := o.Kind == RecvAct || o.Kind == SendGrad
				want := o.Action.Chunk
				switch {
				case up && s.Placement == Loop && st == 0:
					want = o.Action.Chunk - 1
				case up && s.Placement == V && st == p-1 && o.Action.Chunk == 1:
					want = 0
				}
				tag := l.Topology().Tag(o)
				if tag != want {
					t.Fatalf("%s: %v has tag %d, the runtime uses %d", what, o, tag, want)
				}
				if s.Placement == Loop && o.Tag(p) != tag {
					t.Fatalf("%s: %v: Op.Tag %d, Topology.Tag %d", what, o, o.Tag(p), tag)
				}
				from, to := st, o.Peer
				if o.isRecv() {
					from, to = o.Peer, st
				}
				key := fmt.Sprintf("grad=%v mb%d %d->%d tag%d", o.Kind == SendGrad || o.Kind == RecvGrad, o.Action.MicroBatch, from, to, tag)
				if o.isSend() {
					sends[key]++
				} else {
					recvs[key]++
				}
			case ReduceGrad:
				if at, ok := lastGrad[o.Action.Chunk]; !ok || at != j-1 && !(ops[j-1].Kind == ReduceGrad) {
					t.Fatalf("%s: stage %d: %v at %d is not right after chunk %d's last gradient op (%d)", what, st, o, j, o.Action.Chunk, at)
				}
			}
		}
	}
	boundaries := (p*v - 1) * l.MicroBatches * 2
	n := 0
	for k, c := range sends {
		if c != 1 || recvs[k] != 1 {
			t.Fatalf("%s: message %s sent %d times, received %d times", what, k, c, recvs[k])
		}
		n++
	}
	if n != boundaries || len(recvs) != boundaries {
		t.Fatalf("%s: %d messages sent, %d received, want %d", what, n, len(recvs), boundaries)
	}
	reductions := 0
	for _, ops := range l.Ops {
		for _, o := range ops {
			if o.Kind == ReduceGrad {
				reductions++
			}
		}
	}
	if reductions != p*v {
		t.Fatalf("%s: %d reductions, want one per stage and chunk (%d)", what, reductions, p*v)
	}
}

// TestGoldenLowered1F1B pins the lowered form of a small 1F1B.
func TestGoldenLowered1F1B(t *testing.T) {
	l, err := Lower(mustBuild(t, "1f1b", 2, 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	want := `stage 0: 0F0 0F0>1 0F1 0F1>1 0B0<1 0B0 0F2 0F2>1 0B1<1 0B1 0B2<1 0B2 0R
stage 1: 1F0<0 1F0 1B0 1B0>0 1F1<0 1F1 1B1 1B1>0 1F2<0 1F2 1B2 1B2>0 1R
`
	if got := l.Grid(); got != want {
		t.Errorf("lowered 1f1b p2 m3:\n%s\nwant:\n%s", got, want)
	}
}

// TestGoldenLoweredInterleaved pins a lowered interleaved schedule, where the
// last stage's chunk 0 feeds stage 0's chunk 1 over the ring (tag 0).
func TestGoldenLoweredInterleaved(t *testing.T) {
	l, err := Lower(mustBuild(t, "interleaved", 2, 2, 2))
	if err != nil {
		t.Fatal(err)
	}
	got := l.Grid()
	for _, want := range []string{"stage 0: 0F0 0F0>1 0F1 0F1>1 0F0c1<1 0F0c1 0F0c1>1", "1F0>0", "0Rc1"} {
		if !strings.Contains(got, want) {
			t.Errorf("lowered interleaved p2 m2 v2 lacks %q:\n%s", want, got)
		}
	}
}

func TestParseOpRoundTrip(t *testing.T) {
	for _, s := range []string{"2F0", "2F0c1", "2F0<1", "2F0c1>3", "0B3<1", "1I2>0", "3R", "3Rc2", "0W1"} {
		o, err := ParseOp(s)
		if err != nil || o.String() != s {
			t.Errorf("ParseOp(%q) = %v, %v", s, o, err)
		}
	}
	for _, s := range []string{"2W0<1", "2F0<", "2F0<x", "2R3", "2Rc", "F0", "2F0>1>2"} {
		if o, err := ParseOp(s); err == nil {
			t.Errorf("ParseOp(%q) = %v, want an error", s, o)
		}
	}
}

// TestLoweredCheckRejects edits a correct lowered schedule in the ways a
// hand-written one goes wrong: each must be refused, naming what is wrong.
func TestLoweredCheckRejects(t *testing.T) {
	good := `stage 0: 0F0 0F0>1 0F1 0F1>1 0B0<1 0B0 0B1<1 0B1 0R
stage 1: 1F0<0 1F0 1B0 1B0>0 1F1<0 1F1 1B1 1B1>0 1R
`
	l, err := ParseLoweredGrid(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err != nil {
		t.Fatalf("the correct schedule is refused: %v", err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"missing receive", "1F1<0 1F1", "1F1", "needs exactly one recv activation before it"},
		{"missing send", "0F1 0F1>1", "0F1", "needs exactly one send activation after it"},
		{"wrong peer", "1B0>0", "1B0>1", "the other end is stage 0, not 1"},
		{"send of nothing", "0B1 0R", "0B1 0B1>1 0R", "carries nothing of this kind"},
		{"reduction too early", "0B0 0B1<1 0B1 0R", "0B0 0R 0B1<1 0B1", "still adds to chunk 0's gradients"},
		{"two reductions", "1B1>0 1R", "1B1>0 1R 1R", "reduced twice"},
	} {
		text := strings.Replace(good, tc.from, tc.to, 1)
		if text == good {
			t.Fatalf("%s: the edit did not apply", tc.name)
		}
		l, err := ParseLoweredGrid(text)
		if err == nil {
			err = l.Check()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	// The compute order is sound, but stage 1 takes micro-batch 1's
	// activation before sending micro-batch 0's gradient, which stage 0
	// waits for before it sends that activation: only the lowered form shows
	// the deadlock.
	dead, err := ParseLoweredGrid(`stage 0: 0F0 0F0>1 0B0<1 0B0 0F1 0F1>1 0B1<1 0B1 0R
stage 1: 1F0<0 1F0 1F1<0 1B0 1B0>0 1F1 1B1 1B1>0 1R
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Compute().Check(); err != nil {
		t.Fatalf("the compute-only order should pass: %v", err)
	}
	if err := dead.Check(); err == nil || !strings.Contains(err.Error(), "deadlock: stage 0 waits at 0B0<1; stage 1 waits at 1F1<0") {
		t.Errorf("deadlock: got %v", err)
	}
}

// TestLowerEvaluation: every activation an evaluation pass sends is received
// once, with the tags training uses, and the pass plays to the end.
func TestLowerEvaluation(t *testing.T) {
	for p := 1; p <= 8; p++ {
		for v := 1; v <= 4; v++ {
			if v > 1 && p < 2 {
				continue
			}
			const batches = 5
			l := LowerEvaluation(p, batches, v)
			sends, recvs := 0, map[message]int{}
			for _, ops := range l.Ops {
				for _, o := range ops {
					switch {
					case o.isRecv():
						recvs[o.message(p)]++
					case o.isSend():
						sends++
					}
				}
			}
			if want := (p*v - 1) * batches; sends != want || len(recvs) != want {
				t.Fatalf("p%d v%d: %d sends, %d messages received, want %d", p, v, sends, len(recvs), want)
			}
			if _, err := l.play(UniformCosts(p, 1, 1, 0.5)); err != nil {
				t.Fatalf("p%d v%d: %v", p, v, err)
			}
		}
	}
	if got, want := LowerEvaluation(2, 2, 2).Grid(), "stage 0: 0F0 0F0>1 0F0c1<1 0F0c1 0F0c1>1 0F1 0F1>1 0F1c1<1 0F1c1 0F1c1>1\nstage 1: 1F0<0 1F0 1F0>0 1F0c1<0 1F0c1 1F1<0 1F1 1F1>0 1F1c1<0 1F1c1\n"; got != want {
		t.Errorf("evaluation p2 m2 v2:\n%s\nwant:\n%s", got, want)
	}
}

// TestAddTiedSync: a tied weight's exchange ends the lists of stage 0 and the
// last stage, each naming the other (locally on one stage), checks, parses
// back, and plays; one side alone, or a wrong peer, is refused.
func TestAddTiedSync(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p, m, v int
		want    []string
	}{
		{"1f1b", 4, 4, 1, []string{"0R 0T0~3 0T1~3\n", "3R 3T0~0 3T1~0\n"}},
		{"interleaved", 2, 2, 2, []string{"0T0~1 0T1~1\n", "1T0~0 1T1~0\n"}},
		{"1f1b", 1, 2, 1, []string{"0R 0T0 0T1\n"}},
	} {
		s := mustBuild(t, tc.name, tc.p, tc.m, tc.v)
		l, err := Lower(s, AddSendRecv, AddReduceGrad, AddTiedSync(2))
		if err != nil {
			t.Fatal(err)
		}
		grid := l.Grid()
		for _, w := range tc.want {
			if !strings.Contains(grid, w) {
				t.Errorf("%s p%d: lacks %q:\n%s", tc.name, tc.p, w, grid)
			}
		}
		if err := l.Check(); err != nil {
			t.Errorf("%s p%d: %v", tc.name, tc.p, err)
		}
		back, err := ParseLoweredGrid(grid)
		if err != nil || !reflect.DeepEqual(back.Ops, l.Ops) {
			t.Errorf("%s p%d: does not parse back: %v", tc.name, tc.p, err)
		}
		if _, err := l.Simulate(UniformCosts(tc.p, 1, 2, 0.5)); err != nil {
			t.Errorf("%s p%d: %v", tc.name, tc.p, err)
		}
		if o := (Op{Kind: SyncTied, Index: 1}); o.TiedTag(tc.v) != tc.v {
			t.Errorf("tied weight 1's tag with %d chunks: %d", tc.v, o.TiedTag(tc.v))
		}
	}
	l, err := Lower(mustBuild(t, "1f1b", 4, 4, 1), AddSendRecv, AddTiedSync(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ from, to, want string }{
		{" 3T0~0", "", "stage 0 exchanges tied weight 0's gradient, but stage 3 does not"},
		{" 0T0~3", " 0T0~2", "tied weights are held by stages 0 and 3"},
	} {
		text := strings.Replace(l.Grid(), tc.from, tc.to, 1)
		bad, err := ParseLoweredGrid(text)
		if err == nil {
			err = bad.Check()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q -> %q: got %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
	for _, s := range []string{"0T0~3", "0T1"} {
		if o, err := ParseOp(s); err != nil || o.String() != s {
			t.Errorf("ParseOp(%q) = %v, %v", s, o, err)
		}
	}
}

// TestCheckDepth: links hold 2·depth messages not yet received. A stage that
// receives micro-batch 3's activation before micro-batch 0's needs room for
// four on its link: refused with depth 1, accepted with depth 2. Every
// built-in schedule needs no more than depth 1.
func TestCheckDepth(t *testing.T) {
	l, err := Lower(mustBuild(t, "gpipe", 2, 4, 1))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(l.Grid(), "stage 1: 1F0<0", "stage 1: 1F3<0 1F0<0", 1)
	text = strings.Replace(text, "1F2 1F3<0 1F3", "1F2 1F3", 1)
	early, err := ParseLoweredGrid(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := early.Check(); err != nil {
		t.Fatalf("unbounded links: %v\n%s", err, text)
	}
	if err := early.CheckDepth(2); err != nil {
		t.Errorf("depth 2: %v", err)
	}
	if err := early.CheckDepth(1); err == nil || !strings.Contains(err.Error(), "deadlock: stage 0 waits at 0F2>1; stage 1 waits at 1F3<0") {
		t.Errorf("depth 1: got %v", err)
	}
	for _, name := range Names() {
		for p := 1; p <= 8; p++ {
			for m := 1; m <= 32; m++ {
				for v := 1; v <= 4; v++ {
					if !allowed(name, p, m, v) {
						continue
					}
					l, err := Lower(mustBuild(t, name, p, m, v))
					if err == nil {
						err = l.CheckDepth(1)
					}
					if err != nil {
						t.Fatalf("%s p%d m%d v%d with depth 1: %v", name, p, m, v, err)
					}
				}
			}
		}
	}
}

// TestAddClipNorm: the gradient clipping ends every stage's list, after its
// reductions and tied weights' exchanges, checks, parses back and plays as a
// barrier: the stages wait for the last to arrive, then for the parts to
// travel down the pipeline and the total back. A stage without it, one with
// it twice, or one whose clipping precedes a backward is refused.
func TestAddClipNorm(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p, m, v int
	}{{"1f1b", 4, 4, 1}, {"interleaved", 2, 4, 2}, {"zb-v", 2, 4, 2}, {"1f1b", 1, 2, 1}} {
		l, err := Lower(mustBuild(t, tc.name, tc.p, tc.m, tc.v), AddSendRecv, AddReduceGrad, AddTiedSync(1), AddClipNorm)
		if err != nil {
			t.Fatal(err)
		}
		for st, ops := range l.Ops {
			if last := ops[len(ops)-1]; last.Kind != ClipNorm || last.String() != fmt.Sprintf("%dN", st) {
				t.Errorf("%s p%d: stage %d ends with %v, want %dN", tc.name, tc.p, st, last, st)
			}
		}
		if err := l.Check(); err != nil {
			t.Errorf("%s p%d: %v", tc.name, tc.p, err)
		}
		back, err := ParseLoweredGrid(l.Grid())
		if err != nil || !reflect.DeepEqual(back.Ops, l.Ops) {
			t.Errorf("%s p%d: does not parse back: %v", tc.name, tc.p, err)
		}
	}

	l, err := Lower(mustBuild(t, "1f1b", 2, 1, 1), AddSendRecv, AddClipNorm)
	if err != nil {
		t.Fatal(err)
	}
	// F = 1, B = 2, transfer 0.5: stage 1 is done at 4.5, stage 0 at 7;
	// the part goes down and the total back up: 7 + 2·0.5.
	tl, err := l.Simulate(UniformCosts(2, 1, 2, 0.5))
	if err != nil {
		t.Fatal(err)
	}
	if tl.Makespan != 8 {
		t.Errorf("makespan %v, want 8", tl.Makespan)
	}
	for _, tc := range []struct{ from, to, want string }{
		{" 1N", "", "1 of the 2 stages clip the gradient norm"},
		{" 1N", " 1N 1N", "appears twice"},
		{"1B0 ", "1N 1B0 ", "comes before 1B0"},
	} {
		text := strings.Replace(l.Grid(), tc.from, tc.to, 1)
		bad, err := ParseLoweredGrid(text)
		if err == nil {
			err = bad.Check()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q -> %q: got %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
}
