//go:build cgo && !noopenblas

package blas

// #cgo LDFLAGS: -lopenblas
// void openblas_set_num_threads(int num_threads);
import "C"

import (
	"gonum.org/v1/netlib/blas/netlib"
	G "gorgonia.org/gorgonia"
)

// Name says which BLAS the binary computes with.
const Name = "openblas"

func init() { G.Use(netlib.Implementation{}) }

// SetThreads fixes OpenBLAS's thread count for this process. Results depend on it
// in the last bits, so every process of a run, and its reference, must use the same.
func SetThreads(n int) {
	if n > 0 {
		C.openblas_set_num_threads(C.int(n))
	}
}
