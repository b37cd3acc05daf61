package cuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// TestPTXIsCompiledFromKernels: the committed kernels/kernels.ptx, which
// the cuda build embeds, is what nvcc makes of kernels/kernels.cu with the
// go:generate line's flags, so the kernels cannot change without it.
func TestPTXIsCompiledFromKernels(t *testing.T) {
	if _, err := exec.LookPath("nvcc"); err != nil {
		testenv.RequireOrSkip(t, "nvcc", "scripts/cuda-deps.sh installs CUDA 11.8's")
	}
	if v, _ := exec.Command("nvcc", "--version").Output(); !bytes.Contains(v, []byte("release 11.8,")) {
		// Another nvcc writes other PTX (its version, its register choices).
		testenv.RequireOrSkip(t, "nvcc 11.8", "the committed PTX is CUDA 11.8's (scripts/cuda-deps.sh), this nvcc says "+string(bytes.TrimSpace(v)))
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^//go:generate (nvcc .*) -o kernels/kernels.ptx kernels/kernels.cu$`).FindSubmatch(doc)
	if m == nil {
		t.Fatal("doc.go has no go:generate line compiling kernels/kernels.cu")
	}
	out := filepath.Join(t.TempDir(), "kernels.ptx")
	args := append(strings.Fields(string(m[1]))[1:], "-o", out, "kernels/kernels.cu")
	if b, err := exec.Command("nvcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("nvcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("kernels/kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("kernels/kernels.ptx is not what nvcc makes of kernels/kernels.cu: run make ptx and commit it")
	}
}
