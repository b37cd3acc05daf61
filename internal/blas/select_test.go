package blas

import (
	"os"
	"strings"
	"testing"
)

// restore puts back the choice the process started with.
func restore(t *testing.T) {
	t.Cleanup(func() {
		policy, _ := ParseKernels(os.Getenv(KernelsEnv))
		choose(os.Getenv(Env), policy)
	})
}

func TestGonumWhenAskedFor(t *testing.T) {
	restore(t)
	choose("gonum", "auto")
	if Name() != "gonum" || Library() != "" || Err() != nil {
		t.Fatalf("gonum asked for: name %q library %q err %v", Name(), Library(), Err())
	}
	if d := Describe(2); !strings.Contains(d, Env+"=gonum") {
		t.Errorf("Describe does not say why: %q", d)
	}
}

// TestMissingLibraryIsAnErrorOnlyWhenRequired: auto falls back quietly to
// gonum, saying why; a named library that cannot be loaded is an error
// naming the variable and the file.
func TestMissingLibraryIsAnErrorOnlyWhenRequired(t *testing.T) {
	restore(t)
	missing := "/nonexistent/libopenblas.so.0"
	choose(missing, "auto")
	if Name() != "gonum" || Err() == nil || !strings.Contains(Err().Error(), Env+"="+missing) {
		t.Fatalf("a missing named library: name %q err %v", Name(), Err())
	}
	saved := searched
	t.Cleanup(func() { searched = saved })
	searched = []string{missing}
	choose("", "auto")
	if Name() != "gonum" || Err() != nil || !strings.Contains(Describe(1), "no OpenBLAS") {
		t.Fatalf("auto without a library: name %q err %v describe %q", Name(), Err(), Describe(1))
	}
	choose("openblas", "auto")
	if Err() == nil || !strings.Contains(Err().Error(), Env+"=openblas") {
		t.Fatalf("openblas required without a library: err %v", Err())
	}
}

func TestNotABLASIsRefused(t *testing.T) {
	restore(t)
	if _, _, err := load(nil); err != nil && strings.Contains(err.Error(), "nodlopen") {
		t.Skip("this build loads no library (-tags nodlopen)")
	}
	// libc is loadable everywhere pipetrain runs, and has no sgemm_.
	choose("libc.so.6", "auto")
	if Err() == nil || !strings.Contains(Err().Error(), "not an OpenBLAS") {
		t.Fatalf("libc as BLAS: err %v", Err())
	}
}
