//go:build !amd64 || nosimd

package engine

func binary32(k binaryKernel, dst, a, b []float32) { binaryGo(k, dst, a, b) }

func gteScalar32(dst, a []float32, s float32) { gteScalarGo(dst, a, s) }
