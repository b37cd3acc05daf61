//go:build (linux || darwin || freebsd) && !nodlopen

package blas

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/ebitengine/purego"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
)

// The kernel set of a DYNAMIC_ARCH OpenBLAS is fixed when the library
// initialises (its constructor reads OPENBLAS_CORETYPE, at dlopen), and
// unloading it again is not something its thread pool survives. So other
// sets are tried in child processes (this binary started again with
// probeEnv set: its init self-tests the set OPENBLAS_CORETYPE names, prints
// the result and exits), and a process that should use another set than the
// one it loaded executes itself again with OPENBLAS_CORETYPE set, telling
// the new image what was decided in chosenEnv. Nothing is kept on disk: a
// library or CPU that changes is seen by the next process.
const (
	coreTypeEnv = "OPENBLAS_CORETYPE"
	probeEnv    = "PIPETRAIN_BLAS_PROBE"  // the library a probe loads
	chosenEnv   = "PIPETRAIN_BLAS_CHOSEN" // the decision a re-executed process loads
	probeLimit  = 60 * time.Second
)

// corename is openblas_get_corename(), "" where the library has none.
func (o *openBLAS) corename() string { return o.text("openblas_get_corename") }

// config is openblas_get_config(): version, build options and core.
func (o *openBLAS) config() string { return o.text("openblas_get_config") }

func (o *openBLAS) text(symbol string) string {
	p, err := purego.Dlsym(o.lib, symbol)
	if err != nil {
		return ""
	}
	var f func() string
	purego.RegisterFunc(&f, p)
	return f()
}

// threads is openblas_get_num_threads(), 0 where the library has none.
func (o *openBLAS) threads() int {
	p, err := purego.Dlsym(o.lib, "openblas_get_num_threads")
	if err != nil {
		return 0
	}
	n, _, _ := purego.SyscallN(p)
	return int(int32(n))
}

// available are the core types this build carries: a DYNAMIC_ARCH build
// exports each kernel table as gotoblas_<NAME>; other builds export none.
func (o *openBLAS) available() []string {
	var out []string
	for _, c := range cores.Known {
		if _, err := purego.Dlsym(o.lib, "gotoblas_"+strings.ToUpper(c.Name)); err == nil {
			out = append(out, c.Name)
		}
	}
	return out
}

// loadKernels loads the first usable library of names with the kernel set
// policy asks for ("auto", "library" or a core type's name).
func loadKernels(names []string, policy string) (*openBLAS, string, error) {
	switch policy {
	case "library":
		impl, lib, err := load(names)
		if err == nil {
			setKernels(policy, impl, impl.corename(), librarysChoice())
		}
		return impl, lib, err
	case "auto":
		if marker, ok := os.LookupEnv(chosenEnv); ok {
			return loadChosen(names, marker)
		}
		impl, lib, err := load(names)
		if err == nil {
			chooseAuto(impl, lib)
		}
		return impl, lib, err
	}
	return loadNamed(names, policy)
}

// librarysChoice says who chose the kernels when OpenBLAS did.
func librarysChoice() string {
	if v := os.Getenv(coreTypeEnv); v != "" {
		return fmt.Sprintf("%s=%s", coreTypeEnv, v)
	}
	return "the library's choice for this CPU"
}

func setKernels(policy string, impl *openBLAS, library, reason string) {
	choice.kernels = kernelChoice{policy: policy, core: impl.corename(), library: library, reason: reason, config: impl.config()}
}

// chooseAuto keeps the library's kernels unless they are below what the
// CPU can run and the build has better ones; then it self-tests those in
// child processes, best first, and executes this process again with the
// first that passes and beats the library's own. It returns when the
// library's kernels stay.
func chooseAuto(impl *openBLAS, lib string) {
	own := impl.corename()
	cpu := cores.Host()
	candidates := cores.Candidates(cpu, impl.available(), own)
	if len(candidates) == 0 {
		setKernels("auto", impl, own, librarysChoice())
		return
	}
	threads := impl.threads()
	impl.setThreads(1)
	libRate := sgemmRate(impl)
	if threads > 0 {
		impl.setThreads(threads)
	}
	c, reason := decideAuto(cpu, candidates, own, libRate, func(core string) cores.Result { return probe(lib, core) })
	if c == nil {
		setKernels("auto", impl, own, reason)
		return
	}
	err := reexec(*c)
	// Only a failed exec returns.
	setKernels("auto", impl, own, fmt.Sprintf("OpenBLAS chose %s for this CPU; %s passed the self-test %.1fx faster, but this process could not restart with it: %v", own, c.Core, c.Speedup, err))
}

