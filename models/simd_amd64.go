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

// The fused ops' float32 loops (fused.go), eight lanes at a time, each
// lane the Go loop's operations in its order.

__attribute__((target("avx2")))
static void pt_add_rows_f32(float *out, const float *x, const float *b, size_t n, size_t d) {
	for (size_t r = 0; r < n; r++) {
		const float *xr = x + r * d;
		float *outr = out + r * d;
		size_t j = 0;
		for (; j + 8 <= d; j += 8) _mm256_storeu_ps(outr + j, _mm256_add_ps(_mm256_loadu_ps(xr + j), _mm256_loadu_ps(b + j)));
		for (; j < d; j++) outr[j] = xr[j] + b[j];
	}
}

__attribute__((target("avx2")))
static void pt_col_sum_f32(float *out, const float *x, size_t n, size_t d) {
	for (size_t j = 0; j < d; j++) out[j] = 0;
	for (size_t r = 0; r < n; r++) {
		const float *xr = x + r * d;
		size_t j = 0;
		for (; j + 8 <= d; j += 8) _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j), _mm256_loadu_ps(xr + j)));
		for (; j < d; j++) out[j] += xr[j];
	}
}

// u = c·(v + k·v·v·v), the argument of GELU's tanh.
__attribute__((target("avx2")))
static inline __m256 pt_gelu_arg8(__m256 v, __m256 c, __m256 k) {
	return _mm256_mul_ps(c, _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(k, v), v), v)));
}

__attribute__((target("avx2")))
static inline __m256 pt_tanh8(__m256 x) {
	const __m256 one = _mm256_set1_ps(1.0f);
	__m256 e = pt_exp8(_mm256_mul_ps(_mm256_set1_ps(2.0f), x));
	__m256 y = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
	y = _mm256_blendv_ps(y, one, _mm256_cmp_ps(x, _mm256_set1_ps(9.0f), _CMP_GT_OQ));
	return _mm256_blendv_ps(y, _mm256_set1_ps(-1.0f), _mm256_cmp_ps(x, _mm256_set1_ps(-9.0f), _CMP_LT_OQ));
}

// out = 0.5·v·(1 + t) over the first n (a multiple of 8).
__attribute__((target("avx2")))
static void pt_gelu_f32(float *out, const float *x, size_t n, float c, float k) {
	const __m256 cv = _mm256_set1_ps(c), kv = _mm256_set1_ps(k), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
	for (size_t i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256 t = pt_tanh8(pt_gelu_arg8(v, cv, kv));
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
	}
}

// out = dy·(0.5·(1 + t) + 0.5·v·(1 − t·t)·c·(1 + k3·v·v)) over the first n.
__attribute__((target("avx2")))
static void pt_gelu_grad_f32(float *out, const float *x, const float *dy, size_t n, float c, float k, float k3) {
	const __m256 cv = _mm256_set1_ps(c), kv = _mm256_set1_ps(k), k3v = _mm256_set1_ps(k3), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
	for (size_t i = 0; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256 t = pt_tanh8(pt_gelu_arg8(v, cv, kv));
		__m256 a = _mm256_mul_ps(half, _mm256_add_ps(one, t));
		__m256 b = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_sub_ps(one, _mm256_mul_ps(t, t))), cv);
		b = _mm256_mul_ps(b, _mm256_add_ps(one, _mm256_mul_ps(_mm256_mul_ps(k3v, v), v)));
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_add_ps(a, b)));
	}
}
__attribute__((target("avx2")))
static void pt_tanh_f32(float *dst, const float *src, size_t n) {
	for (size_t i = 0; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, pt_tanh8(_mm256_loadu_ps(src + i)));
	}
}

// sum of fastmath.go: four running sums, in its order.
static float pt_sum4(const float *v, size_t n) {
	float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i = 0;
	for (; i + 4 <= n; i += 4) {
		s0 += v[i];
		s1 += v[i + 1];
		s2 += v[i + 2];
		s3 += v[i + 3];
	}
	for (; i < n; i++) s0 += v[i];
	return (s0 + s1) + (s2 + s3);
}

// causalSoftmax of fused.go on a t×t block of scores, in place.
__attribute__((target("avx2")))
static void pt_causal_softmax_f32(float *p, size_t t) {
	for (size_t i = 0; i < t; i++) {
		float *row = p + i * t;
		float m = row[0];
		for (size_t j = 1; j <= i; j++) m = row[j] > m ? row[j] : m;
		for (size_t j = 0; j <= i; j++) row[j] -= m;
		for (size_t j = i + 1; j < t; j++) row[j] = -__builtin_inff();
	}
	size_t n = t * t, i = 0;
	for (; i + 8 <= n; i += 8) _mm256_storeu_ps(p + i, pt_exp8(_mm256_loadu_ps(p + i)));
	if (i < n) {
		float tail[8] = {0};
		for (size_t j = i; j < n; j++) tail[j - i] = p[j];
		_mm256_storeu_ps(tail, pt_exp8(_mm256_loadu_ps(tail)));
		for (size_t j = i; j < n; j++) p[j] = tail[j - i];
	}
	for (size_t i = 0; i < t; i++) {
		float *row = p + i * t;
		float inv = 1 / pt_sum4(row, i + 1);
		for (size_t j = 0; j <= i; j++) row[j] *= inv;
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

// addRows32 sets out[r·d+j] = x[r·d+j] + b[j].
func addRows32(out, x, b []float32, d int) {
	if !hasAVX2 || len(out) < 64 {
		addRowsGo(out, x, b, d)
		return
	}
	x = x[:len(out)]
	C.pt_add_rows_f32(fptr(out), fptr(x), fptr(b[:d]), C.size_t(len(out)/d), C.size_t(d))
}

// colSum32 sets out[j] to the sum over rows of x[r·d+j], row after row.
func colSum32(out, x []float32, d int) {
	if !hasAVX2 || len(x) < 64 || len(x) == 0 {
		colSumGo(out, x, d)
		return
	}
	C.pt_col_sum_f32(fptr(out[:d]), fptr(x), C.size_t(len(x)/d), C.size_t(d))
}

// gelu32 sets out[i] to GELU of x[i].
func gelu32(out, x []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		C.pt_gelu_f32(fptr(out), fptr(x[:len(out)]), C.size_t(done), C.float(geluC32), C.float(geluK32))
	}
	geluGo(out[done:], x[done:len(out)])
}

// geluGrad32 sets out[i] to dy[i] times GELU's derivative at x[i].
func geluGrad32(out, x, dy []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		C.pt_gelu_grad_f32(fptr(out), fptr(x[:len(out)]), fptr(dy[:len(out)]), C.size_t(done), C.float(geluC32), C.float(geluK32), C.float(geluK332))
	}
	geluGradGo(out[done:], x[done:len(out)], dy[done:len(out)])
}

func fptr(v []float32) *C.float { return (*C.float)(unsafe.Pointer(&v[0])) }

// causalSoftmax32 is causalSoftmaxGo on float32 scores.
func causalSoftmax32(p []float32, t int) {
	if !hasAVX2 {
		causalSoftmaxGo(p, t)
		return
	}
	C.pt_causal_softmax_f32(fptr(p[:t*t]), C.size_t(t))
}

// Kernels names the float32 loops this process runs: the AVX2 kernels, or
// the Go loops where the CPU lacks AVX2 (the same bits either way).
func Kernels() string {
	if hasAVX2 {
		return "avx2"
	}
	return "go (this CPU has no AVX2)"
}
