package models

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestExp32 checks exp32 against float64 exp over its whole range, at the
// edges and on special values.
func TestExp32(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	for i := range 2_000_000 {
		x := float32(r.Float64()*(expHi-expLo) + expLo)
		if i%4 == 0 {
			x = float32(r.NormFloat64() * 3)
		}
		want := math.Exp(float64(x))
		got := float64(exp32(x))
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1))) - float32(want))
		if e := math.Abs(got-want) / ulp; e > worst {
			worst = e
			if e > 2 {
				t.Fatalf("exp32(%v) = %v, exp %v: %.1f ulp", x, got, want, e)
			}
		}
	}
	t.Logf("worst error %.2f ulp", worst)
	for _, c := range []struct{ x, want float32 }{
		{0, 1}, {1, float32(math.E)}, {-100, 0}, {100, float32(math.Inf(1))},
		{float32(math.Inf(-1)), 0}, {float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := exp32(c.x); got != c.want {
			t.Errorf("exp32(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if nan := exp32(float32(math.NaN())); nan == nan {
		t.Errorf("exp32(NaN) = %v", nan)
	}
}

func TestTanh32(t *testing.T) {
	for x := float32(-12); x <= 12; x += 0.001 {
		if got, want := float64(tanh32(x)), math.Tanh(float64(x)); math.Abs(got-want) > 2e-7 {
			t.Fatalf("tanh32(%v) = %v, tanh %v", x, got, want)
		}
	}
}

func BenchmarkExp32(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = float32(i%200)*-0.05 + 2
	}
	var s float32
	for b.Loop() {
		for _, x := range xs {
			s += exp32(x)
		}
	}
	_ = s
}

// TestSliceKernelsMatchScalar: the vectorised exp and tanh give the scalar
// functions' bits on every lane, special values and the range's edges
// included, so a machine without the vector unit computes the same run.
func TestSliceKernelsMatchScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	xs := []float32{0, -0, 1, -1, expHi, expLo, expHi + 1e-3, expLo - 1e-3, 88.7, -87.3, 9, -9, 9.001, -9.001,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-30, -1e-30}
	for range 100_003 {
		xs = append(xs, float32(r.NormFloat64()*20))
	}
	for _, f := range []struct {
		name   string
		slice  func(dst, src []float32)
		scalar func(float32) float32
	}{{"exp", exp32s, exp32}, {"tanh", tanh32s, tanh32}} {
		got := make([]float32, len(xs))
		f.slice(got, xs)
		for i, x := range xs {
			if want := f.scalar(x); math.Float32bits(got[i]) != math.Float32bits(want) && !(want != want && got[i] != got[i]) {
				t.Fatalf("%s of %v: slice kernel %v (%#x), scalar %v (%#x)", f.name, x, got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
			}
		}
		inPlace := append([]float32(nil), xs...)
		f.slice(inPlace, inPlace)
		for i := range xs {
			if math.Float32bits(inPlace[i]) != math.Float32bits(got[i]) && got[i] == got[i] {
				t.Fatalf("%s in place differs at %d", f.name, i)
			}
		}
	}
}

func BenchmarkExp32Slice(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = float32(i%200)*-0.05 + 2
	}
	dst := make([]float32, len(xs))
	for b.Loop() {
		exp32s(dst, xs)
	}
}

// TestFusedKernelsMatchGoLoops: the float32 kernels of the fused ops (vector
// ones where built) give the Go loops' bits, on odd widths and lengths.
func TestFusedKernelsMatchGoLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	vec := func(n int, sd float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * sd)
		}
		return v
	}
	same := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %v, the Go loop's %v", name, i, got[i], want[i])
			}
		}
	}
	for _, shape := range [][2]int{{1, 1}, {3, 7}, {9, 64}, {33, 13}, {128, 256}} {
		n, d := shape[0], shape[1]
		x, b, dy := vec(n*d, 4), vec(d, 1), vec(n*d, 1)
		got, want := make([]float32, n*d), make([]float32, n*d)
		addRows32(got, x, b, d)
		addRowsGo(want, x, b, d)
		same("add rows", got, want)
		gs, ws := make([]float32, d), make([]float32, d)
		colSum32(gs, x, d)
		colSumGo(ws, x, d)
		same("column sums", gs, ws)
		gelu32(got, x)
		geluGo(want, x)
		same("gelu", got, want)
		geluGrad32(got, x, dy)
		geluGradGo(want, x, dy)
		same("gelu gradient", got, want)
	}
}

// TestCausalSoftmaxMatchesGoLoop: the float32 causal softmax (vector where
// built) gives the Go loop's bits, for block sizes with and without a tail.
func TestCausalSoftmaxMatchesGoLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 3, 5, 16, 64} {
		p := make([]float32, n*n)
		for i := range p {
			p[i] = float32(r.NormFloat64() * 5)
		}
		got, want := append([]float32(nil), p...), append([]float32(nil), p...)
		causalSoftmax32(got, n)
		causalSoftmaxGo(want, n)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("t=%d element %d: %v, the Go loop's %v", n, i, got[i], want[i])
			}
		}
	}
}
