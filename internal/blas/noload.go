//go:build !(linux || darwin || freebsd) || nodlopen

package blas

import (
	"errors"

	"gonum.org/v1/gonum/blas/gonum"
)

// openBLAS is never loaded in this build: it links no loader, so the binary
// is fully static (for scratch images) and computes with gonum's kernels.
type openBLAS struct{ gonum.Implementation }

func (*openBLAS) setThreads(int) {}

const missingHint = ""

func load([]string) (*openBLAS, string, error) {
	return nil, "", errors.New("this pipetrain was built without the library loader (-tags nodlopen)")
}

func loadKernels(names []string, _ string) (*openBLAS, string, error) { return load(names) }

func probing() {}

func availableCores() []string { return nil }
