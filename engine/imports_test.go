package engine

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEngineImportsNoLinks holds engine to what its doc says: it computes a
// stage's share of a model and knows nothing of configs or links, so that a
// program embedding the engine (or another backend beside it) pulls in no
// gRPC. Its callers hand it plain values (Pipeline, Options, optim.Spec).
func TestEngineImportsNoLinks(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const module = "github.com/pipetrain/pipetrain/"
	for _, dep := range strings.Fields(string(out)) {
		if dep == module+"configs" || dep == module+"transport" || strings.HasPrefix(dep, "google.golang.org/grpc") {
			t.Errorf("engine depends on %s", dep)
		}
	}
}
