//go:build amd64 && !nosimd

package models

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestVectorKernelsChosen: an amd64 build runs the assembly kernels wherever
// the CPU has the features, with or without cgo, so the tests comparing the
// float32 kernels with the Go loops exercise them.
func TestVectorKernelsChosen(t *testing.T) {
	if hasAVX2 != cpu.X86.HasAVX2 || hasAVX != cpu.X86.HasAVX {
		t.Fatalf("kernels chosen for AVX %v, AVX2 %v on a CPU with AVX %v, AVX2 %v", hasAVX, hasAVX2, cpu.X86.HasAVX, cpu.X86.HasAVX2)
	}
	if cpu.X86.HasAVX2 && Kernels() != "avx2" {
		t.Fatalf("Kernels() = %q on a CPU with AVX2", Kernels())
	}
	t.Logf("float32 kernels: %s", Kernels())
}
