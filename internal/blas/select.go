package blas

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	G "gorgonia.org/gorgonia"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
)

// Env is the variable that chooses the BLAS; see the package comment.
const Env = "PIPETRAIN_BLAS"

// searched are the names tried, in order, when Env names no file: the
// OpenBLAS runtime packages of Debian, Ubuntu, Fedora and Arch install the
// first; the second is the development symlink some builds leave alone.
var searched = []string{"libopenblas.so.0", "libopenblas.so"}

// choice is what init decided; read through Name, Library and Err.
var choice struct {
	name    string // "openblas" or "gonum"
	library string // the file loaded, or ""
	err     error  // why the BLAS Env asked for could not be had
	// notLoaded says why auto fell back to gonum ("" when it did not).
	notLoaded string
	threads   func(n int)
	kernels   kernelChoice
	impl      *openBLAS // nil with gonum
	once      sync.Once
}

// kernelChoice is which of OpenBLAS's kernel sets (core types) the process
// computes with, and why.
type kernelChoice struct {
	policy  string // the compute.blas_kernels it was loaded under: auto, library or a core type
	core    string // openblas_get_corename(); "" with gonum
	library string // the set the library chose itself (or OPENBLAS_CORETYPE's)
	reason  string // why core, for messages and run.json
	config  string // openblas_get_config()
}

// KernelsEnv sets compute.blas_kernels, as for every config key; init reads
// it, since OpenBLAS fixes its kernels when it loads, before any config.
const KernelsEnv = "PIPETRAIN_COMPUTE_BLAS_KERNELS"

func init() {
	probing()
	policy, err := ParseKernels(os.Getenv(KernelsEnv))
	if err != nil {
		choice.err = fmt.Errorf("%s: %w", KernelsEnv, err)
		return
	}
	choose(os.Getenv(Env), policy)
}

// ParseKernels reads a compute.blas_kernels value: "auto" (or ""),
// "library", or one of OpenBLAS's core types in any case, which it returns
// spelled as OpenBLAS does.
func ParseKernels(v string) (string, error) {
	switch v = strings.TrimSpace(v); strings.ToLower(v) {
	case "", "auto":
		return "auto", nil
	case "library":
		return "library", nil
	}
	c, ok := cores.Lookup(v)
	if !ok {
		return "", fmt.Errorf("unknown kernel set %q: auto, library or an OpenBLAS core type (%s)", v, strings.Join(cores.Names(), ", "))
	}
	return c.Name, nil
}

// choose loads the BLAS that want names, with the kernel set policy asks
// for, and hands it to gorgonia.
func choose(want, policy string) {
	choice.name, choice.library, choice.err, choice.notLoaded, choice.threads, choice.impl = "gonum", "", nil, "", nil, nil
	choice.kernels = kernelChoice{policy: policy}
	switch strings.TrimSpace(want) {
	case "gonum":
		return
	case "", "auto":
		impl, lib, err := loadKernels(searched, policy)
		if err != nil && policy != "auto" && policy != "library" {
			choice.err = err // kernels fixed for every host: no quiet fallback
			return
		}
		if err != nil {
			choice.notLoaded = err.Error()
			return
		}
		use(impl, lib)
	case "openblas":
		impl, lib, err := loadKernels(searched, policy)
		if err != nil {
			choice.err = fmt.Errorf("%s=openblas: %w", Env, err)
			return
		}
		use(impl, lib)
	default:
		impl, lib, err := loadKernels([]string{want}, policy)
		if err != nil {
			choice.err = fmt.Errorf("%s=%s: %w", Env, want, err)
			return
		}
		use(impl, lib)
	}
}

func use(impl *openBLAS, lib string) {
	G.Use(impl)
	choice.name, choice.library, choice.threads, choice.impl = "openblas", lib, impl.setThreads, impl
}

// Name says which BLAS this process computes with: "openblas" or "gonum".
func Name() string { return choice.name }

// Library is the file OpenBLAS was loaded from ("" with gonum).
func Library() string { return choice.library }

// Err is why the BLAS that PIPETRAIN_BLAS asked for is not in use (nil when
// it is, or when none was asked for). Commands that compute check it, so a
// run never silently computes with another BLAS than the one asked for.
func Err() error { return choice.err }

