package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

const exportConfig = `model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 4, micro_batches: 2}
stages:
  - {layers: "0-1", address: 127.0.0.1:7301}
  - {layers: "2", address: 127.0.0.1:7302}
`

// fakeRun writes a run directory as a two-stage run of exportConfig leaves
// it: each stage's final weights and, if asked, a committed checkpoint of
// step 4 (with optimizer state). Values are each tensor's flat indices.
func fakeRun(t *testing.T, withCheckpoint bool) (cfgPath, runDir string) {
	t.Helper()
	dir := t.TempDir()
	cfgPath, runDir = filepath.Join(dir, "run.yaml"), filepath.Join(dir, "run")
	if err := os.WriteFile(cfgPath, []byte(exportConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.LoadUnchecked(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	stages := [][]checkpoint.Tensor{nil, nil}
	for _, p := range params {
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i)
		}
		s := 0
		if strings.HasPrefix(p.Name, "fc2") {
			s = 1
		}
		stages[s] = append(stages[s], checkpoint.Tensor{Name: p.Name, Shape: p.Shape, F32: v})
	}
	if err := os.MkdirAll(filepath.Join(runDir, "weights"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, ts := range stages {
		meta := map[string]string{"step": "6", "config_digest": cfg.Digest(), "stage": string(rune('0' + i))}
		if err := checkpoint.Write(filepath.Join(runDir, "weights", checkpoint.PartFile(i)), ts, meta); err != nil {
			t.Fatal(err)
		}
		if !withCheckpoint {
			continue
		}
		ts = append(ts, checkpoint.Tensor{Name: "optim.m." + ts[0].Name, Shape: ts[0].Shape, F32: ts[0].F32})
		if _, err := checkpoint.WritePart(filepath.Join(runDir, "checkpoints"), 4, i, ts, map[string]string{"stage": string(rune('0' + i)), "step": "4"}); err != nil {
			t.Fatal(err)
		}
	}
	if withCheckpoint {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := checkpoint.Commit(ctx, filepath.Join(runDir, "checkpoints"), 4, 2, 0, cfg.TrainingDigest(), checkpoint.Keep(3), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	return cfgPath, runDir
}

// TestExportWritesPyTorchLayout: the stage files merge into one file with
// nn.Linear's [out, in] weights and metadata naming the model and the run's
// config digest; a checkpoint exports the same way.
func TestExportWritesPyTorchLayout(t *testing.T) {
	cfgPath, runDir := fakeRun(t, true)
	cfg, _ := configs.LoadUnchecked(cfgPath)
	for _, which := range [][]string{nil, {"--checkpoint", "latest"}, {"--checkpoint", "4"}} {
		out := filepath.Join(t.TempDir(), "model.safetensors")
		text, err := runCommand(t, newRoot(), append([]string{"export", runDir, "--config", cfgPath, "--out", out, "--list"}, which...)...)
		if err != nil {
			t.Fatalf("export %v: %v\n%s", which, err, text)
		}
		step := "6"
		if which != nil {
			step = "4"
		}
		if !strings.Contains(text, "exported model mlp, step "+step+": 6 tensors, 107 parameters, float32") || !strings.Contains(text, "fc0.weight                       [6 8]") {
			t.Errorf("export %v printed:\n%s", which, text)
		}
		ts, meta, err := checkpoint.Read(out)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, x := range ts {
			names = append(names, x.Name)
			// fc1.weight is [6, 5] in the run, so [5, 6] here, element (1, 0) the run's (0, 1).
			if x.Name == "fc1.weight" && (!slices.Equal(x.Shape, []int{5, 6}) || x.F32[6] != 1 || x.F32[1] != 5) {
				t.Errorf("fc1.weight exported as %v %v", x.Shape, x.F32[:7])
			}
		}
		if want := []string{"fc0.bias", "fc0.weight", "fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"}; !slices.Equal(names, want) {
			t.Errorf("exported %v, want %v", names, want)
		}
		if meta["model"] != "mlp" || meta["config_digest"] != cfg.Digest() || meta["format"] != "pt" || meta["step"] != step || !strings.Contains(meta["model_spec"], `"hidden":[6,5]`) {
			t.Errorf("metadata %v", meta)
		}
		if _, ok := meta["stage"]; ok {
			t.Error("an export names a stage, so init_from would read it in pipetrain's layout")
		}
	}
}

// TestExportErrorsNameTheFault: each refusal names the run directory or the
// file at fault.
func TestExportErrorsNameTheFault(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false)
	out := filepath.Join(t.TempDir(), "model.safetensors")
	export := func(args ...string) string {
		t.Helper()
		text, err := runCommand(t, newRoot(), append([]string{"export"}, args...)...)
		if err == nil {
			t.Fatalf("export %v succeeded:\n%s", args, text)
		}
		if _, statErr := os.Stat(out); statErr == nil {
			t.Errorf("export %v failed but wrote %s", args, out)
		}
		return err.Error()
	}
	if got := export(runDir, "--out", out); !strings.Contains(got, runDir+": no launch.json") {
		t.Errorf("no config: %s", got)
	}
	if got := export(runDir, "--config", cfgPath, "--out", out, "--checkpoint", "4"); !strings.Contains(got, filepath.Join(runDir, "checkpoints")+": no committed checkpoint of step 4") {
		t.Errorf("no checkpoint: %s", got)
	}
	if got := export(runDir, "--config", cfgPath, "--out", out, "--checkpoint", "soon"); !strings.Contains(got, `--checkpoint "soon"`) {
		t.Errorf("bad --checkpoint: %s", got)
	}
	if got := export(filepath.Join(runDir, "nothing"), "--config", cfgPath, "--out", out); !strings.Contains(got, "nothing: not a run directory") {
		t.Errorf("no run directory: %s", got)
	}
	stage1 := filepath.Join(runDir, "weights", "stage-1.safetensors")
	if err := checkpoint.Write(stage1, []checkpoint.Tensor{{Name: "fc2.weight", Shape: []int{5, 4}, F32: make([]float32, 20)}, {Name: "fc2.bias", Shape: []int{3}, F32: make([]float32, 3)}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := export(runDir, "--config", cfgPath, "--out", out); !strings.Contains(got, stage1+": tensor fc2.weight has shape [5 4], the model needs [5 3]") {
		t.Errorf("mis-shaped: %s", got)
	}
	if err := os.Remove(stage1); err != nil {
		t.Fatal(err)
	}
	if got := export(runDir, "--config", cfgPath, "--out", out); !strings.Contains(got, filepath.Join(runDir, "weights")+": no tensor fc2.weight (1 stage file for the config's 2 stages: did every stage finish?)") {
		t.Errorf("a stage's file missing: %s", got)
	}
	if err := os.RemoveAll(filepath.Join(runDir, "weights")); err != nil {
		t.Fatal(err)
	}
	if got := export(runDir, "--config", cfgPath, "--out", out); !strings.Contains(got, filepath.Join(runDir, "weights")+": no final weights (did the run finish?)") {
		t.Errorf("no weights: %s", got)
	}
}

// TestExportRefusesAManifestNamingOtherFiles: a checkpoint's manifest
// edited to name a file outside the run directory, with that file's
// checksum, is refused by export rather than read.
func TestExportRefusesAManifestNamingOtherFiles(t *testing.T) {
	cfgPath, runDir := fakeRun(t, true)
	dir := checkpoint.StepDir(filepath.Join(runDir, "checkpoints"), 4)
	b, err := os.ReadFile(filepath.Join(dir, checkpoint.PartFile(1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(runDir), "x"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, checkpoint.ManifestName)
	text, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(string(text), `"stage-1.safetensors"`, `"../../../x"`, 1)
	if tampered == string(text) {
		t.Fatalf("%s names no stage-1.safetensors:\n%s", manifest, text)
	}
	if err := os.WriteFile(manifest, []byte(tampered), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "model.safetensors")
	got, err := runCommand(t, newRoot(), "export", runDir, "--config", cfgPath, "--out", out, "--checkpoint", "4")
	if err == nil || !strings.Contains(err.Error(), manifest+`: the manifest names "../../../x" as the part of stage 1`) {
		t.Fatalf("export of the tampered checkpoint: %v\n%s", err, got)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("the refused export wrote %s", out)
	}
}
