//go:build !amd64 || nosimd

package transport

// Without the amd64 assembly (another architecture, or -tags nosimd) the
// casts are the Go loops of compress.go.

func vectorCasts(DType) bool { return false }

// CastsUsed names the casts this binary uses: the Go loops.
func CastsUsed() string { return "go" }

func encodeHalvesSIMD(DType, []float32, []uint16) bool { return false }

func decodeHalvesSIMD(DType, []uint16, []float32) bool { return false }