// Describe says in one line what the process computes with and why; threads
// is the OpenBLAS thread count it runs with (0: not said).
func Describe(threads int) string {
	switch {
	case choice.err != nil:
		return fmt.Sprintf("matrix products: none, %v", choice.err)
	case choice.library != "":
		s := fmt.Sprintf("matrix products: OpenBLAS (%s)", choice.library)
		if threads == 1 {
			s += ", 1 thread"
		} else if threads > 1 {
			s += fmt.Sprintf(", %d threads", threads)
		}
		if k := choice.kernels; k.core != "" {
			s += fmt.Sprintf(", %s kernels (%s)", k.core, k.reason)
		}
		return s
	case choice.notLoaded != "":
		return fmt.Sprintf("matrix products: gonum's Go kernels (no OpenBLAS: %s%s)", choice.notLoaded, missingHint)
	default:
		return fmt.Sprintf("matrix products: gonum's Go kernels (%s=gonum)", Env)
	}
}

// SetThreads fixes OpenBLAS's thread count for this process; gonum's kernels
// are single-threaded per call and ignore it. Results depend on the count in
// the last bits, so every process of a run, and its reference, must use the
// same.
func SetThreads(n int) {
	if n > 0 && choice.threads != nil {
		choice.threads(n)
	}
}

// Threads is OpenBLAS's thread count for this process; 0 with gonum's
// kernels.
func Threads() int {
	if choice.impl == nil {
		return 0
	}
	return choice.impl.threads()
}

// KernelSet names the kernels this process computes with, which change a
// product's last bits: "OpenBLAS Haswell", or "gonum" for the Go kernels.
// Every stage of a run and its reference must compute with the same.
func KernelSet() string {
	switch {
	case choice.library == "":
		return "gonum"
	case choice.kernels.core == "":
		return "OpenBLAS"
	}
	return "OpenBLAS " + choice.kernels.core
}

// Kernels is OpenBLAS's core type in use ("" with gonum) and why it is.
func Kernels() (core, reason string) { return choice.kernels.core, choice.kernels.reason }

// Satisfies says whether this process computes with the kernels that
// compute.blas_kernels policy asks for, and if not, why not. A policy other
// than the one the process loaded under may still hold: auto when the
// library's own choice stood, library when auto kept it, a core type that
// auto chose.
func Satisfies(policy string) error {
	want, err := ParseKernels(policy)
	if err != nil {
		return fmt.Errorf("compute.blas_kernels: %w", err)
	}
	k := choice.kernels
	switch {
	case want == k.policy:
		return nil
	case choice.library == "":
		if want == "auto" || want == "library" {
			return nil
		}
		return fmt.Errorf("compute.blas_kernels %s names OpenBLAS kernels, and this process computes with gonum's (%s)", want, Describe(0))
	case want == "auto" && k.policy == "library" && k.core == k.library && !belowCPU():
		return nil
	case want == "library" && k.policy == "auto" && k.core == k.library:
		return nil
	case want != "auto" && want != "library" && strings.EqualFold(k.core, want):
		return nil
	}
	return fmt.Errorf("compute.blas_kernels is %s, and this process loaded OpenBLAS's %s kernels under %s (set %s=%s before it starts)", want, k.core, k.policy, KernelsEnv, want)
}

// KernelSets are the core types the loaded OpenBLAS carries (a DYNAMIC_ARCH
// build's kernel sets; none with gonum or a single-target build), for a
// benchmark that measures each through KernelsEnv.
func KernelSets() []string { return availableCores() }

// belowCPU says whether auto would try other kernels than the library's.
func belowCPU() bool {
	return len(cores.Candidates(cores.Host(), availableCores(), choice.kernels.core)) > 0
}

// Reload makes this process compute with the kernels policy asks for: when
// it does not (Satisfies), it executes itself again with KernelsEnv set to
// policy, since the kernels are fixed when OpenBLAS loads. A command calls
// it once its config is read, before it starts anything it would lose.
// It returns only if the process already satisfies policy or cannot restart.
func Reload(policy string) error {
	err := Satisfies(policy)
	if err == nil || os.Getenv(KernelsEnv) == policy {
		return err // a process already started so that still disagrees would loop
	}
	exe, xerr := os.Executable()
	if xerr != nil {
		return fmt.Errorf("%w: %v", err, xerr)
	}
	env := append(environWithout(KernelsEnv), KernelsEnv+"="+policy)
	return fmt.Errorf("%w: %v", err, syscall.Exec(exe, os.Args, env))
}

// environWithout is this process's environment less the variables named.
func environWithout(names ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			keep = keep && name != n
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// Build says which OpenBLAS build is loaded and which kernel sets it has,
// for the CPU named: "" with gonum.
func Build() string {
	if choice.impl == nil {
		return ""
	}
	s := fmt.Sprintf("OpenBLAS build: %s; CPU: %s", choice.kernels.config, cores.Host())
	if have := availableCores(); len(have) > 0 {
		s += "; kernel sets: " + strings.Join(have, ", ")
	}
	return s
}
