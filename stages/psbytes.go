package stages

import (
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// PSLayerBytes is, per layer of model, the bytes of its parameters each of
// the config's servers holds (PSOwners): what a worker stage holding the
// layer pushes to, and pulls from, each server every step. The simulator
// and the planner charge the servers' links with it.
func PSLayerBytes(c *configs.Config, model *models.Model) ([][]int64, error) {
	owners, err := PSOwners(c, model)
	if err != nil {
		return nil, err
	}
	layers, err := layerTensors(model)
	if err != nil {
		return nil, err
	}
	out := make([][]int64, len(layers))
	for j, ts := range layers {
		out[j] = make([]int64, c.ParameterServers.Count)
		for _, t := range ts {
			out[j][owners[t.Name]] += t.Bytes
		}
	}
	return out, nil
}
