package configs

import (
	"github.com/pipetrain/pipetrain/models"
)

// validateWeightDecay checks train.optimizer.weight_decay and
// decay_exclude: a decay of 0 or more, patterns path.Match can parse, and
// the two copies of every tied weight decayed alike, since the runtime
// keeps them bit-identical by giving both the same update.
func (c *Config) validateWeightDecay(p *Problems, model *models.Model) {
	o := c.Train.Optimizer
	if !(o.WeightDecay >= 0) {
		p.add("train.optimizer.weight_decay", "must be 0 (no decay) or more, got %v", o.WeightDecay)
	}
	if err := o.CheckPatterns(); err != nil {
		p.add("train.optimizer.decay_exclude", "%v", err)
		return
	}
	if o.WeightDecay == 0 || model == nil {
		return
	}
	for i, pair := range model.Tied {
		dims := 2
		if i < len(model.TiedShapes) {
			dims = len(model.TiedShapes[i])
		}
		if a, b := o.Decays(pair[0], dims), o.Decays(pair[1], dims); a != b {
			decayed, kept := pair[0], pair[1]
			if b {
				decayed, kept = kept, decayed
			}
			p.add("train.optimizer.decay_exclude", "decays %s but not %s, which is the same weight held twice (tied): exclude both or neither", decayed, kept)
		}
	}
}

// validateLRSchedule checks train.lr_schedule against the optimizer's
// learning rate and the run's steps (decay_steps' default).
func (c *Config) validateLRSchedule(p *Problems) {
	for _, e := range c.Train.LRSchedule.Check(c.Train.Optimizer.LR, c.Train.Steps) {
		p.add("train.lr_schedule."+e.Field, "%s", e.Message)
	}
}

// LearningRate is the optimizer's learning rate for the update that follows
// step updates (the optimizer's Steps() before its Step): train.lr_schedule
// with its decay_steps resolved against train.steps, applied to
// train.optimizer.lr. Every stage, replica and the reference call it with
// the same config and step, and so use the same rate.
func (c *Config) LearningRate(step int64) float64 {
	return c.Train.LRSchedule.Resolve(c.Train.Steps).LR(c.Train.Optimizer.LR, step)
}
