package predict

import (
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/plan"
)

// PlanLayers times each layer of cfg's model here at micro-batch micro, the
// fastest of reps runs with the layers taking turns, with the BLAS threads
// (and engine workers) a stage will have, and returns the layers as the
// planner takes them (plan.Problem.Layers): costs in ms, the activations
// each keeps, its parameters with their optimizer state, its output and its
// gradient bytes.
func PlanLayers(cfg *configs.Config, model *models.Model, micro, threads, reps int) ([]plan.Layer, error) {
	blas.SetThreads(threads)
	engine.SetWorkers(threads)
	costs, err := engine.MeasureLayers(cfg.Model, micro, cfg.Train.Seed, reps)
	if err != nil {
		return nil, err
	}
	size := int(model.DType.Size())
	var layers []plan.Layer
	for i, lc := range costs {
		n, err := models.ParamCount(model, i, i+1)
		if err != nil {
			return nil, err
		}
		layers = append(layers, plan.Layer{Name: model.Layers[i].Name(), F: ms(lc.F), B: ms(lc.B), I: ms(lc.I), W: ms(lc.W),
			ActBytes: lc.StashBytes - lc.StashFixedBytes, FixedActBytes: lc.StashFixedBytes, SplitActBytes: lc.SplitStashBytes, ParamBytes: lc.ParamBytes, OutBytes: lc.OutBytes, GradBytes: int64(n * size)})
	}
	return layers, nil
}
