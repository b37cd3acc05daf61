//go:build amd64 && !nosimd

package optim

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gorgonia.org/tensor"
)

// TestVectorUpdatesAreTheLoops: every optimizer's AVX kernel gives the
// bits of update's Go loop, over lengths with and without a tail, values
// spanning many magnitudes, zeros of both signs, subnormals, infinities
// and NaNs, over several steps.
func TestVectorUpdatesAreTheLoops(t *testing.T) {
	if !hasAVX {
		t.Skip("no AVX on this CPU")
	}
	specs := []Spec{
		{Name: "sgd", LR: 0.05},
		{Name: "sgd", LR: 0.05, Momentum: 0.9},
		{Name: "adam", LR: 0.003, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		// Weight decay on every parameter (no pattern matches "p"):
		// the Go pass before the kernels.
		{Name: "adamw", LR: 0.003, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, DecayExclude: []string{"none"}},
		{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 0.01, DecayExclude: []string{"none"}},
	}
	for _, spec := range specs {
		for _, n := range []int{1, 7, 8, 9, 64, 77} {
			r := rand.New(rand.NewPCG(uint64(n), 5))
			shapes := []tensor.Shape{{n}}
			vec, loop := mustNew(t, spec, shapes), mustNew(t, spec, shapes)
			pv := oddValues(r, n)
			pl := slices.Clone(pv)
			for step := range 3 {
				g := oddValues(r, n)
				gv, gl := slices.Clone(g), slices.Clone(g)
				stepWith(t, vec, pv, gv, true)
				stepWith(t, loop, pl, gl, false)
				if !sameBits(pv, pl) || !sameBits(gv, gl) {
					t.Fatalf("%s momentum %v, n %d, step %d: the kernel's parameters differ from the loop's\n%v\n%v", spec.Name, spec.Momentum, n, step, pv, pl)
				}
				for _, name := range vec.SlotNames() {
					a, _ := vec.Slot(name, 0)
					b, _ := loop.Slot(name, 0)
					if !sameBits(a.Data().([]float32), b.Data().([]float32)) {
						t.Fatalf("%s n %d step %d: slot %s differs", spec.Name, n, step, name)
					}
				}
			}
		}
	}
}

func mustNew(t *testing.T, spec Spec, shapes []tensor.Shape) *Optimizer {
	t.Helper()
	names := make([]string, len(shapes))
	for i := range names {
		names[i] = "p"
	}
	o, err := NewNamed(spec, tensor.Float32, names, shapes)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// stepWith runs one step with the kernels on or off.
func stepWith(t *testing.T, o *Optimizer, p, g []float32, kernels bool) {
	t.Helper()
	defer func(was bool) { hasAVX = was }(hasAVX)
	hasAVX = kernels
	pd := tensor.New(tensor.WithShape(len(p)), tensor.WithBacking(p))
	gd := tensor.New(tensor.WithShape(len(g)), tensor.WithBacking(g))
	if err := o.Step([]*tensor.Dense{pd}, []*tensor.Dense{gd}); err != nil {
		t.Fatal(err)
	}
}

// oddValues are n float32s, mostly ordinary across magnitudes, some of
// them the IEEE corner cases.
func oddValues(r *rand.Rand, n int) []float32 {
	odd := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32, 1e-30}
	out := make([]float32, n)
	for i := range out {
		if r.IntN(6) == 0 {
			out[i] = odd[r.IntN(len(odd))]
			continue
		}
		out[i] = float32((r.Float64()*2 - 1) * math.Pow(10, float64(r.IntN(12)-6)))
	}
	return out
}

func sameBits(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return len(a) == len(b)
}
