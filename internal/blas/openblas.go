//go:build (linux || darwin || freebsd) && !nodlopen

package blas

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// openBLAS is gorgonia's BLAS with the routines a model computes with
// answered by a system OpenBLAS loaded at run time, and the rest by gonum.
//
// The calls go to OpenBLAS's Fortran entry points (sgemm_ and its kind),
// which take every argument by reference: purego passes integer-class
// arguments without cgo and without reflection, and the C interface's float
// arguments would need both. Row-major calls become column-major ones on the
// transposed problem, the swap cblas_sgemm makes itself, so the kernels
// receive the operands cblas would hand them.
type openBLAS struct {
	gonum.Implementation
	fn struct {
		sgemm, dgemm, sgemv, dgemv, sger, dger, saxpy, daxpy, sscal, dscal, sdot, ddot uintptr
	}
	setThreadsFn uintptr
	// lib is the library's handle, for the symbols the kernel choice reads.
	lib   uintptr
	sdotC func(n int32, x uintptr, incX int32, y uintptr, incY int32) float32
	ddotC func(n int32, x uintptr, incX int32, y uintptr, incY int32) float64
}

// missingHint follows the reason no OpenBLAS was found.
const missingHint = "; Debian's libopenblas0 gives several times the speed"

// load opens the first of names that is a usable OpenBLAS.
func load(names []string) (*openBLAS, string, error) {
	var problems []string
	for _, name := range names {
		lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		impl, err := resolve(lib)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			purego.Dlclose(lib)
			continue
		}
		return impl, name, nil
	}
	return nil, "", errors.New(strings.Join(problems, "; "))
}

func resolve(lib uintptr) (*openBLAS, error) {
	o := &openBLAS{lib: lib}
	for _, s := range []struct {
		name string
		at   *uintptr
	}{
		{"sgemm_", &o.fn.sgemm}, {"dgemm_", &o.fn.dgemm}, {"sgemv_", &o.fn.sgemv}, {"dgemv_", &o.fn.dgemv},
		{"sger_", &o.fn.sger}, {"dger_", &o.fn.dger}, {"saxpy_", &o.fn.saxpy}, {"daxpy_", &o.fn.daxpy},
		{"sscal_", &o.fn.sscal}, {"dscal_", &o.fn.dscal}, {"cblas_sdot", &o.fn.sdot}, {"cblas_ddot", &o.fn.ddot},
		{"openblas_set_num_threads", &o.setThreadsFn},
	} {
		p, err := purego.Dlsym(lib, s.name)
		if err != nil {
			return nil, fmt.Errorf("not an OpenBLAS: no %s", s.name)
		}
		*s.at = p
	}
	// The dots return their result in a float register, which only purego's
	// reflective calls read; they are rare (vector-vector products).
	purego.RegisterFunc(&o.sdotC, o.fn.sdot)
	purego.RegisterFunc(&o.ddotC, o.fn.ddot)
	return o, nil
}

func (o *openBLAS) setThreads(n int) {
	purego.SyscallN(o.setThreadsFn, uintptr(n))
}

// args holds a call's scalars: the Fortran interface wants their addresses.
// Calls take one from a pool, so a step's products allocate nothing.
type args struct {
	tA, tB                 byte
	m, n, k, lda, ldb, ldc int32
	incX, incY             int32
	alpha, beta            float64 // or a float32 in their first half
	// call is the argument list: a variadic call would allocate its own.
	call [15]uintptr
}

// do calls fn with as: the addresses of p's scalars and the operands.
func (p *args) do(fn uintptr, as ...uintptr) {
	n := copy(p.call[:], as)
	purego.SyscallN(fn, p.call[:n]...)
}

var argPool = sync.Pool{New: func() any { return new(args) }}

// dim converts a dimension to the 32-bit integers OpenBLAS's LP64 interface
// takes; gonum's checks have bounded it by a slice length already.
func dim(n int) int32 {
	if n < 0 || n > 1<<31-1 {
		panic(fmt.Sprintf("blas: dimension %d out of OpenBLAS's 32-bit range", n))
	}
	return int32(n)
}

