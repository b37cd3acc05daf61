package stages

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/models"
)

// setLastFloat32 writes v over the last float32 of a safetensors file, as an
// edit of one value of the data leaves it: a valid file, other bits.
func setLastFloat32(t *testing.T, path string, v float32) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(b[len(b)-4:], math.Float32bits(v))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFinalWeightsAreChecked: a run's final weights and an export are
// written with checksum files; a NaN written into one afterwards is refused,
// naming the file, by export and by init_from, while a run directory from
// before the checksums is read with the files named as unchecked.
func TestFinalWeightsAreChecked(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	c.Train.Steps = 1
	dir := runInProcess(t, c, false)
	stage1 := filepath.Join(dir, "weights", "stage-1.safetensors")
	for _, f := range []string{filepath.Join(dir, "weights", "stage-0.safetensors"), stage1} {
		if err := checkpoint.VerifyFile(f); err != nil {
			t.Fatalf("a run's weights: %v", err)
		}
	}
	file := exportRun(t, c, dir)
	if err := checkpoint.VerifyFile(file); err != nil {
		t.Fatalf("an export: %v", err)
	}
	model, err := models.Build(c.Model)
	if err != nil {
		t.Fatal(err)
	}

	setLastFloat32(t, stage1, float32(math.NaN()))
	_, err = Export(c, dir, FinalWeights, filepath.Join(t.TempDir(), "again.safetensors"))
	if err == nil || !strings.Contains(err.Error(), stage1+": checksum mismatch") {
		t.Errorf("export of a run whose weights changed: %v", err)
	}
	if _, err := checkpoint.ReadInit(model, dir, nil); err == nil || !strings.Contains(err.Error(), stage1+": checksum mismatch") {
		t.Errorf("init_from a run whose weights changed: %v", err)
	}
	setLastFloat32(t, file, float32(math.NaN()))
	if _, err := checkpoint.ReadInit(model, file, nil); err == nil || !strings.Contains(err.Error(), file+": checksum mismatch") {
		t.Errorf("init_from an export that changed: %v", err)
	}

	// A run from before the checksum files: read, and said to be unchecked.
	for _, f := range []string{filepath.Join(dir, "weights", "stage-0.safetensors"), stage1} {
		if err := os.Remove(checkpoint.SumPath(f)); err != nil {
			t.Fatal(err)
		}
	}
	e, err := Export(c, dir, FinalWeights, filepath.Join(t.TempDir(), "old.safetensors"))
	if err != nil || len(e.Unchecked) != 2 || e.Unchecked[1] != stage1 {
		t.Errorf("export of a run without checksum files: %v, unchecked %v", err, e)
	}
}

// TestExportSpecIsTheFamilys: an export's model_spec holds the keys of the
// model's own family, not every key a config may carry.
func TestExportSpecIsTheFamilys(t *testing.T) {
	for _, c := range []struct {
		spec models.Spec
		want []string
	}{
		{gptConfig("1f1b", plain("0-1", "2-4"), true).Model, []string{"context", "dtype", "heads", "layers", "name", "tie_embeddings", "vocab", "width"}},
		{testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd").Model, []string{"activation", "classes", "dtype", "hidden", "input", "name"}},
	} {
		c.spec.Input, c.spec.Classes, c.spec.Activation = max(c.spec.Input, 784), max(c.spec.Classes, 10), "relu" // as a config's defaults fill them
		b, err := exportSpec(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range got {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, c.want) {
			t.Errorf("model %s: model_spec %s, want the keys %v", c.spec.Name, b, c.want)
		}
	}
}
