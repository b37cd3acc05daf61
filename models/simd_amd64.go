//go:build amd64 && !nosimd

package models

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The vector kernels of simd_amd64.s, chosen from this CPU's features: the
// row and column sums need AVX, the rest AVX2's integer lanes for exp's
// exponent. Each lane computes the Go loop's bits.
var (
	hasAVX  = cpu.X86.HasAVX
	hasAVX2 = cpu.X86.HasAVX2
)

// expAVX2, tanhAVX2, geluAVX2, geluGradAVX2 and the swiglu kernels run
// over the first n&^7 elements; the others over all of theirs.

//go:noescape
func expAVX2(dst, src *float32, n int)

//go:noescape
func tanhAVX2(dst, src *float32, n int)

//go:noescape
func geluAVX2(out, x *float32, n int, c, k float32)

//go:noescape
func geluGradAVX2(out, x, dy *float32, n int, c, k, k3 float32)

//go:noescape
func addRowsAVX(out, x, b *float32, n, d int)

//go:noescape
func colSumAVX(out, x *float32, n, d int)

//go:noescape
func causalSoftmaxAVX2(p *float32, t, ld int)

//go:noescape
func swigluAVX2(out, gate, up *float32, n int)

// The row kernels of RMSNorm and the rotary embedding (AVX) run over the
// first n&^7 elements.

//go:noescape
func rmsScaleRowAVX(out, x, gain *float32, n int, rstd float32)

//go:noescape
func rmsInputGradRowAVX(out, x, dy, gain *float32, n int, rstd, mgx float32)

//go:noescape
func rmsGainGradRowAVX(out, x, dy *float32, n int, rstd float32)

//go:noescape
func ropeRowAVX(o1, o2, x1, x2, c, sn *float32, n int)

//go:noescape
func swigluGateGradAVX2(out, gate, up, dy *float32, n int)

//go:noescape
func swigluUpGradAVX2(out, gate, dy *float32, n int)

// exp32s sets dst[i] = exp32(src[i]); dst may be src.
func exp32s(dst, src []float32) {
	n := len(dst)
	src = src[:n]
	done := 0
	if hasAVX2 && n >= 8 {
		done = n &^ 7
		expAVX2(&dst[0], &src[0], done)
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
		tanhAVX2(&dst[0], &src[0], done)
	}
	for i := done; i < n; i++ {
		dst[i] = tanh32(src[i])
	}
}

// addRows32 sets out[r·d+j] = x[r·d+j] + b[j].
func addRows32(out, x, b []float32, d int) {
	if !hasAVX || len(out) == 0 || d == 0 {
		addRowsGo(out, x, b, d)
		return
	}
	x, b = x[:len(out)], b[:d]
	addRowsAVX(&out[0], &x[0], &b[0], len(out)/d, d)
}

// colSum32 sets out[j] to the sum over rows of x[r·d+j], row after row.
func colSum32(out, x []float32, d int) {
	if !hasAVX || d == 0 {
		colSumGo(out, x, d)
		return
	}
	out = out[:d]
	colSumAVX(&out[0], unsafe.SliceData(x), len(x)/d, d)
}

// gelu32 sets out[i] to GELU of x[i].
func gelu32(out, x []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		x := x[:len(out)]
		geluAVX2(&out[0], &x[0], done, geluC32, geluK32)
	}
	geluGo(out[done:], x[done:len(out)])
}

// geluGrad32 sets out[i] to dy[i] times GELU's derivative at x[i].
func geluGrad32(out, x, dy []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		x, dy := x[:len(out)], dy[:len(out)]
		geluGradAVX2(&out[0], &x[0], &dy[0], done, geluC32, geluK32, geluK332)
	}
	geluGradGo(out[done:], x[done:len(out)], dy[done:len(out)])
}

// causalSoftmax32 is causalSoftmaxGo on float32 scores.
func causalSoftmax32(p []float32, t, ld int) {
	if !hasAVX2 || t == 0 {
		causalSoftmaxGo(p, t, ld)
		return
	}
	p = p[:(t-1)*ld+t]
	causalSoftmaxAVX2(&p[0], t, ld)
}