func ptr[T any](v *T) uintptr { return uintptr(unsafe.Pointer(v)) }

// first is the address of s's first element, or 0 for an empty slice, which
// BLAS only receives where it reads nothing.
func first[T float32 | float64](s []T) uintptr {
	if len(s) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&s[0]))
}

// flag is the Fortran character for t.
func flag(t blas.Transpose) byte {
	switch t {
	case blas.NoTrans:
		return 'N'
	case blas.Trans:
		return 'T'
	case blas.ConjTrans:
		return 'C'
	}
	panic(fmt.Sprintf("blas: bad transpose %v", t))
}

// flip is the transpose that reads a row-major matrix as the column-major
// one it is the transpose of.
func flip(t blas.Transpose) byte {
	if t == blas.NoTrans {
		return 'T'
	}
	return 'N'
}

// The trailing 1s are the hidden lengths of the character arguments that
// Fortran compilers append; OpenBLAS's C-written entry points ignore them.

// scalars stores alpha and beta in p as T, for their addresses: a float32
// occupies the first half of the float64 slot.
func scalars[T float32 | float64](p *args, alpha, beta T) (uintptr, uintptr) {
	*(*T)(unsafe.Pointer(&p.alpha)) = alpha
	*(*T)(unsafe.Pointer(&p.beta)) = beta
	return ptr(&p.alpha), ptr(&p.beta)
}

