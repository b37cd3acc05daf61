//go:build !cgo || !amd64 || nosimd

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
