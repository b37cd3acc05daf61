package compute

import "github.com/pipetrain/pipetrain/engine"

// cpu is today's engine: gorgonia graphs whose products OpenBLAS computes
// on the process's cores.
type cpu struct{}

func init() { Register(cpu{}) }

func (cpu) Kind() string { return "cpu" }

// Open builds the chunk's engine; the cpu kind has one device, so Index
// is not read.
func (cpu) Open(s Spec) (Stage, error) {
	return engine.NewEngine(s.Model, s.First, s.Last, s.Batch, s.Seed, s.Options)
}
