package schedule

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// uniform is a step in which every action of s took f times its cost.
func uniform(s *Schedule, f float64) StepVariation {
	v := make(StepVariation, s.Stages)
	for st, list := range s.Actions {
		v[st] = fill(len(list), f)
	}
	return v
}

func fill(n int, x float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = x
	}
	return out
}

// TestReplayAtTheCostsIsSimulate: steps whose actions took exactly their
// costs replay as Simulate's timeline, whatever the schedule.
func TestReplayAtTheCostsIsSimulate(t *testing.T) {
	for _, name := range []string{"gpipe", "1f1b", "zb-h1", "interleaved", "zb-v", "dualpipev"} {
		v := 1
		if name == "interleaved" || name == "zb-v" || name == "dualpipev" {
			v = 2
		}
		s := mustBuild(t, name, 4, 8, v)
		c := UniformCosts(4, 1, 2, 0.1)
		c.Gap = []float64{0.01, 0.02, 0.03, 0.04}
		tl, err := Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		for _, steps := range [][]StepVariation{{nil}, {uniform(s, 1), nil, uniform(s, 1)}} {
			r, err := Replay(s, c, steps)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r.Steps != len(steps) || math.Abs(r.Makespan-tl.Makespan) > 1e-9 {
				t.Errorf("%s: %d steps, makespan %v; want %d, Simulate's %v", name, r.Steps, r.Makespan, len(steps), tl.Makespan)
			}
			for st := range tl.Bubble {
				if math.Abs(r.Bubble[st]-tl.Bubble[st]) > 1e-9 || math.Abs(r.Busy[st]-tl.Busy[st]) > 1e-9 {
					t.Errorf("%s stage %d: bubble %v busy %v, Simulate %v and %v", name, st, r.Bubble[st], r.Busy[st], tl.Bubble[st], tl.Busy[st])
				}
			}
		}
	}
}

// TestReplayScalesEachStep: a step whose every action took twice its cost
// (free transfers) is Simulate's step stretched twice, with its bubble; the
// replay's makespan is the steps' mean.
func TestReplayScalesEachStep(t *testing.T) {
	s := mustBuild(t, "1f1b", 3, 6, 1)
	c := UniformCosts(3, 1, 2, 0)
	tl, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Replay(s, c, []StepVariation{uniform(s, 1), uniform(s, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.Makespan-1.5*tl.Makespan) > 1e-9 {
		t.Errorf("makespan %v, want 1.5 x %v", r.Makespan, tl.Makespan)
	}
	for st := range tl.Bubble {
		if math.Abs(r.Bubble[st]-tl.Bubble[st]) > 1e-9 {
			t.Errorf("stage %d: bubble %v, want %v", st, r.Bubble[st], tl.Bubble[st])
		}
	}
}

// TestVaryingActionsWidenTheBubble: actions that vary about their costs,
// differently on each stage, keep the stages' mean busy time but leave more
// idle than Simulate's timeline, as a stage waits for the slower of its
// neighbour's actions; a lone stage waits for no one and has no bubble
// whatever its actions take.
func TestVaryingActionsWidenTheBubble(t *testing.T) {
	for _, name := range []string{"gpipe", "1f1b", "zb-h1"} {
		s := mustBuild(t, name, 2, 8, 1)
		c := UniformCosts(2, 1, 2, 0)
		tl, err := Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Replay(s, c, alternating(s, 0.5, 1.5))
		if err != nil {
			t.Fatal(err)
		}
		for st := range tl.Bubble {
			if r.Bubble[st] <= tl.Bubble[st]+0.01 {
				t.Errorf("%s stage %d: bubble %.3f with variation, %.3f without", name, st, r.Bubble[st], tl.Bubble[st])
			}
			if math.Abs(r.Busy[st]-tl.Busy[st]) > 1e-9 {
				t.Errorf("%s stage %d: mean busy %.2f, %.2f without variation", name, st, r.Busy[st], tl.Busy[st])
			}
		}
	}
	s := mustBuild(t, "1f1b", 1, 8, 1)
	r, err := Replay(s, UniformCosts(1, 1, 2, 0), alternating(s, 0.5, 1.5))
	if err != nil {
		t.Fatal(err)
	}
	if r.Bubble[0] > 1e-9 {
		t.Errorf("one stage: bubble %v, want 0", r.Bubble[0])
	}
}

// alternating gives steps in which each action took lo or hi times its
// cost, drawn at random on every stage; each odd step is the one before it
// reversed (lo for hi), so that over the steps every action averages its
// cost.
func alternating(s *Schedule, lo, hi float64) []StepVariation {
	rng := rand.New(rand.NewPCG(1, 2))
	var steps []StepVariation
	for k := range 16 {
		v := make(StepVariation, s.Stages)
		for st, list := range s.Actions {
			v[st] = make([]float64, len(list))
			for i := range v[st] {
				switch {
				case k%2 == 1:
					v[st][i] = lo + hi - steps[k-1][st][i]
				case rng.IntN(2) == 0:
					v[st][i] = lo
				default:
					v[st][i] = hi
				}
			}
		}
		steps = append(steps, v)
	}
	return steps
}

func TestReplayRefusesBadInput(t *testing.T) {
	s := mustBuild(t, "1f1b", 2, 4, 1)
	c := UniformCosts(2, 1, 2, 0)
	for _, tc := range []struct {
		steps []StepVariation
		want  string
	}{
		{nil, "no steps"},
		{[]StepVariation{nil, {nil, nil, nil}}, "replay step 1: variation for 3 stages, the schedule has 2"},
		{[]StepVariation{{nil, fill(7, 1)}}, "replay step 0: stage 1: 7 factors, want one per action, 8"},
		{[]StepVariation{{append(fill(7, 1), -0.5)}}, "stage 0, action 7"},
		{[]StepVariation{{append(fill(7, 1), math.NaN())}}, "finite and >= 0, got NaN"},
		{[]StepVariation{{nil, append(fill(7, 1), math.Inf(1))}}, "stage 1"},
	} {
		_, err := Replay(s, c, tc.steps)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Replay(%v) = %v, want an error containing %q", tc.steps, err, tc.want)
		}
	}
	if _, err := Replay(s, UniformCosts(3, 1, 2, 0), []StepVariation{nil}); err == nil {
		t.Error("costs for 3 stages accepted for a 2-stage schedule")
	}
}
