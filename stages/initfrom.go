package stages

import (
	"fmt"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
)

// initFrom replaces the seed's initial values of the stage's parameters with
// those of train.init_from. Every stage, and the reference, reads the same
// file here, so they start bit-identical as they do from a seed; tied copies
// (the GPT's head.tok) are filled from the one tensor PyTorch keeps. A resumed
// run loads its checkpoint over these in Run, so a checkpoint wins.
func (r *Runtime) initFrom(model *models.Model) error {
	path := r.cfg.InitFromPath()
	if path == "" {
		return nil
	}
	mine := map[string]bool{}
	for _, c := range r.chunks {
		for _, w := range c.Weights() {
			mine[w.Name] = true
		}
	}
	ts, err := checkpoint.ReadInit(model, path, func(name string) bool { return mine[name] })
	if err != nil {
		return fmt.Errorf("%s: train.init_from: %w", r.name(), err)
	}
	for _, c := range r.chunks {
		ws := c.Weights()
		for _, w := range ws {
			if err := fill(ts, w.Name, w.Value); err != nil {
				return fmt.Errorf("%s: train.init_from: %s: %w", r.name(), path, err)
			}
		}
		if err := c.LoadWeights(ws); err != nil {
			return fmt.Errorf("%s: train.init_from: %s: %w", r.name(), path, err)
		}
	}
	fmt.Fprintf(r.log, "%s: %s from %s\n", r.name(), words.Count(len(mine), "parameter tensor"), path)
	return nil
}
