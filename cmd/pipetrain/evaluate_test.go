package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/stages"
)

// TestEvaluateCommand: pipetrain evaluate on a reference run's directory
// prints its eval.json (--json: the same figures bit for bit; the line:
// them rounded), as on the run's export; --data changes the evaluation
// split (val_fraction) and is refused naming a key the section lacks;
// --checkpoint needs a run directory; nothing is written into the run.
func TestEvaluateCommand(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "corpus.txt"), []byte(strings.Repeat("func f(a, b int) int { return a*b + 1 }\n", 60)), 0o644); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(root, "gpt.yaml")
	text := `
model: {name: gpt, vocab: 256, context: 8, width: 8, heads: 2, layers: 2}
data: {dataset: text, corpus: corpus.txt, tokenizer: byte, val_fraction: 0.2, batch_size: 8, micro_batches: 4}
train: {steps: 3, evaluate: true, optimizer: {name: adam, lr: 0.01}}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(root, "run")
	if out, err := runCommand(t, referenceCmd(), "--config", config, "--run-dir", run); err != nil {
		t.Fatalf("reference: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(run, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want stages.EvalResult
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	evaluate := func(args ...string) (string, error) {
		c := evaluateCmd()
		c.SilenceUsage, c.SilenceErrors = true, true
		return runCommand(t, c, args...)
	}
	out, err := evaluate("--config", config, "--weights", run, "--json")
	var got stages.EvalResult
	if _, js, _ := strings.Cut(out, "\n"); err != nil || json.Unmarshal([]byte(js), &got) != nil || got != want {
		t.Errorf("--json: %v, printed\n%s\nwant eval.json's %+v", err, out, want)
	}
	line := fmt.Sprintf("pipetrain: validation loss %.4f, perplexity %.2f, next-token accuracy %.2f%% on %d tokens\n", want.Loss, want.Perplexity, 100*want.Accuracy, want.Examples)
	export := filepath.Join(root, "gpt.safetensors")
	if out, err := runCommand(t, exportCmd(), run, "--config", config, "--out", export); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	before := fileStates(t, root)
	for _, args := range [][]string{{"--weights", run}, {"--weights", export}, {"--weights", run, "--checkpoint", "latest"}} {
		if out, err := evaluate(append([]string{"--config", config}, args...)...); err != nil || !strings.HasSuffix(out, line) {
			t.Errorf("%v: %v, printed\n%s\nwant it to end %s", args, err, out, line)
		}
	}
	if after := fileStates(t, root); after != before {
		t.Errorf("evaluating wrote files: before\n%s\nafter\n%s", before, after)
	}
	out, err = evaluate("--config", config, "--weights", run, "--json", "--data", "data.val_fraction=0.4")
	if _, js, _ := strings.Cut(out, "\n"); err != nil || json.Unmarshal([]byte(js), &got) != nil || got.Examples <= want.Examples {
		t.Errorf("--data data.val_fraction=0.4: %v, printed\n%s\nwant more than %d tokens", err, out, want.Examples)
	}
	for args, refusal := range map[string]string{
		"--data data.val_fractoin=0.4":            "--data data.val_fractoin=0.4: data.val_fractoin is no key of the data section of dataset text (did you mean data.val_fraction?)",
		"--checkpoint latest --weights=" + export: "--checkpoint latest: --weights " + export + " is no run directory",
		"--checkpoint 2":                          filepath.Join(run, "checkpoints") + ": no committed checkpoint of step 2; committed checkpoints: steps 3",
	} {
		if _, err := evaluate(append([]string{"--config", config, "--weights", run}, strings.Fields(args)...)...); err == nil || !strings.Contains(err.Error(), refusal) {
			t.Errorf("%s: %v, want %s", args, err, refusal)
		}
	}
}

// fileStates lists every file under dir with its size and modification time, one a line.
func fileStates(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil {
			fmt.Fprintf(&b, "%s %d %v\n", path, info.Size(), info.ModTime().UnixNano())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
