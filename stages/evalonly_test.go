package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// evalData is the data runStagesIn hands c's stages, for EvaluateWeights.
func evalData(t *testing.T, c *configs.Config) Options {
	o := Options{Config: c, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)}
	if c.Data.Dataset == "text" {
		o.Text = testText(t)
	}
	return o
}

// readEvalJSON is a run's final evaluation.
func readEvalJSON(t *testing.T, run string) EvalResult {
	t.Helper()
	var res EvalResult
	b, err := os.ReadFile(filepath.Join(run, "eval.json"))
	if err != nil || json.Unmarshal(b, &res) != nil || res.Examples == 0 {
		t.Fatalf("eval.json %s: %v", b, err)
	}
	return res
}

// TestEvaluateWeightsEqualsTheRunsEvaluation: evaluating the final weights
// of a pipelined run (its run directory, its latest checkpoint, and its
// PyTorch export) in one process gives its eval.json, every figure bit for
// bit: an MLP on images, a GPT on text and a GPT on token files. Nothing is
// written into the run directory.
func TestEvaluateWeightsEqualsTheRunsEvaluation(t *testing.T) {
	tokens := gptConfig("1f1b", plain("0-1", "2-4"), true)
	tokens.Data = configs.Data{Dataset: "tokens", BatchSize: 8, MicroBatches: 4, Own: writeTokenShards(t, t.TempDir())}
	mlp := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	mlp.Train.EvalEvery = 0
	for name, c := range map[string]*configs.Config{
		"mlp":        mlp,
		"gpt text":   gptConfig("1f1b", plain("0-1", "2-4"), false),
		"gpt tokens": tokens,
	} {
		t.Run(name, func(t *testing.T) {
			c.Checkpoint.Every = c.Train.Steps
			run := runInProcess(t, c, false)
			want := readEvalJSON(t, run)
			before, _ := filepath.Glob(filepath.Join(run, "*", "*"))
			ckpt, _, _, err := RunWeights(c, run, LatestCheckpoint)
			if err != nil {
				t.Fatal(err)
			}
			export := filepath.Join(t.TempDir(), "export.safetensors")
			if _, err := Export(c, run, FinalWeights, export); err != nil {
				t.Fatal(err)
			}
			for what, path := range map[string]string{"run directory": run, "checkpoint": ckpt, "export": export} {
				got, err := EvaluateWeights(context.Background(), evalData(t, c), path)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if *got != want {
					t.Errorf("%s: evaluated %+v, the run's eval.json %+v", what, *got, want)
				}
			}
			if after, _ := filepath.Glob(filepath.Join(run, "*", "*")); len(after) != len(before) {
				t.Errorf("evaluating wrote into the run directory: %d files before, %d after", len(before), len(after))
			}
			t.Logf("%s: loss %v on %d examples, equal", name, want.Loss, want.Examples)
		})
	}
}

// TestEvaluationHoldsNoOptimizerState: evaluating an Adam run's weights
// allocates no optimizer state (Adam's two buffers per parameter).
func TestEvaluationHoldsNoOptimizerState(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	c.Train.Steps = 1
	run := runInProcess(t, c, false)
	r, err := evaluationRuntime(evalData(t, c), run)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range r.optims {
		if names := o.SlotNames(); len(names) > 0 {
			t.Errorf("chunk %d's optimizer holds %v buffers", i, names)
		}
	}
}

// TestEvaluateWeightsRefusesAnotherModel: weights of another model are
// refused before any is read, naming the file and the tensor: a mis-sized
// MLP by shape, a GPT's by the names the MLP lacks.
func TestEvaluateWeightsRefusesAnotherModel(t *testing.T) {
	small := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	small.Train.Steps = 1
	run := runInProcess(t, small, false)
	wider := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	wider.Model.Hidden = []int{9, 6, 5}
	_, err := EvaluateWeights(context.Background(), evalData(t, wider), run)
	if err == nil || !strings.Contains(err.Error(), "stage-0.safetensors: tensor fc0.weight has shape [8 7], the model needs [8 9]") {
		t.Errorf("a narrower MLP's weights: %v", err)
	}
	gpt := gptConfig("1f1b", plain("0-1", "2-4"), false)
	gpt.Train.Steps = 1
	gptRun := runInProcess(t, gpt, false)
	_, err = EvaluateWeights(context.Background(), evalData(t, small), gptRun)
	if err == nil || !strings.Contains(err.Error(), "no tensor fc0.weight") {
		t.Errorf("a GPT's weights into an MLP: %v", err)
	}
}

