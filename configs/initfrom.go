package configs

import (
	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/models"
)

// InitFromPath is train.init_from resolved against the config's folder ("" when
// unset): the weights the run starts from instead of the seed's.
func (c *Config) InitFromPath() string { return c.resolve(c.Train.InitFrom) }

// validateInitFrom checks, from the files' headers, that train.init_from holds
// every parameter of the model with the shape it needs, so that no stage is
// the first to find a tensor missing once the others have started.
func (c *Config) validateInitFrom(p *Problems, model *models.Model) {
	if c.Train.InitFrom == "" || model == nil {
		return
	}
	if err := checkpoint.CheckInit(model, c.InitFromPath()); err != nil {
		p.add("train.init_from", "%v", err)
	}
}
