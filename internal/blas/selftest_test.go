package blas

import (
	"strings"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
)

// wrongKernel is gonum's BLAS with sgemm broken as a kernel set for the
// wrong CPU might be: it forgets B's transpose when A is transposed too.
type wrongKernel struct{ gonum.Implementation }

func (w wrongKernel) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if tA == blas.Trans && tB == blas.Trans && m == n && n == k {
		tB = blas.NoTrans
	}
	w.Implementation.Sgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// offByUlps is gonum's BLAS whose dgemm is wrong in one element by far
// more than rounding: the last element of a large product.
type offByUlps struct{ gonum.Implementation }

func (o offByUlps) Dgemm(tA, tB blas.Transpose, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	o.Implementation.Dgemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
	if m == 129 && n == 129 && k == 129 {
		c[(m-1)*ldc+n-1] *= 1 + 1e-9
	}
}

// reordered is a correct sgemm that sums in another order (by k from the
// top, in float32): a kernel set that rounds otherwise, which must pass.
type reordered struct{ gonum.Implementation }

func (reordered) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	at := func(x []float32, ld int, t blas.Transpose, i, j int) float32 {
		if t == blas.NoTrans {
			return x[i*ld+j]
		}
		return x[j*ld+i]
	}
	for i := range m {
		for j := range n {
			var s float32
			for l := k - 1; l >= 0; l-- {
				s += at(a, lda, tA, i, l) * at(b, ldb, tB, l, j)
			}
			if beta == 0 {
				c[i*ldc+j] = alpha * s
			} else {
				c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
			}
		}
	}
}

func TestSelfTestRefusesWrongKernels(t *testing.T) {
	if err := selfTest(wrongKernel{}); err == nil || !strings.Contains(err.Error(), "sgemm TT") {
		t.Errorf("a sgemm that ignores a transpose passed the self-test: %v", err)
	}
	if err := selfTest(offByUlps{}); err == nil || !strings.Contains(err.Error(), "dgemm") || !strings.Contains(err.Error(), "k=129") {
		t.Errorf("a dgemm off in one element passed the self-test: %v", err)
	}
	if err := selfTest(reordered{}); err != nil {
		t.Errorf("a correct sgemm that rounds otherwise failed the self-test: %v", err)
	}
}

// TestAutoRefusesAFailingSetAndTriesTheNext plays auto's choice with the
// self-test run on injected kernels instead of child processes: the best
// set computes wrongly and is refused, the next passes and is taken; when
// every better set fails, the library's choice stands and says why.
func TestAutoRefusesAFailingSetAndTriesTheNext(t *testing.T) {
	kernels := map[string]gemmer{"Cooperlake": wrongKernel{}, "SkylakeX": reordered{}, "Haswell": gonum.Implementation{}}
	rates := map[string]float64{"Cooperlake": 150, "SkylakeX": 120, "Haswell": 75}
	var tried []string
	try := func(core string) cores.Result {
		tried = append(tried, core)
		r := cores.Result{Core: core, Loaded: core}
		if err := selfTest(kernels[core]); err != nil {
			r.Err = "self-test: " + err.Error()
		} else {
			r.GFLOPS = rates[core]
		}
		return r
	}
	emerald := cores.CPU{Vendor: "GenuineIntel", Family: 6, Model: 207, AVX: true, AVX2: true, FMA: true, AVX512: true, AVX512BF16: true}
	candidates := []string{"Cooperlake", "SkylakeX", "Haswell"}
	c, why := decideAuto(emerald, candidates, "Prescott", 30, try)
	if c == nil || c.Core != "SkylakeX" || c.Library != "Prescott" || c.Speedup != 4 || !strings.Contains(c.Refused, "Cooperlake refused (self-test: sgemm TT") {
		t.Fatalf("chosen %+v (%s), want SkylakeX 4x after refusing Cooperlake", c, why)
	}
	if strings.Join(tried, ",") != "Cooperlake,SkylakeX" {
		t.Errorf("tried %v: the search should stop at the first set that passes", tried)
	}
	kernels["SkylakeX"], kernels["Haswell"] = offByUlps{}, wrongKernel{}
	tried = nil
	c, why = decideAuto(emerald, candidates, "Prescott", 30, try)
	if c != nil || !strings.Contains(why, "OpenBLAS chose Prescott") || !strings.Contains(why, "Haswell refused") || len(tried) != 3 {
		t.Errorf("every set failing: chosen %+v, why %q, tried %v; want the library's Prescott", c, why, tried)
	}
}
