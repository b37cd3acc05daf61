package blas

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// gemmer is what the self-test checks: the products a model computes with.
type gemmer interface {
	Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	Dgemm(tA, tB blas.Transpose, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int)
}

// selfTestSizes are the dimensions the self-test takes m, n and k from: 1,
// and sizes just past the blocks kernels unroll by (4, 8, 16, 32, 128), so
// every kernel's edge code runs.
var selfTestSizes = []int{1, 7, 33, 129}

// selfTest compares g's sgemm and dgemm with gonum's Go kernels in every
// transpose on every m, n, k of selfTestSizes, with leading dimensions
// larger than the rows and alpha, beta both away from 1 and 0 (and beta 0 on
// a C of NaNs, which BLAS must not read). Kernel sets round differently, so
// an element may differ by float rounding scaled by k: with every operand's
// elements in [-1, 1] the bound is 2(k+2)·eps·(|alpha|·k + |beta|), far
// below what a wrong kernel gets wrong (a transpose, an edge, a block). The
// first difference beyond it is the error.
func selfTest(g gemmer) error {
	rng := rand.New(rand.NewPCG(1, 2))
	ref := gonum.Implementation{}
	trans := []blas.Transpose{blas.NoTrans, blas.Trans}
	i := 0
	for _, m := range selfTestSizes {
		for _, n := range selfTestSizes {
			for _, k := range selfTestSizes {
				for _, tA := range trans {
					for _, tB := range trans {
						beta := 0.5
						if i%5 == 0 {
							beta = 0
						}
						i++
						if err := checkGemm32(g, ref, rng, tA, tB, m, n, k, beta); err != nil {
							return err
						}
						if err := checkGemm64(g, ref, rng, tA, tB, m, n, k, beta); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// operand is a random stored r×c row-major matrix with leading dimension
// c+3, its elements in [-1, 1].
func operand[T float32 | float64](rng *rand.Rand, r, c int) (x []T, ld int) {
	ld = c + 3
	x = make([]T, r*ld)
	for i := range x {
		x[i] = T(2*rng.Float64() - 1)
	}
	return x, ld
}

func stored(t blas.Transpose, r, c int) (int, int) {
	if t == blas.NoTrans {
		return r, c
	}
	return c, r
}

func checkGemm32(g gemmer, ref gonum.Implementation, rng *rand.Rand, tA, tB blas.Transpose, m, n, k int, beta float64) error {
	ar, ac := stored(tA, m, k)
	br, bc := stored(tB, k, n)
	a, lda := operand[float32](rng, ar, ac)
	b, ldb := operand[float32](rng, br, bc)
	c, ldc := operand[float32](rng, m, n)
	if beta == 0 {
		for i := range c {
			c[i] = float32(math.NaN())
		}
	}
	want := append([]float32(nil), c...)
	const alpha = -1.5
	g.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, float32(beta), c, ldc)
	ref.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, float32(beta), want, ldc)
	tol := 2 * float64(k+2) * 0x1p-24 * (1.5*float64(k) + beta)
	return compare("sgemm", tA, tB, m, n, k, ldc, c, want, tol)
}

func checkGemm64(g gemmer, ref gonum.Implementation, rng *rand.Rand, tA, tB blas.Transpose, m, n, k int, beta float64) error {
	ar, ac := stored(tA, m, k)
	br, bc := stored(tB, k, n)
	a, lda := operand[float64](rng, ar, ac)
	b, ldb := operand[float64](rng, br, bc)
	c, ldc := operand[float64](rng, m, n)
	if beta == 0 {
		for i := range c {
			c[i] = math.NaN()
		}
	}
	want := append([]float64(nil), c...)
	const alpha = -1.5
	g.Dgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	ref.Dgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
	tol := 2 * float64(k+2) * 0x1p-53 * (1.5*float64(k) + beta)
	return compare("dgemm", tA, tB, m, n, k, ldc, c, want, tol)
}

// compare checks C's m×n elements (the padding past n must be untouched
// too: a kernel that writes there corrupts a neighbouring row).
func compare[T float32 | float64](what string, tA, tB blas.Transpose, m, n, k, ldc int, got, want []T, tol float64) error {
	for i := range m {
		for j := range ldc {
			at := i*ldc + j
			g, w := float64(got[at]), float64(want[at])
			if j >= n {
				if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
					return fmt.Errorf("%s %s%s m=%d n=%d k=%d wrote C[%d][%d], past its %d columns", what, letter(tA), letter(tB), m, n, k, i, j, n)
				}
				continue
			}
			if math.Abs(g-w) > tol || math.IsNaN(g) {
				return fmt.Errorf("%s %s%s m=%d n=%d k=%d: C[%d][%d] is %g, the Go kernels give %g (tolerance %.2g)", what, letter(tA), letter(tB), m, n, k, i, j, g, w, tol)
			}
		}
	}
	return nil
}

// sgemmRate is g's single-call sgemm speed in GFLOP/s on a 128×512×512
// product (a micro-batch of 128 through a 512-wide layer): the best of 10
// timed calls after one to warm up, a few milliseconds in all.
func sgemmRate(g gemmer) float64 {
	const m, n, k = 128, 512, 512
	a, b, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	for i := range b {
		b[i] = float32(i%5) - 2
	}
	best := time.Duration(math.MaxInt64)
	for i := range 11 {
		start := time.Now()
		g.Sgemm(blas.NoTrans, blas.NoTrans, m, n, k, 1, a, k, b, n, 0, c, n)
		if d := time.Since(start); i > 0 && d < best {
			best = d
		}
	}
	return 2 * m * n * k / best.Seconds() / 1e9
}

// letter is the transpose as BLAS's character names it.
func letter(t blas.Transpose) string {
	if t == blas.NoTrans {
		return "N"
	}
	return "T"
}
