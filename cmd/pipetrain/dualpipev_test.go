package main

import (
	"strings"
	"testing"
)

// TestSimulateDualPipeV: simulate predicts dualpipev on its shipped V config
// at its closed form (zb-v's, 3 idle half-units of 51 with F = I = W), each
// stage peaking at 2p+1 = 9 micro-batch chunks, and prints its grid with the
// placement line.
func TestSimulateDualPipeV(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-dualpipev.yaml", "--schedule", "dualpipev", "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\ndualpipev (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%, equal-stage theory 5.9%\n") {
		t.Fatalf("no dualpipev summary at its closed form:\n%s", out)
	}
	if n := strings.Count(out, "peak stash 9 micro-batches"); n != 4 {
		t.Errorf("%d of 4 stages peak at 9 micro-batch chunks:\n%s", n, out)
	}
	if grid := printedGrids(out)["dualpipev"]; !strings.Contains(grid, "\n  placement: v\n  stage 0: 0F0 ") {
		t.Errorf("the printed grid lacks its placement:\n%s", grid)
	}
}
