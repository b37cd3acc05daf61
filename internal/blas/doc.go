// Package blas selects the matrix kernels gorgonia uses. Importing it is enough:
// builds with cgo link OpenBLAS (Debian's libopenblas-dev) through gonum's netlib
// bindings; builds without cgo, or with the noopenblas tag, keep gonum's pure-Go BLAS.
// OpenBLAS and gonum give results that differ in the last bits, so the stages of one
// run and its reference must use the same build. OpenBLAS threads per process come
// from the config (compute.blas_threads) through SetThreads.
package blas
