package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/stages"
)

// TestEvaluateLaunchedRun: pipetrain evaluate on the run directory of a
// llama launched as 2 stage processes, and on its export, prints the run's
// own eval.json, every figure bit for bit, from one process.
func TestEvaluateLaunchedRun(t *testing.T) {
	cfg := withFreshAddresses(t, "../configs/llama-tiny-2stage.yaml")
	runDir := t.TempDir()
	if r := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", runDir, "--steps", "3"); r.err != nil {
		t.Fatalf("launch: %v\n%s", r.err, r.out)
	}
	b, err := os.ReadFile(filepath.Join(runDir, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want stages.EvalResult
	if err := json.Unmarshal(b, &want); err != nil || want.Perplexity == 0 {
		t.Fatalf("eval.json %s: %v", b, err)
	}
	export := filepath.Join(t.TempDir(), "llama.safetensors")
	if r := run(t, time.Minute, nil, "export", runDir, "--out", export); r.err != nil {
		t.Fatalf("export: %v\n%s", r.err, r.out)
	}
	for _, args := range [][]string{{"--weights", runDir}, {"--config", cfg, "--weights", export}} {
		r := run(t, 2*time.Minute, nil, append([]string{"evaluate", "--json"}, args...)...)
		var got stages.EvalResult
		_, js, _ := strings.Cut(r.out, "\n{")
		if r.err != nil || json.Unmarshal([]byte("{"+js), &got) != nil || got != want {
			t.Errorf("evaluate %v: %v, printed\n%s\nwant eval.json's %+v", args, r.err, r.out, want)
		}
	}
	t.Logf("validation loss %v on %d tokens, equal", want.Loss, want.Examples)
}
