//go:build amd64 && !nosimd

package engine

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestVectorKernelsChosen: an amd64 build runs the assembly kernels wherever
// the CPU has AVX, with or without cgo, so TestFastEngineMatchesStandardEngine
// exercises them.
func TestVectorKernelsChosen(t *testing.T) {
	if hasAVX != cpu.X86.HasAVX {
		t.Fatalf("hasAVX is %v, the CPU's AVX %v", hasAVX, cpu.X86.HasAVX)
	}
	if !hasAVX {
		t.Skip("this CPU has no AVX: the Go loops run")
	}
}
