package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// loadedOpenBLAS is the file this test process mapped OpenBLAS from: the
// binary under test finds the same one. A test process told to compute with
// gonum (make test-blas runs the suite so) has none to hide, and skips.
func loadedOpenBLAS(t *testing.T) string {
	t.Helper()
	if want := strings.TrimSpace(os.Getenv(blas.Env)); want == "gonum" {
		t.Skipf("%s=gonum: this test process loaded no OpenBLAS to hide", blas.Env)
	}
	if blas.Name() != "openblas" {
		testenv.RequireOrSkip(t, "OpenBLAS (Debian package libopenblas0, which make deps installs)", blas.Describe(0))
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		testenv.RequireOrSkip(t, "/proc/self/maps", err.Error())
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if p := fields[len(fields)-1]; strings.Contains(filepath.Base(p), "openblas") {
			return p
		}
	}
	t.Fatal("OpenBLAS is in use but no mapped file names it")
	return ""
}

// hidden runs the binary in a mount namespace where OpenBLAS's file is gone,
// as on a machine without the library.
func hidden(t *testing.T, lib string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	return hiding(t, lib, env, binary, args...)
}

// hiding runs prog in a mount namespace where lib is gone: its directory is
// covered by an empty one when it holds only OpenBLAS's files (Debian's
// openblas-pthread), else the file itself is covered by an empty file.
func hiding(t *testing.T, lib string, env []string, prog string, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.RequireOrSkip(t, "root", "hiding a system library takes a private mount namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.RequireOrSkip(t, "unshare (util-linux)", err.Error())
	}
	cover := `mount --bind /dev/null "$0"`
	target := lib
	if dir := filepath.Dir(lib); strings.Contains(filepath.Base(dir), "openblas") {
		cover, target = `mount -t tmpfs tmpfs "$0"`, dir
	}
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", cover + ` && exec "$@"`, target, prog}, args...)...)
	cmd.Env = append(environWithoutBLAS(), env...)
	return cmd
}

// canHide says why lib cannot be hidden here ("" when it can), found by
// hiding it from sh, which then looks for it, rather than from the binary
// under test, whose own failure without the library must fail the test.
func canHide(t *testing.T, lib string) string {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		return err.Error()
	}
	// test -s: the file exists and is not empty; hidden, it is neither.
	out, err := hiding(t, lib, nil, sh, "-c", `if test -s "$0"; then echo "$0 is still there"; exit 1; fi`, lib).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%v: %s", err, bytes.TrimSpace(out))
	}
	return ""
}

// environWithoutBLAS is the test's environment less a BLAS choice it was
// started with (make test runs it under each).
func environWithoutBLAS() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, blas.Env+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// TestWithoutOpenBLASFallsBackToGoKernels: on a machine without OpenBLAS the
// binary says so, computes with gonum's kernels, the same bits as when they
// are asked for by name, and refuses to run when OpenBLAS is required.
func TestWithoutOpenBLASFallsBackToGoKernels(t *testing.T) {
	needData(t)
	lib := loadedOpenBLAS(t)
	if why := canHide(t, lib); why != "" {
		testenv.RequireOrSkip(t, "a private mount namespace to hide OpenBLAS in", why)
	}

	out, err := hidden(t, lib, nil, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version without OpenBLAS: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "matrix products: gonum's Go kernels (no OpenBLAS:") {
		t.Fatalf("version without OpenBLAS does not say it falls back:\n%s", out)
	}

	quiet := []string{"PIPETRAIN_TRAIN_EVALUATE=false", "PIPETRAIN_CHECKPOINT_EVERY=0"}
	cfg := "../configs/fmnist-mlp-2stage.yaml"
	reference := func(cmd *exec.Cmd, dir string) []byte {
		t.Helper()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		w, err := os.ReadFile(filepath.Join(dir, "weights", "stage-0.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		var run struct {
			Compute struct{ BLAS string } `json:"compute"`
		}
		if b, err := os.ReadFile(filepath.Join(dir, "run.json")); err != nil || json.Unmarshal(b, &run) != nil {
			t.Fatalf("run.json of %s: %v", dir, err)
		}
		if run.Compute.BLAS != "gonum" {
			t.Errorf("%s: run.json says it computed with %q, want gonum", dir, run.Compute.BLAS)
		}
		return w
	}
	fell := filepath.Join(t.TempDir(), "fell-back")
	asked := filepath.Join(t.TempDir(), "asked")
	args := func(dir string) []string {
		return []string{"reference", "--config", cfg, "--steps", "3", "--pipeline-threads", "--run-dir", dir}
	}
	a := reference(hidden(t, lib, quiet, args(fell)...), fell)
	forced := exec.Command(binary, args(asked)...)
	forced.Env = append(environWithoutBLAS(), append(quiet, blas.Env+"=gonum")...)
	b := reference(forced, asked)
	if !bytes.Equal(a, b) {
		t.Error("weights trained after falling back to gonum differ from those with gonum asked for")
	}

	required := hidden(t, lib, append(quiet, blas.Env+"=openblas"), args(filepath.Join(t.TempDir(), "required"))...)
	out, err = required.CombinedOutput()
	if err == nil || !strings.Contains(string(out), blas.Env+"=openblas") {
		t.Errorf("with %s=openblas and no OpenBLAS the run should stop naming the variable; err %v, output:\n%s", blas.Env, err, out)
	}
}
