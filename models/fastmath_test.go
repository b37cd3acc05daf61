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
// ones where built) give the Go loops' bits, on odd widths and lengths, with
// special values (NaN, ±Inf, ±0, GELU's tanh saturated) among the inputs,
// and into outputs holding garbage.
func TestFusedKernelsMatchGoLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	// NaNs of several payloads, so that where both operands of an
	// operation are NaNs the result tells which one came first.
	specials := []float32{float32(math.NaN()), math.Float32frombits(0x7fc00123), math.Float32frombits(0xffc00456),
		float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1)), 1e-40, 30, -30, 1e20, -1e20}
	vec := func(n int, sd float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * sd)
			if r.IntN(4) == 0 {
				v[i] = specials[r.IntN(len(specials))]
			}
		}
		return v
	}
	garbage := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return v
	}
	same := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %v (%#x), the Go loop's %v (%#x)", name, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
	// sameOrNaNs is same where a NaN may come out as another NaN: the
	// rotary loop's compiled operand order, which picks the NaN out of two,
	// depends on where it is inlined.
	sameOrNaNs := func(name string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] != got[i] && want[i] != want[i]) {
				t.Fatalf("%s: element %d is %v (%#x), the Go loop's %v (%#x)", name, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
	for _, shape := range [][2]int{{1, 1}, {3, 7}, {2, 8}, {9, 64}, {33, 13}, {5, 17}, {128, 256}, {0, 5}} {
		n, d := shape[0], shape[1]
		x, b, dy := vec(n*d, 4), vec(d, 1), vec(n*d, 1)
		got, want := garbage(n*d), garbage(n*d)
		addRows32(got, x, b, d)
		addRowsGo(want, x, b, d)
		same("add rows", got, want)
		gs, ws := garbage(d), garbage(d)
		colSum32(gs, x, d)
		colSumGo(ws, x, d)
		same("column sums", gs, ws)
		gelu32(got, x)
		geluGo(want, x)
		same("gelu", got, want)
		geluGrad32(got, x, dy)
		geluGradGo(want, x, dy)
		same("gelu gradient", got, want)
		up := vec(n*d, 1)
		swiglu32(got, x, up)
		swigluGo(want, x, up)
		same("swiglu", got, want)
		swigluGateGrad32(got, x, up, dy)
		swigluGateGradGo(want, x, up, dy)
		same("swiglu gate gradient", got, want)
		swigluUpGrad32(got, x, dy)
		swigluUpGradGo(want, x, dy)
		same("swiglu up gradient", got, want)
		for _, s := range []float32{0.7, specials[1], float32(math.Inf(1))} {
			rmsScaleRow32(got, x, up, s)
			rmsScaleRowGo(want, x, up, s)
			same("rms norm row", got, want)
			rmsInputGradRow32(got, x, dy, up, s, -0.3)
			rmsInputGradRowGo(want, x, dy, up, s, -0.3)
			same("rms norm input gradient row", got, want)
			rmsInputGradRow32(got, x, dy, up, 1.3, s)
			rmsInputGradRowGo(want, x, dy, up, 1.3, s)
			same("rms norm input gradient row (mean)", got, want)
			copy(got, dy)
			copy(want, dy)
			rmsGainGradRow32(got, x, up, s)
			rmsGainGradRowGo(want, x, up, s)
			same("rms norm gain gradient row", got, want)
		}
		c, sn := vec(n*d, 1), vec(n*d, 1)
		got2, want2 := garbage(n*d), garbage(n*d)
		ropeRow32(got, got2, x, up, c, sn)
		ropeRowGo(want, want2, x, up, c, sn)
		sameOrNaNs("rotary first halves", got, want)
		sameOrNaNs("rotary second halves", got2, want2)
	}
}

// TestCausalSoftmaxMatchesGoLoop: the float32 causal softmax (vector where
// built) gives the Go loop's bits, for block sizes with and without a tail,
// rows packed or ld apart (the gap left as it was), and on rows holding the
// values its maximum, exp and sum could get wrong: NaN (whose bits depend on
// the order of the maximum), ±0, ±Inf, and scores far enough apart for exp
// to underflow.
func TestCausalSoftmaxMatchesGoLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	nan := math.Float32frombits(0x7fc00001)
	specials := []float32{float32(math.NaN()), nan, -nan, 0, float32(math.Copysign(0, -1)),
		float32(math.Inf(1)), float32(math.Inf(-1)), 1e4, -1e4, 1e-40}
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65} {
		for _, gap := range []int{0, 3} {
			for _, special := range []bool{false, true} {
				ld := n + gap
				p := make([]float32, n*ld)
				for i := range p {
					p[i] = float32(r.NormFloat64() * 5)
					if special && r.IntN(8) == 0 {
						p[i] = specials[r.IntN(len(specials))]
					}
				}
				if special && n > 2 {
					// Rows of zeros of both signs, their maximum ±0.
					for j := range n {
						p[2*ld+j] = float32(math.Copysign(0, float64(j%2)-0.5))
					}
				}
				got, want := append([]float32(nil), p...), append([]float32(nil), p...)
				causalSoftmax32(got, n, ld)
				causalSoftmaxGo(want, n, ld)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("t=%d ld=%d element %d (%v in): %v (%#x), the Go loop's %v (%#x)", n, ld, i, p[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
					}
					if i%ld >= n && math.Float32bits(got[i]) != math.Float32bits(p[i]) {
						t.Fatalf("t=%d ld=%d: element %d, between rows, changed from %v to %v", n, ld, i, p[i], got[i])
					}
				}
			}
		}
	}
}
