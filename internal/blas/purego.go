//go:build !cgo || noopenblas

package blas

// Name says which BLAS the binary computes with: gonum's pure-Go kernels, several
// times slower than OpenBLAS but needing no C library.
const Name = "gonum"

// SetThreads does nothing: gonum's kernels are single-threaded per call.
func SetThreads(n int) {}
