package schedule

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// TestCoresTwoBusyStagesOnOneCore: two stages that compute all the time on
// one core each progress at half speed, so every action takes twice its
// cost, and they end together.
func TestCoresTwoBusyStagesOnOneCore(t *testing.T) {
	work := [][]float64{{1, 3, 0.5}, {1, 3, 0.5}}
	g := OneGroup(2, 1, 1)
	free := []float64{0, 0}
	n := []int{0, 0}
	var got [][2]float64
	g.share(2, func(st int) (float64, float64, bool, bool) {
		if n[st] == len(work[st]) {
			return 0, 0, false, false
		}
		return free[st], work[st][n[st]], true, false
	}, func(st int, start, end, busy float64) {
		if busy != end-start {
			t.Errorf("stage %d: busy %v, want the span %v", st, busy, end-start)
		}
		got = append(got, [2]float64{start, end})
		free[st] = end
		n[st]++
	})
	want := [][2]float64{{0, 2}, {0, 2}, {2, 8}, {2, 8}, {8, 9}, {8, 9}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("spans %v, want each action twice its cost: %v", got, want)
	}
}

// TestCoresDemandOfThreads: a lone stage whose process runs 2 BLAS threads
// on 1 core computes at half speed: the step is twice as long; on 2 cores
// it is unchanged.
func TestCoresDemandOfThreads(t *testing.T) {
	s := mustBuild(t, "1f1b", 1, 3, 1)
	c := UniformCosts(1, 1, 2, 0)
	bare, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct{ cores, slow float64 }{{1, 2}, {2, 1}, {4, 1}} {
		c.Cores = OneGroup(1, k.cores, 2)
		tl, err := Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		if tl.Makespan != k.slow*bare.Makespan || tl.Busy[0] != k.slow*bare.Busy[0] {
			t.Errorf("2 threads on %v cores: makespan %v busy %v, want %vx %v and %v", k.cores, tl.Makespan, tl.Busy[0], k.slow, bare.Makespan, bare.Busy[0])
		}
	}
}

// TestCoresGPipeByHand: GPipe on 2 stages, 2 micro-batches, F=1, B=2,
// transfer 0.5, both stages on one core. Worked by hand:
//
//	0F0 [0,1] alone. 0F1 starts at 1, alone until 1F0 starts at 1.5 (half
//	done), then both at half speed: 0F1 ends at 2.5, when 1F0 has half
//	left, which it does alone by 3. 1F1 (input at 2.5+0.5) [3,4], 1B0
//	[4,6] alone. 1B1 starts at 6, alone until 0B0's gradient arrives at
//	6.5 (1.5 left), then both at half speed: 1B1 ends at 9.5, when 0B0
//	has 0.5 left, done alone by 10. 0B1 (gradient at 9.5+0.5) [10,12].
//
// Without sharing the step is 10; charging every action 2x (the uniform
// charge) would make it 20.
func TestCoresGPipeByHand(t *testing.T) {
	s := mustBuild(t, "gpipe", 2, 2, 1)
	c := UniformCosts(2, 1, 2, 0.5)
	c.Cores = OneGroup(2, 1, 1)
	tl, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	want := [][][2]float64{
		{{0, 1}, {1, 2.5}, {6.5, 10}, {10, 12}},
		{{1.5, 3}, {3, 4}, {4, 6}, {6, 9.5}},
	}
	for st, spans := range tl.Spans {
		for k, sp := range spans {
			if sp.Start != want[st][k][0] || sp.End != want[st][k][1] {
				t.Errorf("stage %d %v: [%v, %v], want %v", st, sp.Action, sp.Start, sp.End, want[st][k])
			}
		}
	}
	if tl.Makespan != 12 || tl.Busy[0] != 8 || tl.Busy[1] != 8 || math.Abs(tl.Bubble[0]-1.0/3) > 1e-15 {
		t.Errorf("makespan %v busy %v bubble %v, want 12, [8 8], 1/3 each", tl.Makespan, tl.Busy, tl.Bubble)
	}
	l, err := Lower(s, AddSendRecv)
	if err != nil {
		t.Fatal(err)
	}
	low, err := l.Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(low.Spans, tl.Spans) || low.Makespan != tl.Makespan {
		t.Errorf("lowered: %v, makespan %v; want the schedule's %v, %v", low.Spans, low.Makespan, tl.Spans, tl.Makespan)
	}
}

