package blas

import (
	"fmt"
	"os"
	"strings"
	"sync"

	G "gorgonia.org/gorgonia"
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
	once      sync.Once
}

func init() { choose(os.Getenv(Env)) }

// choose loads the BLAS that want names and hands it to gorgonia.
func choose(want string) {
	choice.name, choice.library, choice.err, choice.notLoaded, choice.threads = "gonum", "", nil, "", nil
	switch strings.TrimSpace(want) {
	case "gonum":
		return
	case "", "auto":
		impl, lib, err := load(searched)
		if err != nil {
			choice.notLoaded = err.Error()
			return
		}
		use(impl, lib)
	case "openblas":
		impl, lib, err := load(searched)
		if err != nil {
			choice.err = fmt.Errorf("%s=openblas: %w", Env, err)
			return
		}
		use(impl, lib)
	default:
		impl, lib, err := load([]string{want})
		if err != nil {
			choice.err = fmt.Errorf("%s=%s: %w", Env, want, err)
			return
		}
		use(impl, lib)
	}
}

func use(impl *openBLAS, lib string) {
	G.Use(impl)
	choice.name, choice.library, choice.threads = "openblas", lib, impl.setThreads
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
