//go:build (linux || darwin || freebsd) && !nodlopen

package blas

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

const helperEnv = "PIPETRAIN_BLAS_TEST_HELPER"

// TestKernelsHelper is the child process of the tests below: it says what
// its init chose.
func TestKernelsHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		// The child process the tests below start; alone it has nothing to say.
		t.Skip("the child process of TestNamedKernelsAreLoaded and the kernel tests after it; they run it")
	}
	core, reason := Kernels()
	os.Stdout.WriteString("KERNELS " + KernelSet() + "|" + reason + "|" + os.Getenv(coreTypeEnv) + "|" + os.Getenv(chosenEnv) + "|" + errText(Err()) + "\n")
	_ = core
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// child runs this test binary's init with env and returns what the helper
// printed: kernel set, reason, OPENBLAS_CORETYPE, the marker, Err.
func child(t *testing.T, env ...string) ([]string, time.Duration) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKernelsHelper$", "-test.count=1")
	cmd.Env = append(environWithout(coreTypeEnv, KernelsEnv, chosenEnv, probeEnv, Env), append(env, helperEnv+"=1")...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("%v: %v\n%s", env, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "KERNELS "); ok {
			return strings.Split(rest, "|"), took
		}
	}
	t.Fatalf("%v: no answer:\n%s", env, out)
	return nil, 0
}

func requireOpenBLAS(t *testing.T, want ...string) {
	t.Helper()
	if Name() != "openblas" {
		testenv.RequireOrSkip(t, "OpenBLAS", Describe(0))
	}
	have := availableCores()
	for _, c := range want {
		if !slices.Contains(have, c) {
			t.Skipf("this OpenBLAS has no %s kernels (it has %v)", c, have)
		}
		if why := cores.Missing(cores.Host(), c); why != "" {
			t.Skip(why)
		}
	}
}

// TestNamedKernelsAreLoaded: compute.blas_kernels NAME reaches OpenBLAS,
// which reads OPENBLAS_CORETYPE from the C environment when it loads: set
// through os.Setenv, which in a binary without cgo purego's runtime passes
// to libc's setenv.
func TestNamedKernelsAreLoaded(t *testing.T) {
	requireOpenBLAS(t, "Sandybridge")
	got, took := child(t, KernelsEnv+"=sandybridge")
	if got[0] != "OpenBLAS Sandybridge" || got[2] != "" || got[4] != "" {
		t.Fatalf("compute.blas_kernels sandybridge: %q", got)
	}
	t.Logf("a process with named kernels (self-tested) starts in %v", took)
}

// TestAutoReplacesAForcedPrescott: with OPENBLAS_CORETYPE=Prescott set by
// the user, as the library's own fallback on an unknown CPU, auto sees
// Prescott below this CPU, self-tests better sets in child processes,
// restarts with one, says so, and gives its children the user's variable
// back; "library" keeps Prescott.
func TestAutoReplacesAForcedPrescott(t *testing.T) {
	requireOpenBLAS(t, "Prescott")
	if len(cores.Candidates(cores.Host(), availableCores(), "Prescott")) == 0 {
		t.Skip("nothing on this CPU beats Prescott")
	}
	lib, libTook := child(t, coreTypeEnv+"=Prescott", KernelsEnv+"=library")
	if lib[0] != "OpenBLAS Prescott" || !strings.Contains(lib[1], coreTypeEnv+"=Prescott") {
		t.Fatalf("library with OPENBLAS_CORETYPE=Prescott: %q", lib)
	}
	auto, autoTook := child(t, coreTypeEnv+"=Prescott")
	if auto[0] == "OpenBLAS Prescott" || !strings.HasPrefix(auto[1], "OpenBLAS chose Prescott for this CPU; using ") || !strings.Contains(auto[1], "faster in the self-test") {
		t.Fatalf("auto with OPENBLAS_CORETYPE=Prescott: %q", auto)
	}
	if auto[2] != "Prescott" || auto[3] != "" {
		t.Errorf("after restarting, OPENBLAS_CORETYPE is %q (want the user's Prescott) and %s %q (want unset)", auto[2], chosenEnv, auto[3])
	}
	t.Logf("%s: %s; start-up %v, against %v keeping Prescott", auto[0], auto[1], autoTook, libTook)
}

// TestProbeSurvivesKernelsTheCPUCannotRun: OpenBLAS loads kernels it is
// told to whatever the CPU; the probe runs them in a child, whose death
// refuses the set instead of ending this process.
func TestProbeSurvivesKernelsTheCPUCannotRun(t *testing.T) {
	requireOpenBLAS(t)
	if !slices.Contains(availableCores(), "SkylakeX") || cores.Missing(cores.Host(), "SkylakeX") == "" {
		t.Skip("needs a build with SkylakeX kernels and a CPU without AVX-512")
	}
	r := probe(Library(), "SkylakeX")
	if r.Err == "" {
		t.Fatalf("SkylakeX's kernels passed on a CPU without AVX-512: %+v", r)
	}
	t.Logf("refused: %s", r.Err)
}

func TestSatisfies(t *testing.T) {
	requireOpenBLAS(t)
	core, _ := Kernels()
	if choice.kernels.policy != "auto" {
		t.Skipf("this process loaded under %s", choice.kernels.policy)
	}
	for _, ok := range []string{"auto", "", core, strings.ToLower(core)} {
		if err := Satisfies(ok); err != nil {
			t.Errorf("Satisfies(%q) with %s loaded under auto: %v", ok, core, err)
		}
	}
	other := "Prescott"
	if core == other {
		other = "Nehalem"
	}
	if err := Satisfies(other); err == nil || !strings.Contains(err.Error(), KernelsEnv+"="+other) {
		t.Errorf("Satisfies(%s) with %s loaded: %v", other, core, err)
	}
	if err := Satisfies("Pentium9"); err == nil || !strings.Contains(err.Error(), "unknown kernel set") {
		t.Errorf("an unknown name: %v", err)
	}
}
