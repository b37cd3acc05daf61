//go:build cgo && amd64 && !nosimd

package models

/*
#cgo CFLAGS: -O2
#include <immintrin.h>
#include <stddef.h>

// exp32 and tanh32 of fastmath.go, eight lanes at a time: each lane runs
// the Go function's operations in its order (no fused multiply-adds: the
// target has none), so the results are the same bits.

static int pt_models_has_avx2(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

__attribute__((target("avx2")))
static inline __m256 pt_exp8(__m256 x) {
	const __m256 magic = _mm256_set1_ps(12582912.0f);
	__m256 t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), magic);
	__m256 n = _mm256_sub_ps(t, magic);
	__m256i k = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
	__m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))), _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
	__m256 y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
	// 2^k for k <= 127; k = 128 as 2 · 2^127 (exact either way).
	__m256i big = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(127));
	k = _mm256_min_epi32(k, _mm256_set1_epi32(127));
	y = _mm256_mul_ps(y, _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(2.0f), _mm256_castsi256_ps(big)));
	__m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
	y = _mm256_mul_ps(y, scale);
	y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(88.72283f), _CMP_GT_OQ));
	y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ));
	return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2")))
static void pt_exp_f32(float *dst, const float *src, size_t n) {
	for (size_t i = 0; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, pt_exp8(_mm256_loadu_ps(src + i)));
	}
}

__attribute__((target("avx2")))
static void pt_tanh_f32(float *dst, const float *src, size_t n) {
	const __m256 one = _mm256_set1_ps(1.0f);
	for (size_t i = 0; i + 8 <= n; i += 8) {
		__m256 x = _mm256_loadu_ps(src + i);
		__m256 e = pt_exp8(_mm256_mul_ps(_mm256_set1_ps(2.0f), x));
		__m256 y = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
		y = _mm256_blendv_ps(y, one, _mm256_cmp_ps(x, _mm256_set1_ps(9.0f), _CMP_GT_OQ));
		y = _mm256_blendv_ps(y, _mm256_set1_ps(-1.0f), _mm256_cmp_ps(x, _mm256_set1_ps(-9.0f), _CMP_LT_OQ));
		_mm256_storeu_ps(dst + i, y);
	}
}
*/
import "C"

import "unsafe"

var hasAVX2 = C.pt_models_has_avx2() != 0

// exp32s sets dst[i] = exp32(src[i]); dst may be src.
func exp32s(dst, src []float32) {
	n := len(dst)
	src = src[:n]
	done := 0
	if hasAVX2 && n >= 8 {
		done = n &^ 7
		C.pt_exp_f32((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&src[0])), C.size_t(done))
	}
	for i := done; i < n; i++ {
		dst[i] = exp32(src[i])
	}
}

// tanh32s sets dst[i] = tanh32(src[i]); dst may be src.
func tanh32s(dst, src []float32) {
	n := len(dst)
	src = src[:n]
	done := 0
	if hasAVX2 && n >= 8 {
		done = n &^ 7
		C.pt_tanh_f32((*C.float)(unsafe.Pointer(&dst[0])), (*C.float)(unsafe.Pointer(&src[0])), C.size_t(done))
	}
	for i := done; i < n; i++ {
		dst[i] = tanh32(src[i])
	}
}
