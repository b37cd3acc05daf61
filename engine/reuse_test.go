package engine

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// TestReleasedBuffersAreNeverTouched plays a middle stage twice, in lock step:
// one engine gets each micro-batch's input and output gradient in buffers that
// are scribbled over as soon as Unshare would let the stage hand them back to the
// transport, the other gets fresh buffers it keeps. Outputs, input gradients
// and the summed weight gradients must stay bit-identical, and no scribbled
// buffer may change afterwards: the engine neither reads nor writes memory it
// gave up. Micro-batches overlap as in 1F1B's steady state (two in flight).
func TestReleasedBuffersAreNeverTouched(t *testing.T) {
	cases := []struct {
		name        string
		spec        models.Spec
		first, last int
		split       bool
		mustRelease bool // the MLP keeps no pointer into its inputs, so those go back
	}{
		{"mlp", models.Spec{Name: "mlp", DType: "float32", Input: 6, Hidden: []int{5, 7, 4}, Classes: 3}, 1, 3, false, true},
		{"mlp-split", models.Spec{Name: "mlp", DType: "float32", Input: 6, Hidden: []int{5, 7, 4}, Classes: 3}, 1, 3, true, true},
		{"gpt", models.Spec{Name: "gpt", DType: "float32", Layers: 3, Width: 8, Heads: 2, Context: 6, Vocab: 32}, 1, 3, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := models.Build(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			const batch, micro, steps = 4, 6, 3
			var a, b *Engine
			for _, e := range []**Engine{&a, &b} {
				if *e, err = NewEngine(m, c.first, c.last, batch, 7, Options{Split: c.split}); err != nil {
					t.Fatal(err)
				}
			}
			inShape, outShape := m.ShapeAt(c.first, batch), m.ShapeAt(c.last, batch)
			r := rand.New(rand.NewPCG(1, 2))
			var scribbled [][]float32
			released, kept := 0, 0
			release := func(mem []float32) {
				bytes := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mem))), 4*len(mem))
				if !a.Unshare(bytes) {
					kept++
					return
				}
				released++
				for i := range mem {
					mem[i] = float32(math.NaN())
				}
				scribbled = append(scribbled, mem)
			}
			type inFlight struct{ in []float32 }
			for step := range steps {
				flights := map[int]inFlight{}
				backward := func(k int) {
					g := randFloats(r, outShape.TotalSize())
					ga, gb := append([]float32(nil), g...), append([]float32(nil), g...)
					dxa, err := a.Backward(k, tensor.New(tensor.WithShape(outShape...), tensor.WithBacking(ga)))
					if err != nil {
						t.Fatal(err)
					}
					dxb, err := b.Backward(k, tensor.New(tensor.WithShape(outShape...), tensor.WithBacking(gb)))
					if err != nil {
						t.Fatal(err)
					}
					if !sameBits(dxa, dxb) {
						t.Fatalf("step %d micro-batch %d: input gradients differ", step, k)
					}
					release(flights[k].in)
					release(ga)
					delete(flights, k)
				}
				for k := range micro {
					x := randFloats(r, inShape.TotalSize())
					if c.spec.Name == "gpt" && c.first == 0 {
						t.Fatal("the first GPT stage takes token ids: test a middle stage")
					}
					xa, xb := append([]float32(nil), x...), append([]float32(nil), x...)
					oa, err := a.Forward(k, tensor.New(tensor.WithShape(inShape...), tensor.WithBacking(xa)), nil)
					if err != nil {
						t.Fatal(err)
					}
					ob, err := b.Forward(k, tensor.New(tensor.WithShape(inShape...), tensor.WithBacking(xb)), nil)
					if err != nil {
						t.Fatal(err)
					}
					if !sameBits(oa, ob) {
						t.Fatalf("step %d micro-batch %d: outputs differ", step, k)
					}
					flights[k] = inFlight{xa}
					if k >= 1 {
						backward(k - 1)
					}
				}
				backward(micro - 1)
				if names := differingGradients(t, a, b); len(names) > 0 {
					t.Fatalf("step %d: gradients of %v differ", step, names)
				}
				zeroGrads(t, a)
				zeroGrads(t, b)
			}
			for i, mem := range scribbled {
				for j, v := range mem {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("released buffer %d was written at %d after its release", i, j)
					}
				}
			}
			t.Logf("%d buffers released, %d kept (still referenced)", released, kept)
			if released == 0 && c.mustRelease {
				t.Fatal("no buffer was released")
			}
		})
	}
}

func randFloats(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	return v
}

// zeroGrads clears the summed gradients, as an optimizer step does.
func zeroGrads(t *testing.T, e *Engine) {
	t.Helper()
	gs, err := e.Gradients()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		g.Value.Zero()
	}
}
