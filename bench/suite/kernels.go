package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	iblas "github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/blas/cores"
	"github.com/pipetrain/pipetrain/internal/stats"
)

// The compute section's limit is sgemm under the best kernel set this
// machine's OpenBLAS has, not under whichever set this process loaded: where
// the library fell back to old kernels, the stage and an sgemm in the same
// process are equally slow and their ratio hides it. OpenBLAS fixes its
// kernels when it loads, so each set is timed in a child process: this
// program started again with sgemmChildEnv naming the micro-batches and
// internal/blas's KernelsEnv the set, which internal/blas loads through
// OPENBLAS_CORETYPE and self-tests as for any run (a set the CPU lacks or
// that computes wrongly is refused there; one that crashes the child, here).

// sgemmChildEnv makes this program a child that times the stage's products
// at the comma-separated micro-batches it holds, prints a kernelRun and exits.
const sgemmChildEnv = "PIPETRAIN_BENCH_SGEMM"

// kernelChildLimit bounds one child: a self-test and a few seconds of products.
const kernelChildLimit = 2 * time.Minute

// kernelRun is what one child prints.
type kernelRun struct {
	Kernels string    `json:"kernels"`         // iblas.KernelSet() in the child
	Err     string    `json:"error,omitempty"` // why it measured nothing
	Sec     []float64 `json:"sec,omitempty"`   // seconds per pass of the products, one per micro-batch
}

// kernelSet is one kernel set's sgemm over the rounds.
type kernelSet struct {
	policy  string      // the compute.blas_kernels its children ran under: "library" or a core type
	kernels string      // what they computed with: "OpenBLAS Zen"
	err     string      // why the set was refused ("" when it was not)
	sec     [][]float64 // per micro-batch, one entry per round
}

// median is the set's median seconds per pass at micro-batch index i.
func (s *kernelSet) median(i int) float64 { return stats.Median(s.sec[i]) }

// name is the set as a table names it: its core type.
func (s *kernelSet) name() string {
	if k := strings.TrimPrefix(s.kernels, "OpenBLAS "); k != "" {
		return k
	}
	return s.policy
}

// kernelPolicies are the compute.blas_kernels values whose sgemm the section
// times: the library's own choice, then every set of available (the loaded
// build's core types) that internal/blas's auto may choose and the CPU runs.
func kernelPolicies(cpu cores.CPU, available []string) []string {
	out := []string{"library"}
	for _, name := range available {
		if c, ok := cores.Lookup(name); ok && c.Candidate && cores.Missing(cpu, c.Name) == "" {
			out = append(out, c.Name)
		}
	}
	return out
}

// fastest is the index of the set with the lowest median time at micro-batch
// index i among those not refused, or -1 when every set was.
func fastest(sets []*kernelSet, i int) int {
	best := -1
	for j, s := range sets {
		if s.err != "" || len(s.sec[i]) == 0 {
			continue
		}
		if best < 0 || s.median(i) < sets[best].median(i) {
			best = j
		}
	}
	return best
}

// library is the set that ran under the library's own choice, nil when none did.
func library(sets []*kernelSet) *kernelSet {
	for _, s := range sets {
		if s.policy == "library" {
			return s
		}
	}
	return nil
}

// measureKernelSets times the stage's products at batches under each set of
// kernelPolicies, rounds times, the sets taking turns so that a busy spell
// of the machine falls on all of them alike. None with gonum's kernels.
func measureKernelSets(rounds int, batches []int) []*kernelSet {
	if iblas.Name() != "openblas" {
		return nil
	}
	policies := kernelPolicies(cores.Host(), iblas.KernelSets())
	sets := make([]*kernelSet, len(policies))
	for i, p := range policies {
		sets[i] = &kernelSet{policy: p, sec: make([][]float64, len(batches))}
	}
	for range rounds {
		for _, s := range sets {
			if s.err != "" {
				continue
			}
			r := runKernelChild(s.policy, batches)
			s.kernels = r.Kernels
			if r.Err == "" && len(r.Sec) != len(batches) {
				r.Err = fmt.Sprintf("timed %d micro-batches of %d", len(r.Sec), len(batches))
			}
			if r.Err != "" {
				s.err = r.Err
				logf("compute: kernels %s refused: %s", s.policy, r.Err)
				continue
			}
			for i, sec := range r.Sec {
				s.sec[i] = append(s.sec[i], sec)
			}
		}
	}
	return sets
}

// runKernelChild times the products at batches in a child loading policy's kernels.
func runKernelChild(policy string, batches []int) kernelRun {
	r := kernelRun{Kernels: policy}
	exe, err := os.Executable()
	if err != nil {
		r.Err = err.Error()
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), kernelChildLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	mbs := make([]string, len(batches))
	for i, mb := range batches {
		mbs[i] = strconv.Itoa(mb)
	}
	cmd.Env = append(environWithout(iblas.KernelsEnv, sgemmChildEnv), iblas.KernelsEnv+"="+policy, sgemmChildEnv+"="+strings.Join(mbs, ","))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil || jerr != nil {
		r.Err = fmt.Sprintf("the child process failed: %v", errors.Join(err, jerr))
		if s := strings.TrimSpace(stderr.String()); s != "" {
			r.Err += ": " + string(tail([]byte(s), 300))
		}
	}
	return r
}

// runSgemmChild is a child's work in place of the suite's: one pass of
// loopSize's calls of the stage's products per micro-batch of spec, on one
// BLAS thread, printed as a kernelRun.
func runSgemmChild(spec string) {
	r := kernelRun{Kernels: iblas.KernelSet()}
	switch {
	case iblas.Err() != nil:
		r.Err = iblas.Err().Error()
	case iblas.Name() != "openblas":
		r.Err = iblas.Describe(0)
	default:
		iblas.SetThreads(1)
		for _, f := range strings.Split(spec, ",") {
			mb, err := strconv.Atoi(f)
			if err != nil || mb <= 0 {
				r.Err = fmt.Sprintf("%s: micro-batch %q", sgemmChildEnv, f)
				break
			}
			gemms := stageProducts(rand.New(rand.NewPCG(1, uint64(mb))), mb)
			k, _ := loopSize(gemms)
			sec, _ := timeLoop(gemms, k)
			r.Sec = append(r.Sec, sec)
		}
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

// environWithout is this process's environment less the variables named.
func environWithout(names ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || name == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
