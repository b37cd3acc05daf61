//go:build pipetrain_cuda

package cuda

/*
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>

// cuBLAS is loaded at run time: the build machines' (Debian's CUDA 11.8)
// cannot travel to the GPU machine, which has its own (CUDA 13's, from
// NVIDIA's Python wheels). Only the few entry points the device stage
// calls are declared; their ABI is stable across cuBLAS 11 to 13.
typedef void *cublas_handle;
typedef int (*create_fn)(cublas_handle *);
typedef int (*destroy_fn)(cublas_handle);
typedef int (*set_stream_fn)(cublas_handle, CUstream);
typedef int (*set_math_fn)(cublas_handle, int);
typedef int (*sgemm_fn)(cublas_handle, int, int, int, int, int, const float *, const float *, int, const float *, int, const float *, float *, int);

typedef struct {
	void *lib;
	create_fn create;
	destroy_fn destroy;
	set_stream_fn set_stream;
	set_math_fn set_math;
	sgemm_fn sgemm;
} cublas_api;

static const char *cublas_open(const char *path, cublas_api *api) {
	api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!api->lib) {
		return dlerror();
	}
	api->create = (create_fn)dlsym(api->lib, "cublasCreate_v2");
	api->destroy = (destroy_fn)dlsym(api->lib, "cublasDestroy_v2");
	api->set_stream = (set_stream_fn)dlsym(api->lib, "cublasSetStream_v2");
	api->set_math = (set_math_fn)dlsym(api->lib, "cublasSetMathMode");
	api->sgemm = (sgemm_fn)dlsym(api->lib, "cublasSgemm_v2");
	if (!api->create || !api->destroy || !api->set_stream || !api->set_math || !api->sgemm) {
		dlclose(api->lib);
		api->lib = NULL;
		return "a cuBLAS entry point is missing (cublasCreate_v2, cublasSetStream_v2, cublasSetMathMode or cublasSgemm_v2)";
	}
	return NULL;
}

static int cublas_create(cublas_api *api, cublas_handle *h, CUstream s) {
	int r = api->create(h);
	if (r == 0) {
		r = api->set_stream(*h, s);
	}
	if (r == 0) {
		r = api->set_math(*h, 0); // CUBLAS_DEFAULT_MATH: float32 products, no TF32
	}
	return r;
}

static int cublas_sgemm(cublas_api *api, cublas_handle h, int ta, int tb, int m, int n, int k, float alpha,
	CUdeviceptr a, int lda, CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc) {
	return api->sgemm(h, ta, tb, m, n, k, &alpha, (const float *)a, lda, (const float *)b, ldb, &beta, (float *)c, ldc);
}

static int cublas_destroy(cublas_api *api, cublas_handle h) { return api->destroy(h); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// cublasNames are the sonames tried in order, newest first; then the
// libraries NVIDIA's Python wheels install (nvidia/cublas/lib under a
// site-packages), where PyTorch's GPU machines keep theirs.
var cublasNames = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}

var wheelDirs = []string{"/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib", "/usr/local/lib/python3*/site-packages/nvidia/cublas/lib",
	"/usr/lib/python3/dist-packages/nvidia/cublas/lib", "/opt/conda/lib/python3*/site-packages/nvidia/cublas/lib", "/root/.local/lib/python3*/site-packages/nvidia/cublas/lib"}

// cublasCandidates is where cuBLAS is looked for: $PIPETRAIN_CUBLAS (a
// file) first, then the sonames, then the wheels' directories.
func cublasCandidates() []string {
	var out []string
	if p := os.Getenv("PIPETRAIN_CUBLAS"); p != "" {
		out = append(out, p)
	}
	out = append(out, cublasNames...)
	for _, d := range wheelDirs {
		for _, n := range cublasNames[:3] {
			m, _ := filepath.Glob(filepath.Join(d, n))
			out = append(out, m...)
		}
	}
	return out
}

// cublas is the loaded library and one handle on a stream.
type cublas struct {
	api    C.cublas_api
	handle C.cublas_handle
	path   string
}

// openCublas loads the first cuBLAS found and makes a handle whose
// products run on stream s; the error lists every place tried.
func openCublas(s C.CUstream) (*cublas, error) {
	var tried []string
	for _, p := range cublasCandidates() {
		c := &cublas{path: p}
		cp := C.CString(p)
		msg := C.cublas_open(cp, &c.api)
		C.free(unsafe.Pointer(cp))
		if msg != nil {
			tried = append(tried, fmt.Sprintf("%s: %s", p, C.GoString(msg)))
			continue
		}
		if r := C.cublas_create(&c.api, &c.handle, s); r != 0 {
			return nil, fmt.Errorf("cuBLAS %s: cublasCreate: status %d", p, int(r))
		}
		return c, nil
	}
	return nil, errors.New("no cuBLAS (set PIPETRAIN_CUBLAS to libcublas.so's path): " + strings.Join(tried, "; "))
}

// sgemm is the row-major C = alpha·op(A)·op(B) + beta·C of gpu.Backend,
// as column-major cuBLAS computes it: Cᵀ = op(B)ᵀ·op(A)ᵀ, the stored
// row-major matrices being their transposes in column-major order.
func (c *cublas) sgemm(transA, transB bool, m, n, k int, alpha float32, a, b uintptr, beta float32, out uintptr) error {
	op := func(t bool) C.int {
		if t {
			return 1 // CUBLAS_OP_T
		}
		return 0 // CUBLAS_OP_N
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	if r := C.cublas_sgemm(&c.api, c.handle, op(transB), op(transA), C.int(n), C.int(m), C.int(k), C.float(alpha),
		C.CUdeviceptr(b), C.int(ldb), C.CUdeviceptr(a), C.int(lda), C.float(beta), C.CUdeviceptr(out), C.int(n)); r != 0 {
		return fmt.Errorf("cublasSgemm %dx%dx%d: status %d", m, n, k, int(r))
	}
	return nil
}

func (c *cublas) close() { C.cublas_destroy(&c.api, c.handle) }
