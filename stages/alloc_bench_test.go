package stages

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
)

// BenchmarkEngineStepAllocs reports the steady-state allocations of one
// micro-batch's Forward+Backward on a middle stage of two 1024-wide layers (the
// stage bench/suite times against sgemm), at micro-batches 64 and 256. Run with
// -benchmem (or read allocs/op): a step should allocate little beyond the output
// and input-gradient copies it hands its caller, 2·batch·1024·4 bytes.
func BenchmarkEngineStepAllocs(b *testing.B) {
	blas.SetThreads(1)
	m, err := models.Build(models.Spec{Name: "mlp", Input: 1024, Hidden: []int{1024, 1024, 1024}, Classes: 1024})
	if err != nil {
		b.Fatal(err)
	}
	for _, mb := range []int{64, 256} {
		b.Run(fmt.Sprintf("mb=%d", mb), func(b *testing.B) {
			e, err := NewEngine(m, 1, 3, mb, 1, false)
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(3, uint64(mb)))
			x := randomDense(r, m.DType, e.InShape())
			g := randomDense(r, m.DType, e.OutShape())
			step := func() {
				if _, err := e.Forward(0, x, nil); err != nil {
					b.Fatal(err)
				}
				if _, err := e.Backward(0, g); err != nil {
					b.Fatal(err)
				}
			}
			for range 3 { // warm up: machines, registers and gradients allocated once
				step()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				step()
			}
		})
	}
}
