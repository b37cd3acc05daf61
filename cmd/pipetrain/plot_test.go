package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/stages"
)

// writeMetrics writes ms as a run directory's metrics.jsonl.
func writeMetrics(t *testing.T, dir string, ms []stages.Metric) {
	t.Helper()
	var b strings.Builder
	for _, m := range ms {
		line, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPlotDrawsRateAndNormWhenLogged: a run that logged a learning rate
// and a gradient norm per step gets a picture of each beside its loss's;
// a run that logged neither gets the loss alone.
func TestPlotDrawsRateAndNormWhenLogged(t *testing.T) {
	plain, recipe := t.TempDir(), t.TempDir()
	var ms, withRates []stages.Metric
	for step := 1; step <= 4; step++ {
		m := stages.Metric{Step: step, Loss: 2 / float64(step), SamplesPerSec: 100, ElapsedSec: float64(step)}
		ms = append(ms, m)
		lr, norm := 0.001*float64(step), 3/float64(step)
		m.LR, m.GradNorm = &lr, &norm
		withRates = append(withRates, m)
	}
	writeMetrics(t, plain, ms)
	writeMetrics(t, recipe, withRates)

	out := captureStdout(t, func() {
		if _, err := runCommand(t, plotCmd(), plain); err != nil {
			t.Error(err)
		}
	})
	if strings.Contains(out, "lr.svg") || !strings.Contains(out, filepath.Join(plain, "loss.svg")) {
		t.Errorf("a run without rates: %q", out)
	}
	if _, err := os.Stat(filepath.Join(plain, "loss-lr.svg")); err == nil {
		t.Error("loss-lr.svg drawn for a run that logged no rate")
	}

	out = captureStdout(t, func() {
		if _, err := runCommand(t, plotCmd(), recipe); err != nil {
			t.Error(err)
		}
	})
	for file, title := range map[string]string{"loss-lr.svg": "Learning rate of", "loss-grad_norm.svg": "Gradient norm of"} {
		path := filepath.Join(recipe, file)
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), title) {
			t.Errorf("%s: %v, title %q in it: %v", file, err, title, strings.Contains(string(b), title))
		}
		if !strings.Contains(out, path) {
			t.Errorf("the command did not say it wrote %s: %q", path, out)
		}
	}
}

// TestPrintNextNamesTheCommands: a finished launch names the run's files
// and the commands that read them, training on only when a checkpoint was
// kept; each command it prints is one the CLI has.
func TestPrintNextNamesTheCommands(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	printNext(&b, dir)
	for _, want := range []string{"files in " + dir, "pipetrain profile " + dir, "pipetrain plot " + dir, "pipetrain export " + dir + " --out "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "--resume") {
		t.Errorf("offers to train on without a checkpoint:\n%s", b.String())
	}
	if err := os.MkdirAll(filepath.Join(dir, "checkpoints", "step-00000010"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	printNext(&b, dir)
	if !strings.Contains(b.String(), "pipetrain launch --resume "+dir+" --steps N") {
		t.Errorf("does not offer to train on from the checkpoint:\n%s", b.String())
	}
	for _, name := range []string{"profile", "plot", "export", "launch"} {
		found := false
		for _, c := range newRoot().Commands() {
			found = found || c.Name() == name
		}
		if !found {
			t.Errorf("printNext names pipetrain %s, which the CLI lacks", name)
		}
	}
}
