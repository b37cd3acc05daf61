package checkpoint

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/models"
)

// randomWeights is a value for every parameter of spec's model, by pipetrain
// name; tied copies equal their originals.
func randomWeights(t *testing.T, spec models.Spec) (*models.Model, []models.TorchParam, map[string]Tensor) {
	t.Helper()
	m, err := models.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	w := map[string]Tensor{}
	byTorch := map[string]Tensor{}
	for _, p := range params {
		if orig, ok := byTorch[p.Torch]; ok && p.Copy {
			w[p.Name] = Tensor{Name: p.Name, Shape: orig.Shape, F32: orig.F32, F64: orig.F64}
			continue
		}
		t := Tensor{Name: p.Name, Shape: p.Shape}
		n := size(p.Shape)
		if spec.DType == "float64" {
			t.F64 = make([]float64, n)
			for i := range t.F64 {
				t.F64[i] = r.NormFloat64()
			}
		} else {
			t.F32 = make([]float32, n)
			for i := range t.F32 {
				t.F32[i] = float32(r.NormFloat64())
			}
		}
		w[p.Name], byTorch[p.Torch] = t, t
	}
	return m, params, w
}

func size(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

var torchTestSpecs = map[string]models.Spec{
	"mlp":        {Name: "mlp", DType: "float32", Input: 8, Hidden: []int{7, 6}, Classes: 3, Activation: "relu"},
	"cnn":        {Name: "cnn", DType: "float64", Input: 64, Channels: []int{2, 3}, Classes: 4},
	"gpt":        {Name: "gpt", DType: "float32", Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11},
	"gpt (tied)": {Name: "gpt", DType: "float64", Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11, TieEmbeddings: true},
}

// TestTorchRoundTrip: weights exported in PyTorch's layout and read back as
// an init file are the same bits, for every model; a dense weight is
// transposed on the way out.
func TestTorchRoundTrip(t *testing.T) {
	for label, spec := range torchTestSpecs {
		t.Run(label, func(t *testing.T) {
			m, params, w := randomWeights(t, spec)
			out, err := ToTorch(params, w, nil)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "export.safetensors")
			if err := Write(path, out, map[string]string{"format": "pt"}); err != nil {
				t.Fatal(err)
			}
			back, err := ReadInit(m, path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := Diff(w, back); err != nil {
				t.Fatalf("round trip: %v", err)
			}
			for _, e := range out {
				if e.Name == "fc0.weight" && (e.Shape[0] != 7 || e.Shape[1] != 8 || e.F32[1] != w["fc0.weight"].F32[7]) {
					t.Errorf("fc0.weight exported as %v, not the [out, in] transpose", e.Shape)
				}
			}
			if spec.TieEmbeddings && len(out) != len(params)-1 {
				t.Errorf("tied GPT: %d tensors exported for %d parameters", len(out), len(params))
			}
		})
	}
}

// TestInitReadsPipetrainFiles: a run's own stage files (metadata "stage")
// are read by pipetrain's names and layouts, one file or a run's folder.
func TestInitReadsPipetrainFiles(t *testing.T) {
	m, params, w := randomWeights(t, torchTestSpecs["gpt (tied)"])
	run := t.TempDir()
	dir := filepath.Join(run, "weights")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var a, b []Tensor
	for i, p := range params {
		if i < len(params)/2 {
			a = append(a, w[p.Name])
		} else {
			b = append(b, w[p.Name])
		}
	}
	for i, ts := range [][]Tensor{a, b} {
		// A checkpoint part's optimizer state is skipped.
		ts = append(ts, Tensor{Name: "optim.m." + ts[0].Name, Shape: ts[0].Shape, F64: ts[0].F64})
		if err := Write(filepath.Join(dir, PartFile(i)), ts, map[string]string{"stage": string(rune('0' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{run, dir} {
		back, err := ReadInit(m, path, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if err := Diff(w, back); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	// One stage reads only what it holds.
	back, err := ReadInit(m, dir, func(name string) bool { return name == "head.tok" })
	if err != nil || len(back) != 1 || DiffTensor(back["head.tok"], w["embed.tok"]) != nil {
		t.Errorf("head.tok alone: %v, %d tensors", err, len(back))
	}
}

// TestInitConvertsDType: PyTorch's float32 weights start a float64 model,
// widened exactly.
func TestInitConvertsDType(t *testing.T) {
	_, params, w := randomWeights(t, torchTestSpecs["mlp"])
	out, err := ToTorch(params, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "f32.safetensors")
	if err := Write(path, out, nil); err != nil {
		t.Fatal(err)
	}
	spec := torchTestSpecs["mlp"]
	spec.DType = "float64"
	m64, err := models.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadInit(m64, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := back["fc1.bias"].F64[2], float64(w["fc1.bias"].F32[2]); got != want {
		t.Errorf("fc1.bias[2] = %v, want %v", got, want)
	}
}

// TestInitErrorsNameTheTensor: a missing, mis-shaped, extra or half-precision
// tensor is refused, naming it, the file and the shapes.
func TestInitErrorsNameTheTensor(t *testing.T) {
	m, params, w := randomWeights(t, torchTestSpecs["mlp"])
	good, err := ToTorch(params, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cases := []struct {
		name string
		edit func([]Tensor) []Tensor
		meta map[string]string
		want []string
	}{
		{"missing", func(ts []Tensor) []Tensor { return without(ts, "fc1.bias") },
			nil, []string{"missing.safetensors: no tensor fc1.bias (shape [6], the model's fc1.bias)"}},
		{"misshapen", func(ts []Tensor) []Tensor {
			return append(without(ts, "fc2.bias"), Tensor{Name: "fc2.bias", Shape: []int{4}, F32: make([]float32, 4)})
		}, nil, []string{"misshapen.safetensors: tensor fc2.bias has shape [4], the model needs [3]"}},
		{"transposed", func(ts []Tensor) []Tensor {
			return append(without(ts, "fc1.weight"), w["fc1.weight"])
		}, nil, []string{"transposed.safetensors: tensor fc1.weight has shape [7 6], the model needs [6 7] (PyTorch's layout, [out, in])", "looks transposed"}},
		{"extra", func(ts []Tensor) []Tensor {
			return append(ts, Tensor{Name: "fc3.weight", Shape: []int{1}, F32: []float32{1}})
		}, nil, []string{"extra.safetensors: tensor fc3.weight is no parameter of this model"}},
		{"sequential", func(ts []Tensor) []Tensor {
			// nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)'s state_dict.
			for i := range ts {
				n := ts[i].Name
				ts[i].Name = map[byte]string{'0': "0", '1': "2", '2': "4"}[n[2]] + n[3:]
			}
			return ts
		}, nil, []string{"sequential.safetensors: no tensor fc0.weight (shape [7 8], the model's fc0.weight); the file holds 6 tensors: 0.bias, 0.weight, 2.bias, 2.weight, 4.bias, ... (1 more)"}},
		{"pipetrain", func(ts []Tensor) []Tensor { return ts }, map[string]string{"stage": "0"},
			[]string{"pipetrain.safetensors: tensor fc0.weight has shape [7 8], the model needs [8 7] (pipetrain's layout)", "\"stage\" metadata"}},
	}
	for _, c := range cases {
		path := filepath.Join(dir, c.name+".safetensors")
		if err := Write(path, c.edit(append([]Tensor(nil), good...)), c.meta); err != nil {
			t.Fatal(err)
		}
		for _, check := range []func() error{
			func() error { return CheckInit(m, path) },
			func() error { _, err := ReadInit(m, path, nil); return err },
		} {
			err := check()
			for _, want := range c.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: got %v, want %q", c.name, err, want)
				}
			}
		}
	}
	// Half precision, as PyTorch may save it: the header says BF16.
	half := filepath.Join(dir, "half.safetensors")
	b, _ := os.ReadFile(filepath.Join(dir, "missing.safetensors"))
	b = []byte(strings.Replace(string(b), `"F32"`, `"F16"`, 1)) // the same length keeps the offsets
	if err := os.WriteFile(half, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckInit(m, half); err == nil || !strings.Contains(err.Error(), "is F16; only F32 and F64 are read") {
		t.Errorf("half precision: %v", err)
	}
	if err := CheckInit(m, filepath.Join(dir, "nothing.safetensors")); err == nil || !strings.Contains(err.Error(), "nothing.safetensors: no such file") {
		t.Errorf("no file: %v", err)
	}
	// A file cut short is caught from its header.
	trunc := filepath.Join(dir, "trunc.safetensors")
	g, _ := os.ReadFile(filepath.Join(dir, "extra.safetensors"))
	if err := os.WriteFile(trunc, g[:len(g)-8], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckInit(m, trunc); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
}

func without(ts []Tensor, name string) []Tensor {
	var out []Tensor
	for _, t := range ts {
		if t.Name != name {
			out = append(out, t)
		}
	}
	return out
}

// TestToTorchRefusesDifferingTiedCopies: a run whose tied copies drifted
// apart has no one weight to export.
func TestToTorchRefusesDifferingTiedCopies(t *testing.T) {
	_, params, w := randomWeights(t, torchTestSpecs["gpt (tied)"])
	head := w["head.tok"]
	head.F64 = append([]float64(nil), head.F64...)
	head.F64[3]++
	w["head.tok"] = head
	_, err := ToTorch(params, w, map[string]string{"head.tok": "stage-1.safetensors"})
	if err == nil || !strings.Contains(err.Error(), "stage-1.safetensors: tied weights embed.tok and head.tok differ") {
		t.Errorf("got %v", err)
	}
}
