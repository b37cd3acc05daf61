package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSimulateZBV: simulate predicts zb-v on the shipped V config at its
// closed form (3 idle half-units of 51 with F = I = W), prints its grid with
// the placement line that --schedule-file needs to read it back as the same
// schedule, and on a plain config counts each chunk half a stage's
// activations, so that zb-v's peak is 1f1b's first stage's.
func TestSimulateZBV(t *testing.T) {
	out, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-zbv.yaml", "--schedule", "zb-v", "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "\nzb-v (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%, equal-stage theory 5.9%\n") {
		t.Fatalf("no zb-v summary at its closed form:\n%s", out)
	}
	grid := printedGrids(out)["zb-v"]
	if !strings.Contains(grid, "\n  placement: v\n  stage 0: 0F0 ") {
		t.Fatalf("the printed grid lacks its placement:\n%s", grid)
	}
	path := filepath.Join(t.TempDir(), "zbv.txt")
	if err := os.WriteFile(path, []byte(grid), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-zbv.yaml", "--schedule-file", path, "--costs", "f=1,b=2,w=1", "--transfer", "0")
	if err != nil {
		t.Fatalf("simulate --schedule-file: %v\n%s", err, again)
	}
	if !strings.Contains(again, "\nschedule from file (2 chunks per stage): makespan 25.50 ms, mean bubble 5.9%\n") {
		t.Errorf("the printed grid does not simulate as zb-v:\n%s", again)
	}

	plain, err := runCommand(t, simulateCmd(), "--config", "../../configs/fmnist-mlp-4stage.yaml", "--schedule", "zb-v,1f1b", "--costs", "f=1,b=2,w=1")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, plain)
	}
	stage0 := regexp.MustCompile(`\n(zb-v|1f1b)[^\n]*makespan[^\n]*\n  stage 0 [^\n]*peak stash (\d+) micro-batch(?:es)? \(([\d.]+) MiB\)`)
	got := map[string][2]string{}
	for _, m := range stage0.FindAllStringSubmatch(plain, -1) {
		got[m[1]] = [2]string{m[2], m[3]}
	}
	if got["zb-v"][0] != "8" || got["1f1b"][0] != "4" || got["zb-v"][1] != got["1f1b"][1] || got["1f1b"][1] == "0.00" {
		t.Errorf("stage 0's peak stash: zb-v %v chunks, 1f1b %v micro-batches; want the same bytes\n%s", got["zb-v"], got["1f1b"], plain)
	}
}
