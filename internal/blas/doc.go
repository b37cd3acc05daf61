// Package blas selects the matrix kernels gorgonia uses. Importing it is enough:
// at start-up the process loads OpenBLAS from the system if it can (dlopen,
// without cgo, so a plain `go build` needs no C library to link against) and
// otherwise keeps gonum's pure-Go BLAS, several times slower. PIPETRAIN_BLAS
// chooses: unset or "auto" (OpenBLAS if present), "openblas" (OpenBLAS or an
// error), "gonum" (the Go kernels), or the path of a BLAS library to load.
//
// OpenBLAS and gonum give results that differ in the last bits, so the stages
// of one run and its reference must use the same. OpenBLAS threads per process
// come from the config (compute.blas_threads) through SetThreads.
package blas