// coreCases are schedules of every kind with costs that exercise each
// part of Costs: unequal stages, split backward, transfers, hand-offs,
// chunks' own costs and all-reduces.
func coreCases(t *testing.T) []struct {
	what string
	s    *Schedule
	c    Costs
} {
	t.Helper()
	var out []struct {
		what string
		s    *Schedule
		c    Costs
	}
	for _, name := range Names() {
		p, m, v := 4, 8, 1
		switch name {
		case "interleaved", "interleaved-zb", "zb-v", "dualpipev":
			v = 2
		}
		s := mustBuild(t, name, p, m, v)
		c := Costs{F: []float64{1, 3, 0.5, 2}, B: []float64{2, 1, 4, 2.5}, I: []float64{1.5, 0.25, 1, 2}, W: []float64{0.5, 1, 3, 0.5},
			Transfer: 0.3, Gap: []float64{0.01, 0, 0.05, 0.02}, AllReduce: make([][]float64, p)}
		for st := range p {
			for ch := range v {
				c.AllReduce[st] = append(c.AllReduce[st], 0.7+float64(st+ch)/10)
			}
		}
		if v > 1 {
			c.Chunks = make([][]ChunkCost, p)
			for st := range p {
				for ch := range v {
					k := float64(ch+1) / 2
					c.Chunks[st] = append(c.Chunks[st], ChunkCost{F: k * c.F[st], B: k * c.B[st], I: k * c.I[st], W: k * c.W[st]})
				}
			}
		}
		out = append(out, struct {
			what string
			s    *Schedule
			c    Costs
		}{fmt.Sprintf("%s p=%d m=%d v=%d", name, p, m, v), s, c})
	}
	return out
}

// TestCoresEnoughChangeNothing: the zero value, stages in no group, and
// groups with a core for every demand give exactly, bit for bit, the
// timeline of costs without groups, for every schedule, lowered too, and
// Replay's figures with varying actions.
func TestCoresEnoughChangeNothing(t *testing.T) {
	for _, k := range coreCases(t) {
		p := k.s.Stages
		own := CoreGroups{Group: make([]int, p), Cores: make([]float64, p)}
		none := CoreGroups{Group: make([]int, p)}
		for st := range p {
			own.Group[st], own.Cores[st], none.Group[st] = st, 1, -1
		}
		groups := map[string]CoreGroups{
			"zero value":                    {},
			"each stage in no group":        none,
			"each stage its own core":       own,
			"4 stages on 4 cores":           OneGroup(p, float64(p), 1),
			"4 stages of 2 threads, 9 core": OneGroup(p, 9, 2),
		}
		bare, err := Simulate(k.s, k.c)
		if err != nil {
			t.Fatalf("%s: %v", k.what, err)
		}
		l, err := Lower(k.s, AddSendRecv, AddReduceGrad)
		if err != nil {
			t.Fatalf("%s: %v", k.what, err)
		}
		lowBare, err := l.Simulate(k.c)
		if err != nil {
			t.Fatalf("%s lowered: %v", k.what, err)
		}
		steps := []StepVariation{uniform(k.s, 1.5), nil, uniform(k.s, 0.75)}
		steps[0][1][2] = 3
		repBare, err := Replay(k.s, k.c, steps)
		if err != nil {
			t.Fatalf("%s: %v", k.what, err)
		}
		for what, g := range groups {
			c := k.c
			c.Cores = g
			tl, err := Simulate(k.s, c)
			if err != nil {
				t.Fatalf("%s, %s: %v", k.what, what, err)
			}
			if !reflect.DeepEqual(tl, bare) {
				t.Errorf("%s, %s: the timeline differs from the one without groups:\n%+v\nwant\n%+v", k.what, what, tl, bare)
			}
			low, err := l.Simulate(c)
			if err != nil {
				t.Fatalf("%s, %s lowered: %v", k.what, what, err)
			}
			if !reflect.DeepEqual(low, lowBare) {
				t.Errorf("%s, %s: the lowered timeline differs from the one without groups", k.what, what)
			}
			rep, err := Replay(k.s, c, steps)
			if err != nil {
				t.Fatalf("%s, %s: %v", k.what, what, err)
			}
			if !reflect.DeepEqual(rep, repBare) {
				t.Errorf("%s, %s: Replay gives %+v, without groups %+v", k.what, what, rep, repBare)
			}
		}
	}
}

