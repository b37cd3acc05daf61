//go:build !cgo || !amd64 || nosimd

package transport

// Without cgo on amd64 the casts are the Go loops of compress.go.

const simdCasts = false

// CastsUsed names the casts this binary uses: the Go loops.
func CastsUsed() string { return "go" }

func encodeHalvesSIMD(DType, []float32, []uint16) bool { return false }

func decodeHalvesSIMD(DType, []uint16, []float32) bool { return false }
