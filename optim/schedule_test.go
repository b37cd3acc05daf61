package optim

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// TestSchedulesMatchPyTorch holds every kind of schedule, with and without
// warmup, against torch.optim.lr_scheduler's own schedulers (LinearLR's
// warmup, then CosineAnnealingLR, LinearLR or StepLR through SequentialLR),
// the rate of every step of the run. Torch updates its rates by recurrences
// (each from the last), pipetrain computes each from the step, so the two
// agree to float64 rounding, not bit for bit.
func TestSchedulesMatchPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	const lr, steps = 0.003, 60
	for _, s := range []Schedule{
		{Kind: "constant"},
		{Kind: "constant", WarmupSteps: 5},
		{Kind: "cosine"},
		{Kind: "cosine", WarmupSteps: 10, MinLR: 3e-4},
		{Kind: "cosine", WarmupSteps: 7, MinLR: 1e-4, DecaySteps: 50},
		{Kind: "linear", WarmupSteps: 4},
		{Kind: "linear", WarmupSteps: 1, MinLR: 1e-3, DecaySteps: 45},
		{Kind: "step", StepSize: 7, Gamma: 0.5},
		{Kind: "step", WarmupSteps: 3, StepSize: 10, Gamma: 0.1},
	} {
		t.Run(fmt.Sprintf("%+v", s), func(t *testing.T) {
			if p := s.Check(lr, steps); p != nil {
				t.Fatalf("Check: %v", p)
			}
			s := s.Resolve(steps)
			in := map[string]any{"kind": s.Kind, "lr": lr, "warmup_steps": s.WarmupSteps, "min_lr": s.MinLR,
				"decay_steps": s.DecaySteps, "step_size": s.StepSize, "gamma": s.Gamma, "steps": steps}
			// Past decay_steps torch's cosine climbs again and pipetrain's
			// holds min_lr: torch is compared up to decay_steps.
			if s.decays() {
				in["steps"] = s.DecaySteps
			}
			var want []float64
			testenv.RunPythonJSON(t, filepath.Join("testdata", "torch_schedule.py"), in, &want)
			for step, w := range want {
				if got := s.LR(lr, int64(step)); math.Abs(got-w) > 1e-12*lr {
					t.Errorf("step %d: lr %.17g, PyTorch %.17g", step, got, w)
				}
			}
			for step := len(want); step < steps; step++ {
				if got := s.LR(lr, int64(step)); got != s.MinLR {
					t.Errorf("step %d, past decay_steps %d: lr %v, want min_lr %v", step, s.DecaySteps, got, s.MinLR)
				}
			}
		})
	}
}

// TestScheduleWarmupAndEnds: the warmup climbs from lr/(W+1) to lr, cosine
// and linear start at lr right after it and end at min_lr at decay_steps,
// and an unset kind leaves the rate alone.
func TestScheduleWarmupAndEnds(t *testing.T) {
	const lr = 0.5
	s := Schedule{Kind: "cosine", WarmupSteps: 3, MinLR: 0.125}.Resolve(11)
	for step, want := range map[int64]float64{0: 0.125, 1: 0.25, 2: 0.375, 3: 0.5, 11: 0.125, 100: 0.125} {
		if got := s.LR(lr, step); got != want {
			t.Errorf("cosine, step %d: %v, want %v", step, got, want)
		}
	}
	if got := (Schedule{Kind: "linear", MinLR: 0.25, DecaySteps: 4}).LR(lr, 2); got != 0.375 {
		t.Errorf("linear halfway: %v, want 0.375", got)
	}
	for _, s := range []Schedule{{}, {Kind: "constant"}} {
		if !s.Constant() || s.LR(lr, 7) != lr {
			t.Errorf("%+v: Constant() %v, LR %v; want the optimizer's lr at every step", s, s.Constant(), s.LR(lr, 7))
		}
	}
}

// TestScheduleCheckNamesTheField: every refused setting is reported under
// its own key, with the value or the rule it breaks.
func TestScheduleCheckNamesTheField(t *testing.T) {
	for _, c := range []struct {
		s            Schedule
		field, words string
	}{
		{Schedule{Kind: "exponential"}, "kind", `unknown learning-rate schedule "exponential" (known: constant, cosine, linear, step)`},
		{Schedule{Kind: "cosine", WarmupSteps: -1}, "warmup_steps", "must be 0 or more, got -1"},
		{Schedule{Kind: "cosine", MinLR: 0.5}, "min_lr", "must be in [0, train.optimizer.lr = 0.1], got 0.5"},
		{Schedule{Kind: "linear", WarmupSteps: 100}, "decay_steps", "100 (decay_steps, or train.steps when 0) must be above warmup_steps 100"},
		{Schedule{Kind: "cosine", DecaySteps: -3}, "decay_steps", "must be 0 (the run's steps) or more, got -3"},
		{Schedule{Kind: "step", Gamma: 0.5}, "step_size", "must be 1 or more, got 0"},
		{Schedule{Kind: "step", StepSize: 3, Gamma: 1.5}, "gamma", "must be in (0, 1], got 1.5"},
		{Schedule{Kind: "cosine", Gamma: 0.5}, "gamma", "kind cosine does not read it"},
		{Schedule{StepSize: 2}, "step_size", "kind constant does not read it"},
		{Schedule{Kind: "step", StepSize: 2, Gamma: 0.5, MinLR: 0.01}, "min_lr", "kind step does not read it"},
	} {
		p := c.s.Check(0.1, 100)
		if len(p) != 1 || p[0].Field != c.field || !strings.Contains(p[0].Message, c.words) {
			t.Errorf("%+v: Check gave %v, want one problem of %s saying %q", c.s, p, c.field, c.words)
		}
	}
}
