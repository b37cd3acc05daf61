package engine

import (
	"fmt"
	"math/rand/v2"
	"runtime"
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
			e, err := NewEngine(m, 1, 3, mb, 1, Options{})
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

// TestSplitBackwardAllocatesLikeFused: a zero-bubble step (F, I, W) keeps its
// machines' registers between runs as the fused step (F, B) does, so in the
// steady state it allocates a small multiple of that; a W pass that dropped its
// registers would allocate every weight gradient (8 MiB here) anew each time.
func TestSplitBackwardAllocatesLikeFused(t *testing.T) {
	blas.SetThreads(1)
	m, err := models.Build(models.Spec{Name: "mlp", Input: 1024, Hidden: []int{1024, 1024, 1024}, Classes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	perStep := func(split bool) uint64 {
		e, err := NewEngine(m, 1, 3, 64, 1, Options{Split: split})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(3, 64))
		x := randomDense(r, m.DType, e.InShape())
		g := randomDense(r, m.DType, e.OutShape())
		step := func() {
			if _, err := e.Forward(0, x, nil); err != nil {
				t.Fatal(err)
			}
			if split {
				if _, err := e.Input(0, g); err != nil {
					t.Fatal(err)
				}
				err = e.Weight(0)
			} else {
				_, err = e.Backward(0, g)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			step()
		}
		const n = 10
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range n {
			step()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	fused, split := perStep(false), perStep(true)
	t.Logf("steady-state bytes per step: fused %d, split %d", fused, split)
	// The split step also copies each layer's input and tap gradient for its
	// W pass (1 MiB here), so it may allocate a few times the fused step's
	// output copies, never the weight gradients' size.
	if split > 4*fused {
		t.Errorf("a split step allocates %d bytes, the fused one %d", split, fused)
	}
}
