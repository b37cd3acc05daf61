package configs

import (
	"strings"
	"testing"
)

// TestBLASKernels: compute.blas_kernels takes auto (the default), library
// and OpenBLAS's core types in any case, from the file or its variable, and
// refuses other names, naming the key and the known sets.
func TestBLASKernels(t *testing.T) {
	c, err := Load(writeConfig(t, good))
	if err != nil || c.Compute.BLASKernels != "auto" {
		t.Fatalf("default: %q, %v", c.Compute.BLASKernels, err)
	}
	for _, v := range []string{"library", "Haswell", "skylakex", "Cooperlake"} {
		c, err := Load(writeConfig(t, good+"\ncompute: {blas_kernels: "+v+"}\n"))
		if err != nil || c.Compute.BLASKernels != v {
			t.Errorf("blas_kernels %s: %q, %v", v, c.Compute.BLASKernels, err)
		}
	}
	t.Setenv("PIPETRAIN_COMPUTE_BLAS_KERNELS", "Zen")
	if c, err := Load(writeConfig(t, good)); err != nil || c.Compute.BLASKernels != "Zen" {
		t.Errorf("from PIPETRAIN_COMPUTE_BLAS_KERNELS: %q, %v", c.Compute.BLASKernels, err)
	}
	t.Setenv("PIPETRAIN_COMPUTE_BLAS_KERNELS", "")
	_, err = Load(writeConfig(t, good+"\ncompute: {blas_kernels: Pentium9}\n"))
	if err == nil || !strings.Contains(err.Error(), `compute.blas_kernels: unknown kernel set "Pentium9"`) || !strings.Contains(err.Error(), "Cooperlake") {
		t.Errorf("an unknown kernel set: %v", err)
	}
}
