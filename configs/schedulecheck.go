package configs

import (
	"fmt"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// CheckScheduleRuns reports whether this config's model can run sched: a
// schedule that splits the backward into input and weight gradients (I and
// W, the zero-bubble schedules) needs every layer of the model to be
// models.Splittable. The error names the schedule (sched.Name, or "the
// schedule" when it has none), the first layer that cannot split and the
// model. Validate refuses the configured schedule on the same rule, and
// pipetrain simulate refuses the schedules it is asked to predict with it.
func (c *Config) CheckScheduleRuns(sched *schedule.Schedule, model *models.Model) error {
	if sched == nil || model == nil || !sched.SplitsBackward() {
		return nil
	}
	for _, l := range model.Layers {
		if _, ok := l.(models.Splittable); !ok {
			name := sched.Name
			if name == "" {
				name = "the schedule"
			}
			return fmt.Errorf("%s splits the backward into input and weight gradients; layer %s of model %s cannot", name, l.Name(), c.Model.Name)
		}
	}
	return nil
}
