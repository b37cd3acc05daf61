// Package cuda is the cuda:N device kind: the device stage of package
// compute/gpu on NVIDIA GPUs, through gorgonia.org/cu (the driver API:
// contexts, memory, streams, modules) and the GPU machine's own cuBLAS,
// loaded at run time. Its kernels (kernels/kernels.cu) are compiled to PTX
// here by `make ptx` and embedded, so nothing is compiled where it runs.
//
// It is built only with -tags cuda, which needs cgo and CUDA's headers and
// libcuda to link against (scripts/cuda-deps.sh installs Debian's); the
// default build and go install leave it out. docs/gpu.md says how to build
// and check it.
package cuda

// The PTX the cuda build embeds; make ptx runs this, and TestPTXIsCompiledFromKernels
// checks the committed file is its output.
//go:generate nvcc -ptx -arch=compute_80 -o kernels/kernels.ptx kernels/kernels.cu
