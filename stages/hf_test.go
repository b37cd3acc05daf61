package stages

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/testenv"
	"github.com/pipetrain/pipetrain/models"
)

// hfCases are the checkpoints hf_checkpoint.py makes: a token batch and,
// per case, the loss of its PyTorch module on it.
type hfCases struct {
	Tokens [][]int `json:"tokens"`
	Cases  []struct {
		Name, DType string
		Loss        float64
	} `json:"cases"`
}

// makeHFCheckpoints writes the tiny Llama and GPT-2 checkpoints of
// hf_checkpoint.py under a temporary folder.
func makeHFCheckpoints(t *testing.T) (string, hfCases) {
	t.Helper()
	testenv.NeedTorch(t)
	root := t.TempDir()
	runTorch(t, "hf_checkpoint.py", "make", root)
	var cs hfCases
	b, err := os.ReadFile(filepath.Join(root, "cases.json"))
	if err == nil {
		err = json.Unmarshal(b, &cs)
	}
	if err != nil {
		t.Fatal(err)
	}
	return root, cs
}

// hfConfig loads a config whose model section is model.from dir in dtype.
func hfConfig(t *testing.T, dir, dtype string) *configs.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hf.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, "model: {from: %q, dtype: %s}\n", dir, dtype), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := configs.LoadUnchecked(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lmLoss is the mean cross-entropy of model m with weights w on tokens,
// each row's first context tokens predicting the next: one engine forward.
func lmLoss(t *testing.T, m *models.Model, w map[string]checkpoint.Tensor, tokens [][]int) float64 {
	t.Helper()
	ctx := m.Spec.Context
	x := tensor.New(tensor.Of(m.DType), tensor.WithShape(len(tokens), ctx))
	var targets []int
	for i, row := range tokens {
		for j := range ctx {
			switch d := x.Data().(type) {
			case []float32:
				d[i*ctx+j] = float32(row[j])
			case []float64:
				d[i*ctx+j] = float64(row[j])
			}
		}
		targets = append(targets, row[1:ctx+1]...)
	}
	e, err := engine.NewEngine(m, 0, len(m.Layers), len(tokens), 1, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range e.Params() {
		if err := checkpoint.CopyInto(w, p.Name(), p.Shape(), p.Value().Data()); err != nil {
			t.Fatal(err)
		}
	}
	loss, err := e.Forward(0, x, targets)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Float64s(loss)[0]
}

// TestHFCheckpointsLossEqualsPyTorch builds each model from its Hugging
// Face directory's config.json (model.from), loads its weights (F32 or F16
// in one file, F32 or BF16 in shards, converted to float32 or float64) and
// requires the loss of one forward on a batch to be PyTorch's within 1e-5
// relative.
func TestHFCheckpointsLossEqualsPyTorch(t *testing.T) {
	root, cs := makeHFCheckpoints(t)
	for _, k := range cs.Cases {
		dir := filepath.Join(root, k.Name)
		c := hfConfig(t, dir, k.DType)
		m, err := models.Build(c.Model)
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		if err := checkpoint.CheckInit(m, dir); err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		w, err := checkpoint.ReadInit(m, dir, nil)
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		got := lmLoss(t, m, w, cs.Tokens)
		if rel := math.Abs(got-k.Loss) / k.Loss; !(rel <= 1e-5) {
			t.Errorf("%s (%s): pipetrain's loss %.9g, PyTorch's %.9g (relative difference %.2g)", k.Name, k.DType, got, k.Loss, rel)
		} else {
			t.Logf("%s (%s): loss %.9g, PyTorch's %.9g (relative difference %.2g)", k.Name, k.DType, got, k.Loss, rel)
		}
	}
}

// hfCheck is what hf_checkpoint.py check reports of a directory.
type hfCheck struct {
	Loss    float64
	Tensors map[string][2]any // name: [dtype, shape]
}

func checkHFInTorch(t *testing.T, dir, tokens string) hfCheck {
	t.Helper()
	out := dir + ".check.json"
	runTorch(t, "hf_checkpoint.py", "check", dir, tokens, out)
	var c hfCheck
	b, err := os.ReadFile(out)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHFRoundTripThroughTraining trains each Hugging Face checkpoint two
// steps on 2 stages from train.init_from DIR, exports the final weights with
// ExportHF and has PyTorch load the export into the same module with
// strict=True: every tensor keeps its name, shape and dtype, and PyTorch's
// loss on the export is pipetrain's within 1e-5 relative.
func TestHFRoundTripThroughTraining(t *testing.T) {
	root, cs := makeHFCheckpoints(t)
	tokens := filepath.Join(root, "cases.json")
	for _, k := range cs.Cases {
		dir := filepath.Join(root, k.Name)
		c := gptConfig("1f1b", plain("0-1", "2-3"), false)
		c.Model = hfConfig(t, dir, k.DType).Model
		c.Train.InitFrom, c.Train.Steps = dir, 2
		run := runInProcess(t, c, false)
		out := filepath.Join(root, k.Name+"-export")
		shard := int64(DefaultShardSize)
		if strings.Contains(k.Name, "sharded") {
			shard = 10_000
		}
		e, err := ExportHF(c, run, FinalWeights, out, shard)
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		_, indexErr := os.Stat(filepath.Join(out, checkpoint.HFIndexName))
		if sharded := indexErr == nil; sharded != (shard < DefaultShardSize) || len(e.Files) < 2 {
			t.Errorf("%s: wrote %v", k.Name, e.Files)
		}
		orig, back := checkHFInTorch(t, dir, tokens), checkHFInTorch(t, out, tokens)
		if !reflect.DeepEqual(orig.Tensors, back.Tensors) {
			t.Errorf("%s: tensors %v, exported as %v", k.Name, orig.Tensors, back.Tensors)
		}
		m, err := models.Build(c.Model)
		if err != nil {
			t.Fatal(err)
		}
		w, err := checkpoint.ReadInit(m, out, nil)
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		got := lmLoss(t, m, w, cs.Tokens)
		if rel := math.Abs(got-back.Loss) / back.Loss; !(rel <= 1e-5) || got == orig.Loss {
			t.Errorf("%s: pipetrain's loss on the export %.9g, PyTorch's %.9g (before training %.9g)", k.Name, got, back.Loss, orig.Loss)
		}
	}
}