// swiglu32 is swigluGo on float32, eight lanes at a time.
func swiglu32(out, gate, up []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		gate, up := gate[:len(out)], up[:len(out)]
		swigluAVX2(&out[0], &gate[0], &up[0], done)
	}
	swigluGo(out[done:], gate[done:len(out)], up[done:len(out)])
}

// swigluGateGrad32 is swigluGateGradGo on float32, eight lanes at a time.
func swigluGateGrad32(out, gate, up, dy []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		gate, up, dy := gate[:len(out)], up[:len(out)], dy[:len(out)]
		swigluGateGradAVX2(&out[0], &gate[0], &up[0], &dy[0], done)
	}
	swigluGateGradGo(out[done:], gate[done:len(out)], up[done:len(out)], dy[done:len(out)])
}

// swigluUpGrad32 is swigluUpGradGo on float32, eight lanes at a time.
func swigluUpGrad32(out, gate, dy []float32) {
	done := 0
	if hasAVX2 && len(out) >= 8 {
		done = len(out) &^ 7
		gate, dy := gate[:len(out)], dy[:len(out)]
		swigluUpGradAVX2(&out[0], &gate[0], &dy[0], done)
	}
	swigluUpGradGo(out[done:], gate[done:len(out)], dy[done:len(out)])
}

// rmsScaleRow32 is rmsScaleRowGo on float32, eight lanes at a time.
func rmsScaleRow32(out, x, gain []float32, rstd float32) {
	done := 0
	if hasAVX && len(out) >= 8 {
		done = len(out) &^ 7
		x, gain := x[:len(out)], gain[:len(out)]
		rmsScaleRowAVX(&out[0], &x[0], &gain[0], done, rstd)
	}
	rmsScaleRowGo(out[done:], x[done:len(out)], gain[done:len(out)], rstd)
}

// rmsInputGradRow32 is rmsInputGradRowGo on float32, eight lanes at a time.
func rmsInputGradRow32(out, x, dy, gain []float32, rstd, mgx float32) {
	done := 0
	if hasAVX && len(out) >= 8 {
		done = len(out) &^ 7
		x, dy, gain := x[:len(out)], dy[:len(out)], gain[:len(out)]
		rmsInputGradRowAVX(&out[0], &x[0], &dy[0], &gain[0], done, rstd, mgx)
	}
	rmsInputGradRowGo(out[done:], x[done:len(out)], dy[done:len(out)], gain[done:len(out)], rstd, mgx)
}

// rmsGainGradRow32 is rmsGainGradRowGo on float32, eight lanes at a time.
func rmsGainGradRow32(out, x, dy []float32, rstd float32) {
	done := 0
	if hasAVX && len(out) >= 8 {
		done = len(out) &^ 7
		x, dy := x[:len(out)], dy[:len(out)]
		rmsGainGradRowAVX(&out[0], &x[0], &dy[0], done, rstd)
	}
	rmsGainGradRowGo(out[done:], x[done:len(out)], dy[done:len(out)], rstd)
}

// ropeRow32 is ropeRowGo on float32, eight lanes at a time.
func ropeRow32(o1, o2, x1, x2, c, sn []float32) {
	n, done := len(o1), 0
	if hasAVX && n >= 8 {
		done = n &^ 7
		o2, x1, x2, c, sn := o2[:n], x1[:n], x2[:n], c[:n], sn[:n]
		ropeRowAVX(&o1[0], &o2[0], &x1[0], &x2[0], &c[0], &sn[0], done)
	}
	ropeRowGo(o1[done:], o2[done:n], x1[done:n], x2[done:n], c[done:n], sn[done:n])
}

// Kernels names the float32 loops this process runs: the vector kernels
// this CPU's features allow, the Go loops for the rest (the same bits
// either way).
func Kernels() string {
	switch {
	case hasAVX2:
		return "avx2"
	case hasAVX:
		return "avx for the row and column sums, go for the rest (this CPU has no AVX2)"
	}
	return "go (this CPU has no AVX)"
}
