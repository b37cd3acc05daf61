//go:build cgo && amd64 && !nosimd

package engine

/*
#cgo CFLAGS: -O2
#include <immintrin.h>
#include <stddef.h>

// Eight lanes at a time; each lane is the IEEE operation the Go loop does,
// so the results are the same bits. dst may be a or b.

static int pt_engine_has_avx(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx");
}

__attribute__((target("avx")))
static void pt_add_f32(float *dst, const float *a, const float *b, size_t n) {
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
	}
	for (; i < n; i++) dst[i] = a[i] + b[i];
}

__attribute__((target("avx")))
static void pt_mul_f32(float *dst, const float *a, const float *b, size_t n) {
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
	}
	for (; i < n; i++) dst[i] = a[i] * b[i];
}

// 1 where a >= s, else 0 (NaN compares false, as in Go).
__attribute__((target("avx")))
static void pt_gte_f32(float *dst, const float *a, float s, size_t n) {
	size_t i = 0;
	__m256 sv = _mm256_set1_ps(s), one = _mm256_set1_ps(1.0f);
	for (; i + 8 <= n; i += 8) {
		__m256 m = _mm256_cmp_ps(_mm256_loadu_ps(a + i), sv, _CMP_GE_OQ);
		_mm256_storeu_ps(dst + i, _mm256_and_ps(m, one));
	}
	for (; i < n; i++) dst[i] = a[i] >= s ? 1.0f : 0.0f;
}
*/
import "C"

import "unsafe"

var hasAVX = C.pt_engine_has_avx() != 0

func binary32(k binaryKernel, dst, a, b []float32) {
	n := len(dst)
	if !hasAVX || n < smallKernel {
		binaryGo(k, dst, a, b)
		return
	}
	a, b = a[:n], b[:n]
	d, x, y := (*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&a[0])), (*C.float)(unsafe.Pointer(&b[0]))
	switch k {
	case kernelAdd:
		C.pt_add_f32(d, x, y, C.size_t(n))
	case kernelMul:
		C.pt_mul_f32(d, x, y, C.size_t(n))
	}
}

func gteScalar32(dst, a []float32, s float32) {
	n := len(dst)
	if !hasAVX || n < smallKernel {
		gteScalarGo(dst, a, s)
		return
	}
	a = a[:n]
	C.pt_gte_f32((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&a[0])), C.float(s), C.size_t(n))
}
