package predict

import (
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// MemoryPredictor predicts each stage's peak activation memory under a
// schedule (engine.PredictMemory), measuring each stage's chunk once per
// kind of backward; nil for a schedule whose chunks are not the config's, or
// placed otherwise (its layers would be placed otherwise), or when a chunk
// cannot be built.
func MemoryPredictor(cfg *configs.Config, model *models.Model) func(*schedule.Schedule) []int64 {
	type key struct {
		stage, chunk int
		opts         engine.Options
	}
	measured := map[key]schedule.ChunkMemory{}
	keyOf := func(s *schedule.Schedule, st, ch int) key {
		return key{st, ch, engine.OptionsFor(s.Actions[st], ch, cfg.RecomputesSelective(st))}
	}
	return func(s *schedule.Schedule) []int64 {
		if s.Stages != len(cfg.Stages) || max(s.Chunks, 1) != max(cfg.VirtualStages, 1) ||
			s.Chunks > 1 && s.Placement != cfg.Placement() {
			return nil
		}
		for st := range s.Stages {
			for ch := range max(s.Chunks, 1) {
				k := keyOf(s, st, ch)
				if _, ok := measured[k]; ok {
					continue
				}
				first, last := cfg.ChunkLayers(st, ch)
				m, err := engine.MeasureMemory(model, first, last, cfg.MicroBatchSize(), cfg.Train.Seed, k.opts)
				if err != nil {
					return nil
				}
				measured[k] = m
			}
		}
		return s.PeakMemory(func(st, ch int) schedule.ChunkMemory { return measured[keyOf(s, st, ch)] })
	}
}
