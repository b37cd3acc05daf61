package engine

import (
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// randomWithSpecials fills n values with random numbers and, at fixed
// places, the values an elementwise kernel could get wrong: NaN, ±Inf,
// ±0 and subnormals.
func randomWithSpecials(r *rand.Rand, dt tensor.Dtype, n int) *tensor.Dense {
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1e-40, -1e-45, 1e-310}
	t := tensor.New(tensor.Of(dt), tensor.WithShape(n))
	for i := range n {
		v := r.NormFloat64() * 3
		if i%97 < len(specials) && i%3 == 0 {
			v = specials[i%97]
		}
		switch d := t.Data().(type) {
		case []float32:
			d[i] = float32(v)
		case []float64:
			d[i] = v
		}
	}
	return t
}

func sameBitsAs(t *testing.T, what string, got, want tensor.Tensor) {
	t.Helper()
	switch w := want.Data().(type) {
	case []float32:
		g := got.Data().([]float32)
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s: element %d is %v (%#x), the standard engine's %v (%#x)", what, i, g[i], math.Float32bits(g[i]), w[i], math.Float32bits(w[i]))
			}
		}
	case []float64:
		g := got.Data().([]float64)
		for i := range w {
			if math.Float64bits(g[i]) != math.Float64bits(w[i]) {
				t.Fatalf("%s: element %d is %v, the standard engine's %v", what, i, g[i], w[i])
			}
		}
	}
}

// The vectorised kernels give the standard engine's bits, for every way
// of returning the result, at sizes on both sides of the vector width and
// with every length of tail the Go loop finishes.
func TestFastEngineMatchesStandardEngine(t *testing.T) {
	for _, w := range []int{1, 3} { // one goroutine, and large operations shared by three
		SetWorkers(w)
		fastMatchesStandard(t)
	}
	SetWorkers(0)
}

func fastMatchesStandard(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	std := tensor.StdEng{}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, n := range []int{1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 255, 256, 269, 4099, parallelMin + 13} {
			a, b := randomWithSpecials(r, dt, n), randomWithSpecials(r, dt, n)
			for _, op := range []struct {
				name      string
				fast, std func(a, b tensor.Tensor, opts ...tensor.FuncOpt) (tensor.Tensor, error)
			}{{"add", fast.Add, std.Add}, {"mul", fast.Mul, std.Mul}} {
				want, err := op.std(a, b)
				if err != nil {
					t.Fatal(err)
				}
				got, err := op.fast(a, b)
				if err != nil {
					t.Fatal(err)
				}
				sameBitsAs(t, op.name+" (new result)", got, want)
				reuse := tensor.New(tensor.Of(dt), tensor.WithShape(n))
				if got, err = op.fast(a, b, tensor.WithReuse(reuse)); err != nil || got != tensor.Tensor(reuse) {
					t.Fatalf("%s with reuse: %v, result %p, reuse %p", op.name, err, got, reuse)
				}
				sameBitsAs(t, op.name+" (reuse)", reuse, want)
				inPlace := a.Clone().(*tensor.Dense)
				if got, err = op.fast(inPlace, b, tensor.UseUnsafe()); err != nil || got != tensor.Tensor(inPlace) {
					t.Fatalf("%s in place: %v", op.name, err)
				}
				sameBitsAs(t, op.name+" (in place)", inPlace, want)
			}
			for _, s := range []float64{0, -0.5} {
				var scalar interface{} = s
				if dt == tensor.Float32 {
					scalar = float32(s)
				}
				want, err := std.GteScalar(a, scalar, true, tensor.AsSameType())
				if err != nil {
					t.Fatal(err)
				}
				got, err := fast.GteScalar(a, scalar, true, tensor.AsSameType())
				if err != nil {
					t.Fatal(err)
				}
				sameBitsAs(t, "gte", got, want)
			}
		}
	}
}

// What the kernels do not cover is left to the standard engine: shapes
// that differ (broadcasts) are refused by it, as before.
func TestFastEngineLeavesTheRestToTheStandardEngine(t *testing.T) {
	a := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}), tensor.WithEngine(fast))
	b := tensor.New(tensor.WithShape(3, 2), tensor.WithBacking([]float32{1, 1, 1, 1, 1, 1}))
	if _, err := tensor.Add(a, b); err == nil {
		t.Fatal("shapes (2, 3) and (3, 2) added")
	}
	// A result keeps the engine, so the next operation is fast too.
	c := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 1, 1, 1, 1, 1}))
	sum, err := tensor.Add(a, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sum.Engine().(fastEngine); !ok {
		t.Fatalf("result's engine is %T", sum.Engine())
	}
	if got := sum.Data().([]float32); got[5] != 7 {
		t.Fatalf("sum = %v", got)
	}
}