// TestEvaluateLanguageModelMatchesPyTorch: the loss, perplexity and
// accuracy pipetrain evaluate gives a GPT's final weights on validation
// token files equal those PyTorch computes from the run's export with the
// window rule docs/weights.md states (validation_loss in
// testdata/pytorch/evaluate_lm.py), within 1e-5 relative, on the same count
// of tokens.
func TestEvaluateLanguageModelMatchesPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	c := gptConfig("1f1b", plain("0-1", "2-4"), false)
	c.Model.DType = "float32"
	c.Data = configs.Data{Dataset: "tokens", BatchSize: 8, MicroBatches: 4, Own: writeTokenShards(t, t.TempDir())}
	run := runInProcess(t, c, false)
	got, err := EvaluateWeights(context.Background(), evalData(t, c), run)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	export, out := filepath.Join(dir, "gpt.safetensors"), filepath.Join(dir, "torch.json")
	if _, err := Export(c, run, FinalWeights, export); err != nil {
		t.Fatal(err)
	}
	torch := torchEvaluation(t, out, export, c.Data.Own["val_shards"].(string))
	if got.Examples != torch.Tokens || rel(got.Loss, torch.Loss) > 1e-5 || rel(got.Perplexity, torch.Perplexity) > 1e-5 || got.Accuracy != torch.Accuracy {
		t.Errorf("pipetrain %+v, PyTorch %+v", *got, torch)
	}
	if want := data.EvalWindows(int64(len(testText(t).Val)), c.Model.Context) * int64(c.Model.Context); int64(torch.Tokens) != want {
		t.Errorf("PyTorch scored %d tokens, want every window's %d", torch.Tokens, want)
	}
	t.Logf("loss %v, PyTorch's %v (%.2g relative), %d tokens", got.Loss, torch.Loss, rel(got.Loss, torch.Loss), got.Examples)
}

// torchFigures are evaluate_lm.py's figures.
type torchFigures struct {
	Loss, Perplexity, Accuracy float64
	Tokens                     int
}

// torchEvaluation runs evaluate_lm.py with args, its figures written to out.
func torchEvaluation(t *testing.T, out string, args ...string) torchFigures {
	t.Helper()
	runTorch(t, "evaluate_lm.py", append(args, out)...)
	var f torchFigures
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &f) != nil {
		t.Fatalf("%s: %s %v", out, b, err)
	}
	return f
}

func rel(a, b float64) float64 { return math.Abs(a-b) / math.Abs(b) }

// TestEvaluateHFDirectoryMatchesPyTorch: pipetrain evaluate on each of
// hf_checkpoint.py's Hugging Face directories (a Llama in F32 and in BF16
// shards, a GPT-2 in F32 shards and in F16; model.from and init_from the
// directory) gives, on validation token files, the loss and perplexity
// PyTorch computes in float64 from the same directory with the documented
// window rule, within 1e-5 relative, on the same tokens.
func TestEvaluateHFDirectoryMatchesPyTorch(t *testing.T) {
	root, cs := makeHFCheckpoints(t)
	own := writeTokenShards(t, t.TempDir())
	for _, k := range cs.Cases {
		dir := filepath.Join(root, k.Name)
		c := gptConfig("1f1b", plain("0-1", "2-3"), false)
		c.Model = hfConfig(t, dir, k.DType).Model
		c.Data = configs.Data{Dataset: "tokens", BatchSize: 8, MicroBatches: 4, Own: own}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		got, err := EvaluateWeights(context.Background(), evalData(t, c), dir)
		if err != nil {
			t.Fatalf("%s: %v", k.Name, err)
		}
		torch := torchEvaluation(t, filepath.Join(root, k.Name+".eval.json"), "hf", dir, fmt.Sprint(c.Model.Context), own["val_shards"].(string))
		if got.Examples != torch.Tokens || !(rel(got.Loss, torch.Loss) <= 1e-5) || !(rel(got.Perplexity, torch.Perplexity) <= 1e-5) {
			t.Errorf("%s (%s): pipetrain %+v, PyTorch %+v", k.Name, k.DType, *got, torch)
		}
		t.Logf("%s (%s): loss %.9g, PyTorch's %.9g (%.2g relative), %d tokens", k.Name, k.DType, got.Loss, torch.Loss, rel(got.Loss, torch.Loss), got.Examples)
	}
}

// TestDocsGiveTheTestedEvaluation: the Python function docs/weights.md
// gives to reproduce pipetrain evaluate's figure is the one the test above
// computes it with.
func TestDocsGiveTheTestedEvaluation(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "weights.md"))
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join("testdata", "pytorch", "evaluate_lm.py"))
	if err != nil {
		t.Fatal(err)
	}
	_, fn, _ := strings.Cut(string(script), "def validation_loss")
	fn, _, _ = strings.Cut(fn, "\n\n\n")
	if !strings.Contains(string(doc), "def validation_loss"+fn+"\n") {
		t.Errorf("docs/weights.md does not give validation_loss as testdata/pytorch/evaluate_lm.py has it; copy the function into the doc")
	}
}
