//go:build !amd64 || nosimd

package models

// exp32s sets dst[i] = exp32(src[i]); dst may be src.
func exp32s(dst, src []float32) {
	for i := range dst {
		dst[i] = exp32(src[i])
	}
}

// tanh32s sets dst[i] = tanh32(src[i]); dst may be src.
func tanh32s(dst, src []float32) {
	for i := range dst {
		dst[i] = tanh32(src[i])
	}
}

func addRows32(out, x, b []float32, d int)   { addRowsGo(out, x, b, d) }
func colSum32(out, x []float32, d int)       { colSumGo(out, x, d) }
func gelu32(out, x []float32)                { geluGo(out, x) }
func geluGrad32(out, x, dy []float32)        { geluGradGo(out, x, dy) }
func causalSoftmax32(p []float32, t, ld int) { causalSoftmaxGo(p, t, ld) }
func swiglu32(out, gate, up []float32)       { swigluGo(out, gate, up) }
func swigluGateGrad32(out, gate, up, dy []float32) {
	swigluGateGradGo(out, gate, up, dy)
}
func swigluUpGrad32(out, gate, dy []float32) { swigluUpGradGo(out, gate, dy) }
func rmsScaleRow32(out, x, gain []float32, rstd float32) {
	rmsScaleRowGo(out, x, gain, rstd)
}
func rmsInputGradRow32(out, x, dy, gain []float32, rstd, mgx float32) {
	rmsInputGradRowGo(out, x, dy, gain, rstd, mgx)
}
func rmsGainGradRow32(out, x, dy []float32, rstd float32) { rmsGainGradRowGo(out, x, dy, rstd) }
func ropeRow32(o1, o2, x1, x2, c, sn []float32)           { ropeRowGo(o1, o2, x1, x2, c, sn) }

// Kernels names the float32 loops this process runs: the Go loops, this
// build having no vector kernels (not amd64, or -tags nosimd).
func Kernels() string { return "go (built without the vector kernels)" }