func gemm[T float32 | float64](fn uintptr, tA, tB blas.Transpose, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	checkGemm(tA, tB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 {
		return
	}
	p := argPool.Get().(*args)
	p.tA, p.tB, p.m, p.n, p.k = flag(tB), flag(tA), dim(n), dim(m), dim(k)
	p.lda, p.ldb, p.ldc = dim(ldb), dim(lda), dim(ldc)
	pa, pb := scalars(p, alpha, beta)
	p.do(fn, ptr(&p.tA), ptr(&p.tB), ptr(&p.m), ptr(&p.n), ptr(&p.k), pa,
		first(b), ptr(&p.lda), first(a), ptr(&p.ldb), pb, first(c), ptr(&p.ldc), 1, 1)
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
	argPool.Put(p)
}

// Row-major y = alpha·op(A)·x + beta·y is, on the column-major transpose of
// A (n×m), the opposite transpose.
func gemv[T float32 | float64](fn uintptr, tA blas.Transpose, m, n int, alpha T, a []T, lda int, x []T, incX int, beta T, y []T, incY int) {
	checkGemv(tA, m, n, len(a), lda, len(x), incX, len(y), incY)
	if m == 0 || n == 0 {
		return
	}
	p := argPool.Get().(*args)
	p.tA, p.m, p.n, p.lda, p.incX, p.incY = flip(tA), dim(n), dim(m), dim(lda), int32(incX), int32(incY)
	pa, pb := scalars(p, alpha, beta)
	p.do(fn, ptr(&p.tA), ptr(&p.m), ptr(&p.n), pa, first(a), ptr(&p.lda), first(x), ptr(&p.incX), pb, first(y), ptr(&p.incY), 1)
	runtime.KeepAlive(a)
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	argPool.Put(p)
}

// Row-major A += alpha·x·yᵀ is column-major Aᵀ += alpha·y·xᵀ.
func ger[T float32 | float64](fn uintptr, m, n int, alpha T, x []T, incX int, y []T, incY int, a []T, lda int) {
	checkGer(m, n, len(x), incX, len(y), incY, len(a), lda)
	if m == 0 || n == 0 {
		return
	}
	p := argPool.Get().(*args)
	p.m, p.n, p.incX, p.incY, p.lda = dim(n), dim(m), int32(incY), int32(incX), dim(lda)
	pa, _ := scalars(p, alpha, 0)
	p.do(fn, ptr(&p.m), ptr(&p.n), pa, first(y), ptr(&p.incX), first(x), ptr(&p.incY), first(a), ptr(&p.lda))
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	runtime.KeepAlive(a)
	argPool.Put(p)
}

func axpy[T float32 | float64](fn uintptr, n int, alpha T, x []T, incX int, y []T, incY int) {
	checkVecs(n, len(x), incX, len(y), incY)
	if n == 0 {
		return
	}
	p := argPool.Get().(*args)
	p.n, p.incX, p.incY = dim(n), int32(incX), int32(incY)
	pa, _ := scalars(p, alpha, 0)
	p.do(fn, ptr(&p.n), pa, first(x), ptr(&p.incX), first(y), ptr(&p.incY))
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	argPool.Put(p)
}

// scal takes positive increments only: gonum answers the others (its
// checks, and a no-op), which the Fortran interface would not.
func scal[T float32 | float64](fn uintptr, n int, alpha T, x []T, incX int) {
	checkVecs(n, len(x), incX, len(x), incX)
	if n == 0 {
		return
	}
	p := argPool.Get().(*args)
	p.n, p.incX = dim(n), int32(incX)
	pa, _ := scalars(p, alpha, 0)
	p.do(fn, ptr(&p.n), pa, first(x), ptr(&p.incX))
	runtime.KeepAlive(x)
	argPool.Put(p)
}

func (o *openBLAS) Sgemm(tA, tB blas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gemm(o.fn.sgemm, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func (o *openBLAS) Dgemm(tA, tB blas.Transpose, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) {
	gemm(o.fn.dgemm, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func (o *openBLAS) Sgemv(tA blas.Transpose, m, n int, alpha float32, a []float32, lda int, x []float32, incX int, beta float32, y []float32, incY int) {
	gemv(o.fn.sgemv, tA, m, n, alpha, a, lda, x, incX, beta, y, incY)
}

func (o *openBLAS) Dgemv(tA blas.Transpose, m, n int, alpha float64, a []float64, lda int, x []float64, incX int, beta float64, y []float64, incY int) {
	gemv(o.fn.dgemv, tA, m, n, alpha, a, lda, x, incX, beta, y, incY)
}

func (o *openBLAS) Sger(m, n int, alpha float32, x []float32, incX int, y []float32, incY int, a []float32, lda int) {
	ger(o.fn.sger, m, n, alpha, x, incX, y, incY, a, lda)
}

func (o *openBLAS) Dger(m, n int, alpha float64, x []float64, incX int, y []float64, incY int, a []float64, lda int) {
	ger(o.fn.dger, m, n, alpha, x, incX, y, incY, a, lda)
}

func (o *openBLAS) Saxpy(n int, alpha float32, x []float32, incX int, y []float32, incY int) {
	axpy(o.fn.saxpy, n, alpha, x, incX, y, incY)
}

func (o *openBLAS) Daxpy(n int, alpha float64, x []float64, incX int, y []float64, incY int) {
	axpy(o.fn.daxpy, n, alpha, x, incX, y, incY)
}

func (o *openBLAS) Sscal(n int, alpha float32, x []float32, incX int) {
	if incX <= 0 {
		o.Implementation.Sscal(n, alpha, x, incX)
		return
	}
	scal(o.fn.sscal, n, alpha, x, incX)
}

func (o *openBLAS) Dscal(n int, alpha float64, x []float64, incX int) {
	if incX <= 0 {
		o.Implementation.Dscal(n, alpha, x, incX)
		return
	}
	scal(o.fn.dscal, n, alpha, x, incX)
}

func (o *openBLAS) Sdot(n int, x []float32, incX int, y []float32, incY int) float32 {
	checkVecs(n, len(x), incX, len(y), incY)
	if n == 0 {
		return 0
	}
	r := o.sdotC(int32(n), first(x), int32(incX), first(y), int32(incY))
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	return r
}

func (o *openBLAS) Ddot(n int, x []float64, incX int, y []float64, incY int) float64 {
	checkVecs(n, len(x), incX, len(y), incY)
	if n == 0 {
		return 0
	}
	r := o.ddotC(int32(n), first(x), int32(incX), first(y), int32(incY))
	runtime.KeepAlive(x)
	runtime.KeepAlive(y)
	return r
}
