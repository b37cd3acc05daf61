//go:build amd64 && !nosimd

package transport

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestVectorCastsChosen: an amd64 build runs the assembly casts wherever the
// CPU has the instructions, with or without cgo, so TestSIMDCastsMatchGo
// exercises them.
func TestVectorCastsChosen(t *testing.T) {
	f16c := cpu.X86.HasAVX && cpuid1ECX()&(1<<29) != 0
	if vectorCasts(Float16) != f16c || vectorCasts(BFloat16) != cpu.X86.HasAVX2 {
		t.Fatalf("vector casts fp16 %v, bf16 %v on a CPU with F16C %v, AVX2 %v", vectorCasts(Float16), vectorCasts(BFloat16), f16c, cpu.X86.HasAVX2)
	}
	if f16c && cpu.X86.HasAVX2 && CastsUsed() != "avx2+f16c" {
		t.Fatalf("CastsUsed() = %q on a CPU with AVX2 and F16C", CastsUsed())
	}
	t.Logf("casts: %s", CastsUsed())
}
