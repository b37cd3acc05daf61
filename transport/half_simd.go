//go:build cgo && amd64 && !nosimd

package transport

/*
#cgo CFLAGS: -O2
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

// The casts of a compressed link, 8 values at a time. F16C's conversions are
// IEEE's: round to nearest even, subnormals kept, NaNs quieted with their
// payload truncated, which is what the Go code in compress.go does too.

static int pt_has_simd(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

__attribute__((target("avx2,f16c")))
static void pt_to_f16(const float *src, uint16_t *dst, size_t n) {
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(dst + i), h);
	}
	for (; i < n; i++) {
		dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	}
}

__attribute__((target("avx2,f16c")))
static void pt_from_f16(const uint16_t *src, float *dst, size_t n) {
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	}
	for (; i < n; i++) {
		dst[i] = _cvtsh_ss(src[i]);
	}
}

// bfloat16 is float32's top half, rounded to nearest even; a NaN keeps its
// top half with the quiet bit set.
__attribute__((target("avx2")))
static void pt_to_bf16(const float *src, uint16_t *dst, size_t n) {
	const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i quiet = _mm256_set1_epi32(0x40);
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i b = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
		__m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, lsb)), 16);
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);
		__m256i kept = _mm256_or_si256(_mm256_srli_epi32(b, 16), quiet);
		__m256i h = _mm256_blendv_epi8(rounded, kept, nan);
		// 8 x 32 -> 8 x 16 bits: pack within lanes, then gather the lanes.
		__m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
		_mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(packed));
	}
	for (; i < n; i++) {
		uint32_t b;
		__builtin_memcpy(&b, src + i, 4);
		if ((b & 0x7fffffff) > 0x7f800000) {
			dst[i] = (uint16_t)(b >> 16) | 0x40;
		} else {
			dst[i] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
		}
	}
}

__attribute__((target("avx2")))
static void pt_from_bf16(const uint16_t *src, float *dst, size_t n) {
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
		_mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
	}
	for (; i < n; i++) {
		uint32_t b = (uint32_t)src[i] << 16;
		__builtin_memcpy(dst + i, &b, 4);
	}
}
*/
import "C"

import "unsafe"

// simdCasts says whether this CPU has the AVX2 and F16C instructions the C
// casts use; without them the Go loops run.
var simdCasts = C.pt_has_simd() != 0

// minSIMD is the smallest tensor worth a cgo call (about 50 ns).
const minSIMD = 256

// CastsUsed names the casts this binary uses on this CPU (for reports):
// "avx2+f16c", or "go" for the Go loops.
func CastsUsed() string {
	if simdCasts {
		return "avx2+f16c"
	}
	return "go"
}

func encodeHalvesSIMD(dt DType, vals []float32, halves []uint16) bool {
	if !simdCasts || len(vals) < minSIMD {
		return false
	}
	src, dst, n := (*C.float)(unsafe.Pointer(&vals[0])), (*C.uint16_t)(unsafe.Pointer(&halves[0])), C.size_t(len(vals))
	if dt == Float16 {
		C.pt_to_f16(src, dst, n)
	} else {
		C.pt_to_bf16(src, dst, n)
	}
	return true
}

func decodeHalvesSIMD(dt DType, halves []uint16, vals []float32) bool {
	if !simdCasts || len(vals) < minSIMD {
		return false
	}
	src, dst, n := (*C.uint16_t)(unsafe.Pointer(&halves[0])), (*C.float)(unsafe.Pointer(&vals[0])), C.size_t(len(vals))
	if dt == Float16 {
		C.pt_from_f16(src, dst, n)
	} else {
		C.pt_from_bf16(src, dst, n)
	}
	return true
}
