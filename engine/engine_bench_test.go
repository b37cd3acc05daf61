package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
)

// benchStage is a middle stage of two 512-wide layers at micro-batch 64.
func benchStage(b *testing.B, split bool) (*Engine, func()) {
	blas.SetThreads(1)
	m, err := models.Build(models.Spec{Name: "mlp", Input: 512, Hidden: []int{512, 512, 512}, Classes: 10})
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewEngine(m, 1, 3, 64, 1, Options{Split: split})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	x := randomDense(r, m.DType, e.InShape())
	g := randomDense(r, m.DType, e.OutShape())
	return e, func() {
		if _, err := e.Forward(0, x, nil); err != nil {
			b.Fatal(err)
		}
		if split {
			if _, err := e.Input(0, g); err != nil {
				b.Fatal(err)
			}
			if err := e.Weight(0); err != nil {
				b.Fatal(err)
			}
			return
		}
		if _, err := e.Backward(0, g); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStageFusedBackward and BenchmarkStageSplitBackward compare one
// micro-batch's forward and backward with the backward fused or split into input
// and weight gradients (zero-bubble schedules).
func BenchmarkStageFusedBackward(b *testing.B) {
	_, step := benchStage(b, false)
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}

func BenchmarkStageSplitBackward(b *testing.B) {
	_, step := benchStage(b, true)
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
}