// TestCoresBracketed: with fewer cores than stages, each schedule's step
// lies between the step without sharing and the step with every action
// charged stages/cores times its cost (each action's speed under sharing
// is at least cores/stages, and a longer action never shortens the step),
// and no shorter than the work the cores must do; each action lasts from
// its cost to stages/cores times it; and the lowered schedule's timeline is
// the schedule's.
func TestCoresBracketed(t *testing.T) {
	for _, k := range coreCases(t) {
		p := k.s.Stages
		k.c.AllReduce = nil
		bare, err := Simulate(k.s, k.c)
		if err != nil {
			t.Fatal(err)
		}
		for _, cores := range []float64{1, 2, 3} {
			slow := float64(p) / cores
			charged := k.c
			charged.F, charged.B, charged.I, charged.W = scaled(k.c.F, slow), scaled(k.c.B, slow), scaled(k.c.I, slow), scaled(k.c.W, slow)
			if k.c.Chunks != nil {
				charged.Chunks = make([][]ChunkCost, p)
				for st, chunks := range k.c.Chunks {
					for _, x := range chunks {
						charged.Chunks[st] = append(charged.Chunks[st], ChunkCost{F: slow * x.F, B: slow * x.B, I: slow * x.I, W: slow * x.W})
					}
				}
			}
			upper, err := Simulate(k.s, charged)
			if err != nil {
				t.Fatal(err)
			}
			c := k.c
			c.Cores = OneGroup(p, cores, 1)
			tl, err := Simulate(k.s, c)
			if err != nil {
				t.Fatalf("%s on %v cores: %v", k.what, cores, err)
			}
			var work float64
			for _, b := range bare.Busy {
				work += b
			}
			lo := max(bare.Makespan, work/cores)
			if tl.Makespan < lo*(1-1e-12) || tl.Makespan > upper.Makespan*(1+1e-12) {
				t.Errorf("%s on %v cores: step %v, want within [%v (no sharing %v, work/cores %v), %v (uniform charge)]",
					k.what, cores, tl.Makespan, lo, bare.Makespan, work/cores, upper.Makespan)
			}
			for st, spans := range tl.Spans {
				var busy float64
				for i, sp := range spans {
					d, alone := sp.End-sp.Start, bare.Spans[st][i].End-bare.Spans[st][i].Start
					if sp.Action != bare.Spans[st][i].Action || d < alone*(1-1e-12)-1e-12 || d > slow*alone*(1+1e-12)+1e-12 {
						t.Errorf("%s on %v cores: %v lasts %v, want within [%v, %v]", k.what, cores, sp.Action, d, alone, slow*alone)
					}
					busy += d
				}
				if math.Abs(busy-tl.Busy[st]) > 1e-9 {
					t.Errorf("%s on %v cores: stage %d busy %v, its spans add to %v", k.what, cores, st, tl.Busy[st], busy)
				}
			}
			l, err := Lower(k.s, AddSendRecv)
			if err != nil {
				t.Fatal(err)
			}
			low, err := l.Simulate(c)
			if err != nil {
				t.Fatal(err)
			}
			for st := range tl.Spans {
				for i, sp := range tl.Spans[st] {
					if got := low.Spans[st][i]; got.Action != sp.Action || math.Abs(got.Start-sp.Start) > 1e-9 || math.Abs(got.End-sp.End) > 1e-9 {
						t.Errorf("%s on %v cores, stage %d: lowered %+v, the schedule's %+v", k.what, cores, st, got, sp)
					}
				}
			}
		}
	}
}

func scaled(xs []float64, k float64) []float64 {
	if xs == nil {
		return nil
	}
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = k * x
	}
	return out
}

func TestCoresErrors(t *testing.T) {
	s := mustBuild(t, "1f1b", 2, 2, 1)
	for _, k := range []struct {
		g    CoreGroups
		want string
	}{
		{CoreGroups{Group: []int{0}, Cores: []float64{1}}, "name 1 stages' groups, want 2"},
		{CoreGroups{Group: []int{0, 1}, Cores: []float64{1}}, "stage 1: core group 1"},
		{CoreGroups{Group: []int{0, -2}, Cores: []float64{1}}, "stage 1: core group -2"},
		{CoreGroups{Group: []int{0, 0}, Cores: []float64{0}}, "core group 0: cores must be finite and > 0, got 0"},
		{CoreGroups{Group: []int{0, 0}, Cores: []float64{math.Inf(1)}}, "core group 0: cores must be finite"},
		{CoreGroups{Group: []int{0, 0}, Cores: []float64{1}, Demand: []float64{1}}, "1 stages' demands, want 2"},
		{CoreGroups{Group: []int{0, 0}, Cores: []float64{1}, Demand: []float64{1, math.NaN()}}, "stage 1: core demand must be finite and > 0, got NaN"},
		{CoreGroups{Cores: []float64{1}}, "no stage's group"},
	} {
		c := UniformCosts(2, 1, 2, 0)
		c.Cores = k.g
		if _, err := Simulate(s, c); err == nil || !strings.Contains(err.Error(), k.want) {
			t.Errorf("%+v: error %v, want one saying %q", k.g, err, k.want)
		}
	}
}
