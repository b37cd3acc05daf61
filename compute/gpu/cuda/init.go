//go:build pipetrain_cuda

package cuda

/*
#cgo LDFLAGS: -ldl -lcuda
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

// gorgonia/cu calls cuInit in its package init and exits the process when
// it fails, as it does on a machine without a GPU or driver. This cuInit,
// which the executable's own definition makes the one cu's calls reach,
// calls the driver's and records its result instead, so that pipetrain
// starts anyway and refuses cuda:N stages with the driver's reason (and
// the GPU tests skip: "no CUDA device").
static CUresult pipetrain_init_result = CUDA_SUCCESS;
static int pipetrain_init_done = 0;

CUresult cuInit(unsigned int flags) {
	typedef CUresult (*init_fn)(unsigned int);
	init_fn real = (init_fn)dlsym(RTLD_NEXT, "cuInit");
	pipetrain_init_done = 1;
	pipetrain_init_result = real ? real(flags) : CUDA_ERROR_NOT_FOUND;
	return CUDA_SUCCESS;
}

static int pipetrain_cu_init(void) {
	if (!pipetrain_init_done) {
		cuInit(0);
	}
	return pipetrain_init_result;
}

static const char *pipetrain_error_name(CUresult r) {
	const char *s = NULL;
	cuGetErrorName(r, &s);
	return s ? s : "unknown CUresult";
}

static CUresult pipetrain_host_alloc(void **p, size_t n) { return cuMemAllocHost(p, n); }
static CUresult pipetrain_host_free(void *p) { return cuMemFreeHost(p); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cuErr names a driver result.
func cuErr(r C.CUresult) error {
	return fmt.Errorf("%s (%d)", C.GoString(C.pipetrain_error_name(r)), int(r))
}

// driverErr is the driver's cuInit error, nil when it initialised.
func driverErr() error {
	if r := C.pipetrain_cu_init(); r != 0 {
		return fmt.Errorf("no CUDA device: cuInit: %w", cuErr(C.CUresult(r)))
	}
	return nil
}

// hostAlloc is n bytes of pinned host memory, which the driver copies
// from and to without staging.
func hostAlloc(n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if r := C.pipetrain_host_alloc(&p, C.size_t(n)); r != 0 {
		return nil, fmt.Errorf("cuMemAllocHost(%d): %w", n, cuErr(r))
	}
	return p, nil
}

func hostFree(p unsafe.Pointer) { C.pipetrain_host_free(p) }