// probe self-tests core in a child process: a kernel set the CPU cannot
// run kills the child, not this process.
func probe(lib, core string) cores.Result {
	r := cores.Result{Core: core}
	exe, err := os.Executable()
	if err != nil {
		r.Err = err.Error()
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(environWithout(coreTypeEnv, probeEnv, chosenEnv, "OPENBLAS_NUM_THREADS", "OPENBLAS_VERBOSE"),
		coreTypeEnv+"="+core, probeEnv+"="+lib, "OPENBLAS_NUM_THREADS=1")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil || runErr != nil {
		why := runErr
		if why == nil {
			why = err
		}
		r.Err = fmt.Sprintf("the self-test process failed: %v", why)
		if s := strings.TrimSpace(stderr.String()); s != "" {
			r.Err += ": " + clip(s, 200)
		}
	}
	return r
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// runProbe is a probe child's work, in place of the program's: load the
// library probeEnv names with OPENBLAS_CORETYPE's kernels, self-test them,
// time sgemm, print the result and exit.
func runProbe(lib string) {
	want := os.Getenv(coreTypeEnv)
	r := cores.Result{Core: want}
	impl, _, err := load([]string{lib})
	switch {
	case err != nil:
		r.Err = err.Error()
	default:
		impl.setThreads(1)
		r.Loaded = impl.corename()
		if !strings.EqualFold(r.Loaded, want) {
			r.Err = fmt.Sprintf("asked for %s, the library loaded %s", want, r.Loaded)
		} else if err := selfTest(impl); err != nil {
			r.Err = "self-test: " + err.Error()
		} else {
			r.GFLOPS = sgemmRate(impl)
		}
	}
	json.NewEncoder(os.Stdout).Encode(r)
	os.Exit(0)
}

// reexec executes this program again, with the same arguments, loading
// c.Core's kernels. It returns only if that fails.
func reexec(c chosen) error {
	if v, ok := os.LookupEnv(coreTypeEnv); ok {
		c.CoreType = &v
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	b, _ := json.Marshal(c)
	env := append(environWithout(coreTypeEnv, chosenEnv), coreTypeEnv+"="+c.Core, chosenEnv+"="+string(b))
	return syscall.Exec(exe, os.Args, env)
}

// loadChosen is init in a process that reexec started: it loads the
// kernels decided, and gives the environment back the user's
// OPENBLAS_CORETYPE, so that the processes it starts decide for themselves.
func loadChosen(names []string, marker string) (*openBLAS, string, error) {
	var c chosen
	jsonErr := json.Unmarshal([]byte(marker), &c)
	impl, lib, err := load(names)
	os.Unsetenv(chosenEnv)
	if c.CoreType != nil {
		os.Setenv(coreTypeEnv, *c.CoreType)
	} else {
		os.Unsetenv(coreTypeEnv)
	}
	if err != nil {
		return nil, "", err
	}
	reason := fmt.Sprintf("OpenBLAS chose %s for this CPU; using %s: %.1fx faster in the self-test", c.Library, c.Core, c.Speedup)
	if c.Refused != "" {
		reason += "; " + c.Refused
	}
	switch got := impl.corename(); {
	case jsonErr != nil:
		reason = fmt.Sprintf("%s unreadable (%v): the kernels loaded are %s", chosenEnv, jsonErr, got)
	case !strings.EqualFold(got, c.Core):
		reason = fmt.Sprintf("asked for %s after the self-test, the library loaded %s", c.Core, got)
	}
	setKernels("auto", impl, c.Library, reason)
	return impl, lib, nil
}

// loadNamed loads the library with core's kernels, which compute.blas_kernels
// fixes for every host; it refuses a set the CPU cannot run, a build
// without it, and one that fails the self-test.
func loadNamed(names []string, core string) (*openBLAS, string, error) {
	cpu := cores.Host()
	if why := cores.Missing(cpu, core); why != "" {
		return nil, "", fmt.Errorf("compute.blas_kernels %s: %s", core, why)
	}
	old, had := os.LookupEnv(coreTypeEnv)
	os.Setenv(coreTypeEnv, core) // through libc's setenv: OpenBLAS reads it at dlopen
	impl, lib, err := load(names)
	if had {
		os.Setenv(coreTypeEnv, old)
	} else {
		os.Unsetenv(coreTypeEnv)
	}
	if err != nil {
		return nil, "", err
	}
	if got := impl.corename(); !strings.EqualFold(got, core) {
		return nil, "", fmt.Errorf("compute.blas_kernels %s: %s loaded its %s kernels instead (the core types it has: %s)", core, lib, got, strings.Join(impl.available(), ", "))
	}
	if err := selfTestAlone(impl); err != nil {
		return nil, "", fmt.Errorf("compute.blas_kernels %s: %s's %s kernels failed the self-test: %w", core, lib, core, err)
	}
	setKernels(core, impl, core, "compute.blas_kernels fixes them; self-tested")
	return impl, lib, nil
}

// selfTestAlone self-tests impl on one thread: threads cost more than they
// save on the self-test's small products.
func selfTestAlone(impl *openBLAS) error {
	n := impl.threads()
	impl.setThreads(1)
	defer func() {
		if n > 0 {
			impl.setThreads(n)
		}
	}()
	return selfTest(impl)
}

// probing starts a probe child's work if this process is one.
func probing() {
	if lib, ok := os.LookupEnv(probeEnv); ok {
		runProbe(lib)
	}
}

// availableCores are the core types of the library this process loaded.
func availableCores() []string {
	if choice.impl == nil {
		return nil
	}
	return choice.impl.available()
}
