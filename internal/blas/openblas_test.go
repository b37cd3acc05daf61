//go:build (linux || darwin || freebsd) && !nodlopen

package blas

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ebitengine/purego"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

func loaded(t *testing.T) *openBLAS {
	t.Helper()
	o, _, err := load(searched)
	if err != nil {
		testenv.RequireOrSkip(t, "OpenBLAS (Debian package libopenblas0, which make deps installs)", err.Error())
	}
	return o
}

func randoms32(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

func randoms64(r *rand.Rand, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = r.NormFloat64()
	}
	return s
}

func close32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: element %d is %g, gonum gives %g", what, i, got[i], want[i])
		}
	}
}

func close64(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(got[i] - want[i]); d > 1e-12*(1+math.Abs(want[i])) || math.IsNaN(got[i]) {
			t.Fatalf("%s: element %d is %g, gonum gives %g", what, i, got[i], want[i])
		}
	}
}

var transposes = []blas.Transpose{blas.NoTrans, blas.Trans}

// TestGemmAgreesWithGonum: the row-major to column-major swap is right for
// every transpose, odd sizes, padded leading dimensions, alpha and beta.
func TestGemmAgreesWithGonum(t *testing.T) {
	o := loaded(t)
	var g gonum.Implementation
	r := rand.New(rand.NewPCG(1, 2))
	for _, tA := range transposes {
		for _, tB := range transposes {
			for _, d := range [][3]int{{1, 1, 1}, {3, 5, 7}, {17, 9, 33}, {64, 31, 2}} {
				m, n, k := d[0], d[1], d[2]
				ar, ac := shape(tA, m, k)
				br, bc := shape(tB, k, n)
				lda, ldb, ldc := ac+2, bc+1, n+3
				a32, b32, c32 := randoms32(r, ar*lda), randoms32(r, br*ldb), randoms32(r, m*ldc)
				want32 := append([]float32(nil), c32...)
				g.Sgemm(tA, tB, m, n, k, 0.7, a32, lda, b32, ldb, -0.3, want32, ldc)
				o.Sgemm(tA, tB, m, n, k, 0.7, a32, lda, b32, ldb, -0.3, c32, ldc)
				close32(t, "Sgemm", c32, want32)

				a64, b64, c64 := randoms64(r, ar*lda), randoms64(r, br*ldb), randoms64(r, m*ldc)
				want64 := append([]float64(nil), c64...)
				g.Dgemm(tA, tB, m, n, k, 1.3, a64, lda, b64, ldb, 0.5, want64, ldc)
				o.Dgemm(tA, tB, m, n, k, 1.3, a64, lda, b64, ldb, 0.5, c64, ldc)
				close64(t, "Dgemm", c64, want64)
			}
		}
	}
}

// TestSgemmGivesCBLASBits: the Fortran entry point with swapped operands
// gives the very bits of cblas_sgemm in row-major order, the call a cgo
// build of pipetrain made, so runs compare bit for bit across the two.
func TestSgemmGivesCBLASBits(t *testing.T) {
	o := loaded(t)
	lib, err := purego.Dlopen(Library0(t), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	var cblasSgemm func(order, tA, tB, m, n, k int32, alpha float32, a *float32, lda int32, b *float32, ldb int32, beta float32, c *float32, ldc int32)
	purego.RegisterLibFunc(&cblasSgemm, lib, "cblas_sgemm")
	const rowMajor, noTrans, trans = 101, 111, 112
	cb := map[blas.Transpose]int32{blas.NoTrans: noTrans, blas.Trans: trans}
	r := rand.New(rand.NewPCG(3, 4))
	for _, tA := range transposes {
		for _, tB := range transposes {
			m, n, k := 32, 96, 200
			ar, ac := shape(tA, m, k)
			br, bc := shape(tB, k, n)
			a, b := randoms32(r, ar*ac), randoms32(r, br*bc)
			got, want := randoms32(r, m*n), make([]float32, m*n)
			copy(want, got)
			o.Sgemm(tA, tB, m, n, k, 1, a, ac, b, bc, 1, got, n)
			cblasSgemm(rowMajor, cb[tA], cb[tB], int32(m), int32(n), int32(k), 1, &a[0], int32(ac), &b[0], int32(bc), 1, &want[0], int32(n))
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("tA %v tB %v: element %d is %g, cblas_sgemm gives %g", tA, tB, i, got[i], want[i])
				}
			}
		}
	}
}

// Library0 is the name the loader found OpenBLAS under.
func Library0(t *testing.T) string {
	t.Helper()
	_, name, err := load(searched)
	if err != nil {
		testenv.RequireOrSkip(t, "OpenBLAS (Debian package libopenblas0, which make deps installs)", err.Error())
	}
	return name
}

