package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// The Llama family held against Hugging Face's formulas written out in
// PyTorch (testdata/llama_hf.py): Debian's python3-torch, run as
// /usr/bin/python3 (a python3 earlier on PATH may lack it).

// torchTensor is one tensor as llama_hf.py reads it.
type torchTensor struct {
	Shape []int     `json:"shape"`
	Data  []float32 `json:"data"`
}

// hfLlamaRun is llama_hf.py's input.
type hfLlamaRun struct {
	Config struct {
		Batch      int     `json:"batch"`
		Context    int     `json:"context"`
		Width      int     `json:"width"`
		Heads      int     `json:"heads"`
		KVHeads    int     `json:"kv_heads"`
		HeadDim    int     `json:"head_dim"`
		Layers     int     `json:"layers"`
		RMSNormEps float64 `json:"rms_norm_eps"`
		RopeTheta  float64 `json:"rope_theta"`
	} `json:"config"`
	Params map[string]torchTensor `json:"params"`
	IDs    []int                  `json:"ids"`
	R      torchTensor            `json:"r"`
}

// hfLlamaResult is llama_hf.py's output.
type hfLlamaResult struct {
	Logits []float32            `json:"logits"`
	Grads  map[string][]float32 `json:"grads"`
}

// toTorch is v (rows, cols) in PyTorch's layout: transposed when asked.
func toTorch(v []float32, shape []int, transpose bool) []float32 {
	if !transpose {
		return append([]float32(nil), v...)
	}
	rows, cols := shape[0], shape[1]
	out := make([]float32, len(v))
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = v[i*cols+j]
		}
	}
	return out
}

// TestLlamaMatchesPyTorch runs the tiny Llama (grouped-query attention,
// head_dim wider than width/heads, its own eps and theta; tied and untied)
// forward and backward in float32 and compares the logits and every
// parameter's gradient of sum(logits·R) with Hugging Face's formulas in
// PyTorch, given the same weights under their Hugging Face names (the map
// of TorchParams, transposes included).
func TestLlamaMatchesPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprintf("tied=%v", tied), func(t *testing.T) {
			spec := tinyLlama("float32", tied, 2)
			m := buildModel(t, spec)
			const batch = 2
			r := rand.New(rand.NewPCG(31, 31))
			ids, _ := randomBatch(m, batch, r)

			g := G.NewGraph()
			x := G.NewTensor(g, m.DType, 2, G.WithShape(ids.Shape()...), G.WithName("ids"), G.WithValue(ids))
			h, params := x, []*G.Node(nil)
			for _, l := range m.Layers {
				b, err := l.Build(g, h, 9)
				if err != nil {
					t.Fatal(err)
				}
				h, params = b.Out, append(params, b.Params...)
			}
			rw := denseOf(tensor.Float32, randDense(r, 1, h.Shape()...).Data().([]float64), h.Shape()...)
			loss, err := G.Sum(mustNode(G.HadamardProd(h, G.NewConstant(rw, G.WithName("r")))))
			if err != nil {
				t.Fatal(err)
			}
			tps, err := TorchParams(m)
			if err != nil {
				t.Fatal(err)
			}
			// Weights away from the initial ones; a tied copy gets its
			// original's values.
			byName := map[string]*G.Node{}
			for _, p := range params {
				byName[p.Name()] = p
			}
			perturb(r, 0.3, params...)
			in := hfLlamaRun{Params: map[string]torchTensor{}, R: torchTensor{Shape: rw.Shape(), Data: rw.Data().([]float32)}}
			for _, tp := range tps {
				v := byName[tp.Name].Value().Data().([]float32)
				if tp.Copy {
					continue
				}
				in.Params[tp.Torch] = torchTensor{Shape: tp.TorchShape, Data: toTorch(v, tp.Shape, tp.Transpose)}
			}
			for _, tp := range tps {
				if tp.Copy {
					copy(byName[tp.Name].Value().Data().([]float32), in.Params[tp.Torch].Data)
				}
			}
			for _, id := range ids.Data().([]float32) {
				in.IDs = append(in.IDs, int(id))
			}
			c := &in.Config
			c.Batch, c.Context, c.Width, c.Heads, c.Layers = batch, spec.Context, spec.Width, spec.Heads, spec.Layers
			c.KVHeads, c.HeadDim = spec.Own["kv_heads"].(int), spec.Own["head_dim"].(int)
			c.RMSNormEps, c.RopeTheta = spec.Own["rms_norm_eps"].(float64), spec.Own["rope_theta"].(float64)

			if _, err := G.Grad(loss, params...); err != nil {
				t.Fatal(err)
			}
			vm := G.NewTapeMachine(g, G.BindDualValues(params...))
			defer vm.Close()
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			var want hfLlamaResult
			runLlamaHF(t, in, &want)

			closeTo(t, "logits", h.Value().Data().([]float32), want.Logits)
			got := map[string][]float32{}
			for _, tp := range tps {
				gv, err := byName[tp.Name].Grad()
				if err != nil {
					t.Fatal(err)
				}
				d := toTorch(gv.Data().([]float32), tp.Shape, tp.Transpose)
				if prev, ok := got[tp.Torch]; ok { // the tied copies' gradients add up
					for i := range d {
						d[i] += prev[i]
					}
				}
				got[tp.Torch] = d
			}
			if len(got) != len(want.Grads) {
				t.Errorf("%d gradients, PyTorch has %d", len(got), len(want.Grads))
			}
			for name, w := range want.Grads {
				closeTo(t, name+"'s gradient", got[name], w)
			}
		})
	}
}

// mustNode is a gorgonia node or a panic, for tests.
func mustNode(n *G.Node, err error) *G.Node {
	if err != nil {
		panic(err)
	}
	return n
}

// closeTo requires got and want to agree to float32 accuracy: within
// 1e-4 of want's largest entry.
func closeTo(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d entries, PyTorch %d", what, len(got), len(want))
		return
	}
	scale, worst := 0.0, 0.0
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if worst > 1e-4*scale || scale == 0 {
		t.Errorf("%s: differs from PyTorch's by up to %g (largest entry %g)", what, worst, scale)
	}
	t.Logf("%s: largest difference %.2g of largest entry %.2g", what, worst, scale)
}

// runLlamaHF runs testdata/llama_hf.py on in.
func runLlamaHF(t *testing.T, in hfLlamaRun, out *hfLlamaResult) {
	t.Helper()
	testenv.RunPythonJSON(t, filepath.Join("testdata", "llama_hf.py"), in, out)
}
