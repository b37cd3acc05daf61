package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// root is the module's folder, from this package's.
const root = "../.."

// goTool is the go command that runs the tests.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no go command on PATH or in %s", p)
	}
	return p
}

// build builds every program under examples/ as a user would, into a
// temporary folder, and returns this one's path.
func build(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command(goTool(t), "build", "-o", bin+string(filepath.Separator), "./examples/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/...: %v\n%s", err, out)
	}
	return filepath.Join(bin, "extend")
}

// runProgram runs the program and returns its exit status, standard output and
// standard error.
func runProgram(t *testing.T, prog string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(prog, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("%s: %v", prog, err)
	}
	return 0, stdout.String(), stderr.String()
}

// TestExtendEqualsReference: the program, which registers its own model
// family, dataset kind and device kind, trains them over two stages (each
// on its own index of the device) and finds the
// pipeline equal to its reference in every loss, the evaluation and every
// weight; with the reference's learning rate perturbed it finds the
// difference and exits 1 naming it.
func TestExtendEqualsReference(t *testing.T) {
	prog := build(t)
	code, stdout, stderr := runProgram(t, prog)
	if code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "the metered device opened chunks on devices [0 1]\n") {
		t.Errorf("output lacks the chunks the metered device opened:\n%s", stdout)
	}
	if !strings.Contains(stdout, "equal to the one-process reference bit for bit: 20 losses, the evaluation, 7 weight tensors") {
		t.Errorf("output lacks the comparison of 20 losses and 7 weight tensors:\n%s", stdout)
	}
	if !regexp.MustCompile(`scaled-mlp on blobs, 2 stages over loopback: loss \d\.\d{4} at step 1, \d\.\d{4} at step 20; test accuracy \d\.\d{4} of 32 examples`).MatchString(stdout) {
		t.Errorf("output lacks the run's summary:\n%s", stdout)
	}

	code, stdout, stderr = runProgram(t, prog, "-perturb")
	if code != 1 {
		t.Fatalf("-perturb: exit status %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"the 2-stage pipeline differs from its reference", "step 20: loss ", "evaluation {", "weights: "} {
		if !strings.Contains(stderr, want) {
			t.Errorf("-perturb: stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// TestExamplesImportNoInternal: the examples reach pipetrain only through
// its public packages, as a program outside the module must (Go refuses
// internal/ imports from outside, but not from examples/, which is inside).
// The public packages themselves use internal ones, so the check is on the
// examples' own imports, tests included.
func TestExamplesImportNoInternal(t *testing.T) {
	cmd := exec.Command(goTool(t), "list", "-f", `{{.ImportPath}}: {{join .Imports " "}} {{join .TestImports " "}}`, "./examples/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./examples/...: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || !strings.Contains(string(out), "github.com/pipetrain/pipetrain/stages") {
		t.Fatalf("go list ./examples/... lists no package importing pipetrain's stages:\n%s", out)
	}
	for _, line := range lines {
		for _, imp := range strings.Fields(line)[1:] {
			if strings.HasPrefix(imp, "github.com/pipetrain/pipetrain/internal/") {
				t.Errorf("%s imports %s", strings.TrimSuffix(strings.Fields(line)[0], ":"), imp)
			}
		}
	}
}

// TestExtendingDocQuotesTheExample: every Go and YAML snippet of
// docs/extending.md is taken from this program word for word, so the doc
// shows code that builds and trains.
func TestExtendingDocQuotesTheExample(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "extending.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	snippets := regexp.MustCompile("(?s)```(?:go|yaml)\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(snippets) < 3 {
		t.Fatalf("docs/extending.md has %d Go and YAML snippets, want at least the family, the kind and the config", len(snippets))
	}
	for _, s := range snippets {
		if !bytes.Contains(src, s[1]) {
			t.Errorf("docs/extending.md quotes code that examples/extend/main.go does not hold:\n%s", s[1])
		}
	}
}
