package optim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Schedule is a learning-rate schedule, the train.lr_schedule section of a
// run config: a linear warmup, then the learning rate of its kind. The rate
// is a function of the step alone (LR), so a resumed run, every replica and
// the one-process reference compute the same rates with no state to save.
//
// With s the updates applied so far (0 for the first), η the optimizer's lr,
// W warmup_steps, D decay_steps and p = min(1, (s − W)/(D − W)):
//
//	s < W:     η·(s+1)/(W+1)   (nanoGPT's warmup; torch's LinearLR with start_factor 1/(W+1) over W steps)
//	constant:  η
//	cosine:    min_lr + (η − min_lr)·(1 + cos(π·p))/2   (CosineAnnealingLR with T_max D − W, then held at min_lr)
//	linear:    η + (min_lr − η)·p                       (LinearLR from 1 to min_lr/η over D − W steps)
//	step:      η·gamma^⌊(s − W)/step_size⌋              (StepLR)
//
// Past D, cosine and linear stay at min_lr, as nanoGPT's get_lr does
// (torch's CosineAnnealingLR would climb again).
type Schedule struct {
	Kind        string `mapstructure:"kind" json:"kind"`
	WarmupSteps int    `mapstructure:"warmup_steps" json:"warmup_steps,omitempty"`
	// MinLR is where cosine and linear end.
	MinLR float64 `mapstructure:"min_lr" json:"min_lr,omitempty"`
	// DecaySteps is the step at which cosine and linear reach MinLR,
	// counted from the first step (warmup included); 0: the run's steps
	// (Resolve).
	DecaySteps int `mapstructure:"decay_steps" json:"decay_steps,omitempty"`
	// StepSize and Gamma are step's: the rate is multiplied by Gamma every
	// StepSize steps after the warmup.
	StepSize int     `mapstructure:"step_size" json:"step_size,omitempty"`
	Gamma    float64 `mapstructure:"gamma" json:"gamma,omitempty"`
}

// ScheduleKinds lists the kinds a Schedule may name.
func ScheduleKinds() []string { return []string{"constant", "cosine", "linear", "step"} }

// Constant says whether the schedule leaves the optimizer's lr as it is at
// every step: kind constant (or unset) without warmup.
func (s Schedule) Constant() bool {
	return (s.Kind == "" || s.Kind == "constant") && s.WarmupSteps == 0
}

// decays says whether the kind decays towards MinLR over DecaySteps.
func (s Schedule) decays() bool { return s.Kind == "cosine" || s.Kind == "linear" }

// Resolve gives DecaySteps its default, the run's steps, for the kinds that
// read it.
func (s Schedule) Resolve(steps int) Schedule {
	if s.decays() && s.DecaySteps == 0 {
		s.DecaySteps = steps
	}
	return s
}

// LR is the learning rate of the update that follows step updates (the
// optimizer's Steps() before its Step), for an optimizer of learning rate
// base. The schedule must have passed Check and been resolved.
func (s Schedule) LR(base float64, step int64) float64 {
	w := int64(s.WarmupSteps)
	if step < w {
		return base * float64(step+1) / float64(w+1)
	}
	since := step - w
	switch s.Kind {
	case "cosine", "linear":
		span := int64(s.DecaySteps) - w
		p := 1.0
		if since < span {
			p = float64(since) / float64(span)
		}
		if s.Kind == "cosine" {
			return s.MinLR + (base-s.MinLR)*(1+math.Cos(math.Pi*p))/2
		}
		return base + (s.MinLR-base)*p
	case "step":
		return base * math.Pow(s.Gamma, float64(since/int64(s.StepSize)))
	}
	return base
}

// ScheduleProblem is a field of a Schedule that Check refuses, named by
// its config key below train.lr_schedule, and why.
type ScheduleProblem struct{ Field, Message string }

// Check lists what is wrong with the schedule, for an optimizer of
// learning rate lr in a run of steps steps; nil when nothing is. A key the
// kind does not read must be left out, so that a misplaced setting is not
// silently ignored.
func (s Schedule) Check(lr float64, steps int) []ScheduleProblem {
	var out []ScheduleProblem
	add := func(field, format string, args ...any) {
		out = append(out, ScheduleProblem{field, fmt.Sprintf(format, args...)})
	}
	if s.Kind != "" && !slices.Contains(ScheduleKinds(), s.Kind) {
		add("kind", "unknown learning-rate schedule %q (known: %s)", s.Kind, strings.Join(ScheduleKinds(), ", "))
		return out
	}
	if s.WarmupSteps < 0 {
		add("warmup_steps", "must be 0 or more, got %d", s.WarmupSteps)
	}
	unread := func(field string, set bool) {
		if set {
			add(field, "kind %s does not read it; cosine and linear read min_lr and decay_steps, step reads step_size and gamma", cmp.Or(s.Kind, "constant"))
		}
	}
	if s.decays() {
		if s.MinLR < 0 || s.MinLR > lr {
			add("min_lr", "must be in [0, train.optimizer.lr = %v], got %v", lr, s.MinLR)
		}
		if s.DecaySteps < 0 {
			add("decay_steps", "must be 0 (the run's steps) or more, got %d", s.DecaySteps)
		} else if d := s.Resolve(steps).DecaySteps; d <= s.WarmupSteps {
			add("decay_steps", "%d (decay_steps, or train.steps when 0) must be above warmup_steps %d", d, s.WarmupSteps)
		}
	} else {
		unread("min_lr", s.MinLR != 0)
		unread("decay_steps", s.DecaySteps != 0)
	}
	if s.Kind == "step" {
		if s.StepSize < 1 {
			add("step_size", "must be 1 or more, got %d", s.StepSize)
		}
		if s.Gamma <= 0 || s.Gamma > 1 {
			add("gamma", "must be in (0, 1], got %v", s.Gamma)
		}
	} else {
		unread("step_size", s.StepSize != 0)
		unread("gamma", s.Gamma != 0)
	}
	return out
}
