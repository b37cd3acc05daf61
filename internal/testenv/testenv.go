// Package testenv decides what a test does when the machine lacks a part it
// needs that Go does not bring: root, network namespaces (iproute2,
// util-linux), Slurm, Prometheus, PyTorch, OpenBLAS, the Fashion-MNIST data.
// On a developer's machine such a test skips, naming the part; where every
// part is promised (CI: .ci/run installs them all and sets RequireAllEnv=1)
// it fails, so a test that silently stopped running cannot pass CI.
package testenv

import (
	"os"
	"testing"
)

// RequireAllEnv is the variable that, set to 1, turns a missing part into a
// failure.
const RequireAllEnv = "PIPETRAIN_REQUIRE_ALL"

// RequireAll says whether the environment promises every part.
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// RequireOrSkip ends the test because what (a package, a tool, root) is
// missing, for the reason why: it skips, or with RequireAllEnv=1 it fails.
func RequireOrSkip(t testing.TB, what, why string) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("needs %s, which %s=1 requires: %s", what, RequireAllEnv, why)
	}
	t.Skipf("needs %s: %s", what, why)
}
