package cuda

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDefaultBuildHasNoCUDA: without -tags pipetrain_cuda the binary pulls
// in neither this package nor gorgonia/cu, and builds without cgo, so go
// install needs no CUDA.
func TestDefaultBuildHasNoCUDA(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "../../../cmd/pipetrain")
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/pipetrain with CGO_ENABLED=0: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "gorgonia.org/cu" || strings.HasPrefix(dep, "gorgonia.org/cu/") || dep == "github.com/pipetrain/pipetrain/compute/gpu/cuda" {
			t.Errorf("the default build of cmd/pipetrain depends on %s", dep)
		}
	}
	if !strings.Contains(string(out), "github.com/pipetrain/pipetrain/compute\n") {
		t.Error("cmd/pipetrain does not depend on compute: the check reads the wrong list")
	}
}
