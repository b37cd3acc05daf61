//go:build amd64 && !nosimd

package transport

import "golang.org/x/sys/cpu"

// The casts of half_amd64.s, chosen from this CPU's features: fp16 needs
// F16C (and the OS's AVX state, which its 256-bit forms use), bf16 AVX2's
// integer lanes. F16C is CPUID leaf 1's ECX bit 29; x/sys/cpu does not
// report it.
var (
	simdF16  = cpu.X86.HasAVX && cpuid1ECX()&(1<<29) != 0
	simdBF16 = cpu.X86.HasAVX2
)

func cpuid1ECX() uint32

// Each converts n values, eight at a time and then one at a time, with the
// instructions' IEEE conversions (fp16) or float32's top half rounded to
// nearest even (bf16), the bits of the Go conversions in compress.go.

//go:noescape
func toF16(dst *uint16, src *float32, n int)

//go:noescape
func fromF16(dst *float32, src *uint16, n int)

//go:noescape
func toBF16(dst *uint16, src *float32, n int)

//go:noescape
func fromBF16(dst *float32, src *uint16, n int)

// vectorCasts says whether the casts to and from dt run as vector code.
func vectorCasts(dt DType) bool {
	if dt == Float16 {
		return simdF16
	}
	return simdBF16
}

// CastsUsed names the casts this binary uses on this CPU (for reports):
// "avx2+f16c", "go" for the Go loops, or which format has which.
func CastsUsed() string {
	switch {
	case simdF16 && simdBF16:
		return "avx2+f16c"
	case simdF16:
		return "f16c for fp16, go for bf16 (this CPU has no AVX2)"
	case simdBF16:
		return "avx2 for bf16, go for fp16 (this CPU has no F16C)"
	}
	return "go"
}

func encodeHalvesSIMD(dt DType, vals []float32, halves []uint16) bool {
	n := len(vals)
	if n == 0 || !vectorCasts(dt) {
		return false
	}
	halves = halves[:n]
	if dt == Float16 {
		toF16(&halves[0], &vals[0], n)
	} else {
		toBF16(&halves[0], &vals[0], n)
	}
	return true
}

func decodeHalvesSIMD(dt DType, halves []uint16, vals []float32) bool {
	n := len(vals)
	if n == 0 || !vectorCasts(dt) {
		return false
	}
	halves = halves[:n]
	if dt == Float16 {
		fromF16(&vals[0], &halves[0], n)
	} else {
		fromBF16(&vals[0], &halves[0], n)
	}
	return true
}
