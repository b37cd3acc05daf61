package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Python is Debian's python3, which imports the python3-* packages `make
// test` installs (PyTorch, NumPy, regex); a python3 earlier on PATH (a
// pyenv's) may lack them.
const Python = "/usr/bin/python3"

var (
	importsMu sync.Mutex
	imports   = map[string]error{} // each module's import, tried once
)

// NeedPython ends the test (RequireOrSkip) unless Python imports module,
// which Debian's package pkg installs.
func NeedPython(t testing.TB, module, pkg string) {
	t.Helper()
	importsMu.Lock()
	err, tried := imports[module]
	if !tried {
		if out, e := exec.Command(Python, "-c", "import "+module).CombinedOutput(); e != nil {
			err = e
			if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); lines[len(lines)-1] != "" {
				err = fmt.Errorf("%v: %s", e, lines[len(lines)-1])
			}
		}
		imports[module] = err
	}
	importsMu.Unlock()
	if err != nil {
		RequireOrSkip(t, fmt.Sprintf("Python's %s (Debian package %s, which `make test` installs)", module, pkg), fmt.Sprintf("%s cannot import %s: %v", Python, module, err))
	}
}

// NeedTorch is NeedPython for PyTorch.
func NeedTorch(t testing.TB) { NeedPython(t, "torch", "python3-torch") }

// RunPython runs Python on script with args, failing the test with the
// script's output when it fails.
func RunPython(t testing.TB, script string, args ...string) {
	t.Helper()
	cmd := exec.Command(Python, append([]string{script}, args...)...)
	// No __pycache__ in the source tree.
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
	}
}

// RunPythonJSON runs script IN OUT, IN holding in as JSON, and decodes the
// JSON script writes to OUT into out.
func RunPythonJSON(t testing.TB, script string, in, out any) {
	t.Helper()
	dir := t.TempDir()
	inPath, outPath := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	RunPython(t, script, inPath, outPath)
	if b, err = os.ReadFile(outPath); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s's output: %v", script, err)
	}
}
