package blas

import (
	"fmt"
	"strings"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
)

// decideAuto tries candidates (cores.Candidates, best first) with try, a
// self-test that returns the set's result, until one passes and beats the
// library's own kernels (own, at libRate GFLOP/s); a set that fails is
// refused and the next is tried. It returns that set, or nil and why the
// library's choice stands.
func decideAuto(cpu cores.CPU, candidates []string, own string, libRate float64, try func(core string) cores.Result) (*chosen, string) {
	var tried []cores.Result
	for _, c := range candidates {
		tried = append(tried, try(c))
		if best, ok := cores.Pick(tried, libRate); ok {
			return &chosen{Core: best.Core, Library: own, Speedup: best.GFLOPS / libRate, Refused: refusals(tried[:len(tried)-1], libRate)}, ""
		}
	}
	return nil, fmt.Sprintf("OpenBLAS chose %s for this CPU (%s) and no better set passed: %s", own, cpu, refusals(tried, libRate))
}

// refusals says why each of tried was not taken.
func refusals(tried []cores.Result, libRate float64) string {
	var out []string
	for _, r := range tried {
		if r.Err != "" {
			out = append(out, fmt.Sprintf("%s refused (%s)", r.Core, r.Err))
		} else {
			out = append(out, fmt.Sprintf("%s no faster (%.1f GFLOP/s against %.1f)", r.Core, r.GFLOPS, libRate))
		}
	}
	return strings.Join(out, "; ")
}

// chosen is what a process that restarts itself with other kernels tells
// its new image.
type chosen struct {
	Core     string  `json:"core"`
	Library  string  `json:"library"` // what the library chose itself
	Speedup  float64 `json:"speedup"`
	Refused  string  `json:"refused,omitempty"` // better sets refused first
	CoreType *string `json:"coretype"`          // the user's OPENBLAS_CORETYPE, nil when unset
}
