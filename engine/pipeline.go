package engine

import (
	"fmt"

	"github.com/pipetrain/pipetrain/models"
)

// Pipeline is what the cost and memory models (MeasureCosts, PredictMemory,
// EstimateTransfer) know of a run: plain values that their caller reads from
// its config, so that engine depends on no config or link. Seed and
// Selective may be left zero.
type Pipeline struct {
	// Chunks lists each stage's chunks, in the stage's chunk order, as the
	// half-open layer range [first, last) of each: Chunks[stage][chunk].
	Chunks [][][2]int
	// Batch is the examples in one micro-batch.
	Batch int
	// Seed seeds the weights and the random inputs measured with.
	Seed uint64
	// Selective says which stages recompute selectively (Options.Selective);
	// a stage past its end does not.
	Selective []bool
}

// chunk is the layer range of stage's chunk, or an error naming both when
// the pipeline has no such chunk.
func (p Pipeline) chunk(stage, chunk int) (first, last int, err error) {
	if stage < 0 || stage >= len(p.Chunks) || chunk < 0 || chunk >= len(p.Chunks[stage]) {
		return 0, 0, fmt.Errorf("stage %d chunk %d: the pipeline has %d stages and no such chunk", stage, chunk, len(p.Chunks))
	}
	r := p.Chunks[stage][chunk]
	return r[0], r[1], nil
}

// selective reports whether stage recomputes selectively.
func (p Pipeline) selective(stage int) bool {
	return stage >= 0 && stage < len(p.Selective) && p.Selective[stage]
}

// largestInput is the bytes of the largest micro-batch that enters a chunk
// from another one: the input of every chunk but the one holding the model's
// first layer.
func (p Pipeline) largestInput(m *models.Model) int {
	var largest int
	for _, chunks := range p.Chunks {
		for _, r := range chunks {
			if r[0] > 0 {
				largest = max(largest, m.ShapeAt(r[0], p.Batch).TotalSize()*int(m.DType.Size()))
			}
		}
	}
	return largest
}