// TestLevel1And2AgreeWithGonum covers the other routines gorgonia may call.
func TestLevel1And2AgreeWithGonum(t *testing.T) {
	o := loaded(t)
	var g gonum.Implementation
	r := rand.New(rand.NewPCG(5, 6))
	m, n := 13, 7
	for _, tA := range transposes {
		for _, inc := range []int{1, 2, -1} {
			xn, yn := n, m
			if tA == blas.Trans {
				xn, yn = m, n
			}
			abs := max(inc, -inc)
			a, x := randoms32(r, m*(n+1)), randoms32(r, (xn-1)*abs+1)
			y := randoms32(r, (yn-1)*abs+1)
			want := append([]float32(nil), y...)
			g.Sgemv(tA, m, n, 0.5, a, n+1, x, inc, 2, want, inc)
			o.Sgemv(tA, m, n, 0.5, a, n+1, x, inc, 2, y, inc)
			close32(t, "Sgemv", y, want)

			a64, x64 := randoms64(r, m*(n+1)), randoms64(r, (xn-1)*abs+1)
			y64 := randoms64(r, (yn-1)*abs+1)
			want64 := append([]float64(nil), y64...)
			g.Dgemv(tA, m, n, 0.5, a64, n+1, x64, inc, 2, want64, inc)
			o.Dgemv(tA, m, n, 0.5, a64, n+1, x64, inc, 2, y64, inc)
			close64(t, "Dgemv", y64, want64)
		}
	}
	x, y, a := randoms32(r, m), randoms32(r, n), randoms32(r, m*n)
	want := append([]float32(nil), a...)
	g.Sger(m, n, 1.5, x, 1, y, 1, want, n)
	o.Sger(m, n, 1.5, x, 1, y, 1, a, n)
	close32(t, "Sger", a, want)
	x64, y64, a64 := randoms64(r, m), randoms64(r, n), randoms64(r, m*n)
	want64 := append([]float64(nil), a64...)
	g.Dger(m, n, 1.5, x64, 1, y64, 1, want64, n)
	o.Dger(m, n, 1.5, x64, 1, y64, 1, a64, n)
	close64(t, "Dger", a64, want64)

	v, w := randoms32(r, 2*m), randoms32(r, m)
	if got, want := o.Sdot(m, v, 2, w, 1), g.Sdot(m, v, 2, w, 1); math.Abs(float64(got-want)) > 1e-4 {
		t.Errorf("Sdot %g, gonum %g", got, want)
	}
	v64, w64 := randoms64(r, m), randoms64(r, m)
	if got, want := o.Ddot(m, v64, 1, w64, 1), g.Ddot(m, v64, 1, w64, 1); math.Abs(got-want) > 1e-12 {
		t.Errorf("Ddot %g, gonum %g", got, want)
	}
	want = append([]float32(nil), w...)
	g.Saxpy(m, -2, v, 2, want, 1)
	o.Saxpy(m, -2, v, 2, w, 1)
	close32(t, "Saxpy", w, want)
	want64 = append([]float64(nil), w64...)
	g.Daxpy(m, -2, v64, 1, want64, 1)
	o.Daxpy(m, -2, v64, 1, w64, 1)
	close64(t, "Daxpy", w64, want64)
	want = append([]float32(nil), v...)
	g.Sscal(m, 3, want, 2)
	o.Sscal(m, 3, v, 2)
	close32(t, "Sscal", v, want)
	want64 = append([]float64(nil), v64...)
	g.Dscal(m, 3, want64, 1)
	o.Dscal(m, 3, v64, 1)
	close64(t, "Dscal", v64, want64)
}

// TestBadCallsPanicInGo: a call OpenBLAS would reject (printing, then
// returning as if it had computed) panics before reaching it.
func TestBadCallsPanicInGo(t *testing.T) {
	o := loaded(t)
	defer func() {
		if recover() == nil {
			t.Error("an Sgemm with too short a C did not panic")
		}
	}()
	o.Sgemm(blas.NoTrans, blas.NoTrans, 4, 4, 4, 1, make([]float32, 16), 4, make([]float32, 16), 4, 0, make([]float32, 15), 4)
}

// TestProductsAllocateNothing: a step's products take their scalars from a
// pool, keeping the steady state free of allocation.
func TestProductsAllocateNothing(t *testing.T) {
	o := loaded(t)
	a, b, c := make([]float32, 64), make([]float32, 64), make([]float32, 64)
	o.Sgemm(blas.NoTrans, blas.NoTrans, 8, 8, 8, 1, a, 8, b, 8, 0, c, 8)
	if n := testing.AllocsPerRun(100, func() {
		o.Sgemm(blas.NoTrans, blas.NoTrans, 8, 8, 8, 1, a, 8, b, 8, 0, c, 8)
	}); n != 0 {
		t.Errorf("Sgemm allocates %v times a call", n)
	}
}
