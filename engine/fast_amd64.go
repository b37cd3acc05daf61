//go:build amd64 && !nosimd

package engine

import "golang.org/x/sys/cpu"

// hasAVX says whether this CPU (and its OS) runs the eight-lane kernels of
// fast_amd64.s, which use AVX alone.
var hasAVX = cpu.X86.HasAVX

// The kernels of fast_amd64.s run over the first n&^7 elements; the rest is
// left to the caller. dst may be a or b.

//go:noescape
func addAVX(dst, a, b *float32, n int)

//go:noescape
func mulAVX(dst, a, b *float32, n int)

//go:noescape
func gteAVX(dst, a *float32, s float32, n int)

func binary32(k binaryKernel, dst, a, b []float32) {
	n := len(dst)
	if !hasAVX || n < 8 {
		binaryGo(k, dst, a, b)
		return
	}
	a, b = a[:n], b[:n]
	switch k {
	case kernelAdd:
		addAVX(&dst[0], &a[0], &b[0], n)
	case kernelMul:
		mulAVX(&dst[0], &a[0], &b[0], n)
	}
	done := n &^ 7
	binaryGo(k, dst[done:], a[done:], b[done:])
}

func gteScalar32(dst, a []float32, s float32) {
	n := len(dst)
	if !hasAVX || n < 8 {
		gteScalarGo(dst, a, s)
		return
	}
	a = a[:n]
	gteAVX(&dst[0], &a[0], s, n)
	done := n &^ 7
	gteScalarGo(dst[done:], a[done:], s)
}
