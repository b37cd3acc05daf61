package stages

import (
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
)

// EnginePipeline is what engine's cost and memory models take of validated
// config c: every stage's chunks as layer ranges, the micro-batch, the seed
// and the stages that recompute selectively.
func EnginePipeline(c *configs.Config) engine.Pipeline {
	p := engine.Pipeline{
		Chunks:    make([][][2]int, len(c.Stages)),
		Batch:     c.MicroBatchSize(),
		Seed:      c.Train.Seed,
		Selective: make([]bool, len(c.Stages)),
	}
	for s := range c.Stages {
		for chunk := range c.VirtualStages {
			first, last := c.ChunkLayers(s, chunk)
			p.Chunks[s] = append(p.Chunks[s], [2]int{first, last})
		}
		p.Selective[s] = c.RecomputesSelective(s)
	}
	return p
}
