package stages

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
)

// startingParams builds c's stages (or its reference) without running them
// and returns every parameter they start with, by name.
func startingParams(t *testing.T, c *configs.Config, reference bool) map[string]checkpoint.Tensor {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	n := len(c.Stages)
	if reference {
		n = 1
	}
	var text *data.Text
	if c.Data.Dataset == "text" {
		text = testText(t)
	}
	// New wants its links, though nothing is sent here.
	links := pipeLinks(t, c, n)
	t.Cleanup(func() {
		for _, l := range links {
			for _, x := range l {
				if x != nil {
					x.Close()
				}
			}
		}
	})
	out := map[string]checkpoint.Tensor{}
	for i := range n {
		rt, err := New(Options{Config: c, Stage: i, Reference: reference, RunDir: t.TempDir(), Prev: links[i][0], Next: links[i][1],
			Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2), Text: text})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range rt.Chunks() {
			for _, w := range e.Weights() {
				out[w.Name] = denseTensor(w.Name, w.Value.Clone().(*tensor.Dense))
			}
		}
	}
	return out
}

// exportRun exports a finished run's final weights and returns the file.
func exportRun(t *testing.T, c *configs.Config, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "export.safetensors")
	e, err := Export(c, dir, FinalWeights, out)
	if err != nil {
		t.Fatal(err)
	}
	if e.Meta["model"] != c.Model.Name || e.Meta["config_digest"] != c.Digest() || e.Meta["step"] != fmt.Sprint(c.Train.Steps) {
		t.Errorf("export metadata %v", e.Meta)
	}
	return out
}

// TestInitFromExportRoundTrip: a run started from another run's export holds
// that run's final weights bit for bit, on every stage and in the reference,
// tied copies included.
func TestInitFromExportRoundTrip(t *testing.T) {
	for _, c := range []*configs.Config{
		testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam"),
		gptConfig("1f1b", plain("0-1", "2-4"), true),
	} {
		t.Run(c.Model.Name, func(t *testing.T) {
			c.Train.Steps = 3
			dir := runInProcess(t, c, false)
			file := exportRun(t, c, dir)
			trained := readWeights(t, dir)

			next := *c
			next.Train.InitFrom = file
			next.Train.Seed = 99 // the seed's weights must not show through
			for _, reference := range []bool{false, true} {
				if err := checkpoint.Diff(trained, startingParams(t, &next, reference)); err != nil {
					t.Errorf("reference=%v: started from %s with other weights: %v", reference, file, err)
				}
			}
			// A run's own weights folder starts a run as well.
			next.Train.InitFrom = dir
			if err := checkpoint.Diff(trained, startingParams(t, &next, false)); err != nil {
				t.Errorf("started from %s with other weights: %v", dir, err)
			}
		})
	}
}

// TestInitFromPipelineEqualsReference: a pipelined run and the reference
// started from the same file stay bit-identical, and the file, not the
// seed, is what they start from.
func TestInitFromPipelineEqualsReference(t *testing.T) {
	for _, c := range []*configs.Config{
		testConfig("zb-h1", plain("0", "1-2", "3"), 3, "float32", "adam"),
		gptConfig("interleaved", [][]string{{"0", "2-3"}, {"1", "4"}}, true),
	} {
		t.Run(c.Model.Name, func(t *testing.T) {
			seeded := *c
			seeded.Train.Seed = 3
			seeded.Train.Steps = 2
			file := exportRun(t, &seeded, runInProcess(t, &seeded, true))

			c.Train.InitFrom = file
			ref := runInProcess(t, c, true)
			sameRun(t, ref, runInProcess(t, c, false))

			c.Train.InitFrom = ""
			if fmt.Sprint(readLosses(t, ref)) == fmt.Sprint(readLosses(t, runInProcess(t, c, true))) {
				t.Error("the run from init_from has the losses of the run from the seed")
			}
		})
	}
}

// TestResumeBeatsInitFrom: a resumed run continues from its checkpoint, not
// from train.init_from, and ends as a run never stopped.
func TestResumeBeatsInitFrom(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	cfg.Train.Steps = 2
	other := exportRun(t, cfg, runInProcess(t, cfg, false))
	cfg.Train.Seed = 4
	cfg.Train.Steps = 2
	first := exportRun(t, cfg, runInProcess(t, cfg, false))

	cfg.Train.InitFrom = first
	cfg.Train.Steps = 6
	cfg.Checkpoint.Every, cfg.Checkpoint.Keep = 2, 2
	full := runInProcess(t, cfg, false)

	dir := t.TempDir()
	cfg.Train.Steps = 4
	runStagesIn(t, cfg, false, dir, false)
	cfg.Train.Steps = 6
	cfg.Train.InitFrom = other
	runStagesIn(t, cfg, false, dir, true)
	sameWeights(t, full, dir)
	sameLosses(t, full, dir)
}

// TestInitFromErrors: validation refuses a file that cannot start the model,
// naming train.init_from, the file and the tensor.
func TestInitFromErrors(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	c.Train.Steps = 1
	dir := runInProcess(t, c, false)
	file := exportRun(t, c, dir)
	ts, _, err := checkpoint.Read(file)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, edit func(checkpoint.Tensor) (checkpoint.Tensor, bool)) string {
		var out []checkpoint.Tensor
		for _, t := range ts {
			if t, keep := edit(t); keep {
				out = append(out, t)
			}
		}
		path := filepath.Join(filepath.Dir(file), name)
		if err := checkpoint.Write(path, out, nil); err != nil {
			t.Fatal(err)
		}
		return path
	}
	missing := write("missing.safetensors", func(t checkpoint.Tensor) (checkpoint.Tensor, bool) { return t, t.Name != "fc2.weight" })
	misshapen := write("misshapen.safetensors", func(t checkpoint.Tensor) (checkpoint.Tensor, bool) {
		if t.Name == "fc1.bias" {
			t.Shape, t.F32 = []int{5}, t.F32[:5]
		}
		return t, true
	})
	for path, want := range map[string]string{
		missing:                   "train.init_from: " + missing + ": no tensor fc2.weight (shape [5 6], the model's fc2.weight)",
		misshapen:                 "train.init_from: " + misshapen + ": tensor fc1.bias has shape [5], the model needs [6]",
		filepath.Join(dir, "nil"): "train.init_from: " + filepath.Join(dir, "nil") + ": no such file or directory",
	} {
		c.Train.InitFrom = path
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("init_from %s: %v; want %q", filepath.Base(path), err, want)
		}
	}
	// The stage checks again when it starts: the file may have changed since.
	c.Train.InitFrom = file
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(missing, file); err != nil {
		t.Fatal(err)
	}
	l, err := NewLayout(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Options{Layout: l, Config: c, Stage: 1, RunDir: t.TempDir(), Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
	if want := "train.init_from: " + file + ": no tensor fc2.weight"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("stage 1 from a changed file: %v; want %q", err, want)
	}
}
