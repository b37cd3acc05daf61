package models

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// entry is a stack entry as a config gives it.
type entry = map[string]any

// testStack is the model of testdata/sequential_torch.py: every built-in
// type, a residual group repeated twice and one nested in another, on
// 2x9x8 images: convolutions with stride and padding, pools that drop an
// odd edge, dropout on an image and inside the repeated group (modules
// without parameters that still take their index).
func testStack(dtype string) Spec {
	block := entry{"type": "residual", "repeat": 2, "stack": []any{
		entry{"type": "layernorm"}, entry{"type": "linear", "out": 6}, entry{"type": "tanh"}, entry{"type": "dropout", "p": 0.2}, entry{"type": "linear", "out": 6, "bias": false},
	}}
	return Spec{Name: "sequential", DType: dtype, Input: 144, Classes: 3, Own: map[string]any{
		"input_shape": []any{2, 9, 8},
		"stack": []any{
			entry{"type": "conv2d", "out": 3, "kernel": 3, "stride": 2, "padding": 1},
			entry{"type": "gelu"},
			entry{"type": "dropout", "p": 0.4},
			entry{"type": "maxpool"},
			entry{"type": "conv2d", "out": 4, "kernel": 2, "padding": 1},
			entry{"type": "avgpool", "kernel": 2},
			entry{"type": "flatten"},
			entry{"type": "linear", "out": 6},
			block,
			entry{"type": "rmsnorm", "eps": 1e-5},
			entry{"type": "residual", "stack": []any{
				entry{"type": "linear", "out": 6}, entry{"type": "sigmoid"}, entry{"type": "residual", "stack": []any{entry{"type": "silu"}}},
			}},
			entry{"type": "relu"},
			entry{"type": "linear", "out": 3},
		},
	}}
}

// TestSequentialShapes: the stack's units, each an entry with parameters
// and the entries without after it (the repeated group twice), the example
// shapes inferred through them, and the activations between units
// flattened.
func TestSequentialShapes(t *testing.T) {
	m := buildModel(t, testStack(""))
	var got []string
	for _, l := range m.Layers {
		got = append(got, l.Name()+" "+l.(interface{ Describe() string }).Describe())
	}
	want := []string{
		"stack0 stack[0] conv2d, stack[1] gelu, stack[2] dropout, stack[3] maxpool: 2x9x8 -> 3x2x2",
		"stack4 stack[4] conv2d, stack[5] avgpool, stack[6] flatten: 3x2x2 -> 4",
		"stack7 stack[7] linear: 4 -> 6",
		"stack8 stack[8] residual: 6 -> 6",
		"stack9 stack[8] residual: 6 -> 6",
		"stack10 stack[9] rmsnorm: 6 -> 6",
		"stack11 stack[10] residual, stack[11] relu: 6 -> 6",
		"stack13 stack[12] linear: 6 -> 3",
	}
	if !slices.Equal(got, want) {
		t.Errorf("units:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, w := range []int{144, 12, 4, 6, 6, 6, 6, 6, 3} {
		if s := m.ShapeAt(i, 5); !s.Eq(tensor.Shape{5, w}) {
			t.Errorf("shape entering unit %d: %v, want (5, %d)", i, s, w)
		}
	}
	if n, err := ParamCount(m, 0, len(m.Layers)); err != nil || n != 3*2*9+3+4*3*4+4+4*6+6+2*(6+6+36+6+36)+6+36+6+6*3+3 {
		t.Errorf("ParamCount: %d, %v", n, err)
	}
}

// TestSequentialRefusesByEntry: every problem is reported, each naming the
// entry and field at fault.
func TestSequentialRefusesByEntry(t *testing.T) {
	spec := Spec{Name: "sequential", Input: 64, Classes: 10, Own: map[string]any{
		"input_shape": []any{1, 8, 7},
		"stack": []any{
			entry{"type": "linear", "out": 0},
			entry{"type": "conv2d", "kernel": "big", "padding": -1},
			entry{"type": "maxpool", "kernel": 3},
			entry{"type": "softmax"},
			entry{"out": 3},
			"relu",
			entry{"type": "residual", "repeat": 0, "stack": []any{entry{"type": "relu", "inplace": true}}},
			entry{"type": "rmsnorm", "eps": 0},
		},
	}}
	_, err := Build(spec)
	var got []string
	if errs, ok := err.(SpecErrors); ok {
		for _, e := range errs {
			got = append(got, e.Error())
		}
	}
	want := []string{
		"model.input_shape: [1 8 7] holds 56 features, model.input 64",
		"model.stack[0].out: must be at least 1, got 0",
		"model.stack[1].out: missing: give an integer of at least 1",
		"model.stack[1].kernel: big is not an integer",
		"model.stack[1].padding: must be at least 0, got -1",
		"model.stack[2].kernel: max pooling takes 2x2 windows (stride 2) only, got 3",
		"model.stack[3].type: unknown layer type softmax (known: avgpool, conv2d, dropout, flatten, gelu, layernorm, linear, maxpool, relu, residual, rmsnorm, sigmoid, silu, tanh)",
		"model.stack[4].type: missing: give one of avgpool, conv2d, dropout, flatten, gelu, layernorm, linear, maxpool, relu, residual, rmsnorm, sigmoid, silu, tanh",
		"model.stack[5]: a string, want a map with a type, e.g. {type: linear, out: 64}",
		"model.stack[6].repeat: must be at least 1, got 0",
		"model.stack[6].stack[0].inplace: unknown field of a relu entry",
		"model.stack[7].eps: must be positive, got 0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Shapes are checked once the entries parse: the first entry that
	// cannot take its input, then the logits.
	for _, c := range []struct {
		stack []any
		want  string
	}{
		{[]any{entry{"type": "linear", "out": 10}}, "model.stack[0]: linear on input 1x8x8: takes flat features, got 1x8x8: put a flatten before it"},
		{[]any{entry{"type": "flatten"}, entry{"type": "residual", "stack": []any{entry{"type": "linear", "out": 5}}}},
			"model.stack[1]: the residual group's stack maps 64 to 5; it must keep its input's shape, which it is added to"},
		{[]any{entry{"type": "conv2d", "out": 2, "kernel": 9}}, "model.stack[0]: conv2d on input 1x8x8: a 9x9 kernel does not fit a 8x8 image padded by 0"},
		{[]any{entry{"type": "flatten"}, entry{"type": "maxpool"}}, "model.stack[1]: maxpool on input 64: takes an image (channels x height x width), got 64: give model.input_shape"},
		{[]any{entry{"type": "flatten"}, entry{"type": "linear", "out": 9}}, "model.stack: the last layer emits 9 per example; a classifier of 10 classes needs 10 logits"},
	} {
		spec.Own = map[string]any{"input_shape": []any{1, 8, 8}, "stack": c.stack}
		if _, err := Build(spec); err == nil || err.Error() != c.want {
			t.Errorf("got %v\nwant %s", err, c.want)
		}
	}
	spec.Own = nil
	if _, err := Build(spec); err == nil || err.Error() != "model.stack: a null, want a list of layer entries, each a map with a type" {
		t.Errorf("no stack: %v", err)
	}
	noParams := Spec{Name: "sequential", Input: 10, Classes: 10, Own: map[string]any{"stack": []any{entry{"type": "relu"}}}}
	if _, err := Build(noParams); err == nil || err.Error() != "model.stack: no entry has parameters: give at least one linear, conv2d or norm" {
		t.Errorf("no parameters: %v", err)
	}
}

// TestSequentialTorchNames: the parameters are an nn.Sequential's
// state_dict, residual groups nested by index, dense weights transposed.
func TestSequentialTorchNames(t *testing.T) {
	tps, err := TorchParams(buildModel(t, testStack("")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range tps {
		s := p.Name + " " + p.Torch
		if p.Transpose {
			s += " T"
		}
		got = append(got, s)
	}
	want := []string{
		"stack0.weight 0.weight", "stack0.bias 0.bias", "stack4.weight 4.weight", "stack4.bias 4.bias",
		"stack7.weight 7.weight T", "stack7.bias 7.bias",
		"stack8.0.weight 8.0.weight", "stack8.0.bias 8.0.bias", "stack8.1.weight 8.1.weight T", "stack8.1.bias 8.1.bias", "stack8.4.weight 8.4.weight T",
		"stack9.0.weight 9.0.weight", "stack9.0.bias 9.0.bias", "stack9.1.weight 9.1.weight T", "stack9.1.bias 9.1.bias", "stack9.4.weight 9.4.weight T",
		"stack10.weight 10.weight", "stack11.0.weight 11.0.weight T", "stack11.0.bias 11.0.bias",
		"stack13.weight 13.weight T", "stack13.bias 13.bias",
	}
	if !slices.Equal(got, want) {
		t.Errorf("names:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// stackKey is the training run buildStack's dropouts draw for.
var stackKey = DrawKey{Train: true, Step: 3, MicroBatch: 1}

// stackSeed is the seed buildStack builds with: the dropouts' too.
const stackSeed = 9

// buildStack builds every unit of m on x in one graph, its dropouts
// drawing for stackKey, returning the output and the parameters.
func buildStack(t *testing.T, m *Model, g *G.ExprGraph, x *G.Node) (*G.Node, []*G.Node) {
	t.Helper()
	h, params := x, []*G.Node(nil)
	for _, l := range m.Layers {
		b, err := l.Build(g, h, stackSeed)
		if err != nil {
			t.Fatal(err)
		}
		if b.Draws != nil {
			*b.Draws = stackKey
		}
		h, params = b.Out, append(params, b.Params...)
	}
	return h, params
}

// stackMasks are the masks of testStack's dropouts for a batch of n, by
// module name, as 0 and 1: what its PyTorch form multiplies by.
func stackMasks(n int) map[string][]float64 {
	out := map[string][]float64{}
	for name, d := range map[string]struct {
		layer []int
		p     float64
		size  int
	}{"2": {[]int{2}, 0.4, 3 * 5 * 4}, "8.3": {[]int{8, 3}, 0.2, 6}, "9.3": {[]int{9, 3}, 0.2, 6}} {
		m := make([]float64, n*d.size)
		for i, keep := range (Drawer{Seed: stackSeed, Layer: d.layer}).Mask(stackKey, d.p, len(m)) {
			if keep {
				m[i] = 1
			}
		}
		out[name] = m
	}
	return out
}

// TestSequentialGradients: the whole stack's gradients in training (its
// dropouts' masks fixed by the key), for its weights (moved away from the
// initial ones, so norms' gains and zero biases are not special) and its
// input, against central differences in float64.
func TestSequentialGradients(t *testing.T) {
	m := buildModel(t, testStack("float64"))
	r := rand.New(rand.NewPCG(3, 3))
	g := G.NewGraph()
	x := newParam(g, "x", randDense(r, 1, 2, 144))
	y, params := buildStack(t, m, g, x)
	perturb(r, 0.3, params...)
	checkGraphGrads(t, g, weightedSum(t, g, y), append(params, x), 12)
}

// TestSequentialMatchesPyTorch runs the stack forward and backward in
// float32, training, and compares its output and the gradients of
// sum(output·R) for every parameter and the input with the same
// nn.Sequential in PyTorch (testdata/sequential_torch.py), given the
// weights under their export names and layouts (loaded strictly: the
// dropouts hold none but take their indices) and pipetrain's dropout
// masks.
func TestSequentialMatchesPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	m := buildModel(t, testStack("float32"))
	const batch = 3
	r := rand.New(rand.NewPCG(5, 5))
	g := G.NewGraph()
	xv := denseOf(tensor.Float32, randDense(r, 1, batch, 144).Data().([]float64), batch, 144)
	x := newParam(g, "x", xv)
	y, params := buildStack(t, m, g, x)
	perturb(r, 0.3, params...)
	rw := denseOf(tensor.Float32, randDense(r, 1, batch, 3).Data().([]float64), batch, 3)
	loss := mustNode(G.Sum(mustNode(G.HadamardProd(y, G.NewConstant(rw, G.WithName("r"))))))
	tps, err := TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*G.Node{}
	for _, p := range params {
		byName[p.Name()] = p
	}
	in := struct {
		Params map[string]torchTensor `json:"params"`
		X      torchTensor            `json:"x"`
		R      torchTensor            `json:"r"`
		Masks  map[string][]float64   `json:"masks"`
	}{Params: map[string]torchTensor{}, X: torchTensor{Shape: []int{batch, 144}, Data: xv.Data().([]float32)}, R: torchTensor{Shape: []int{batch, 3}, Data: rw.Data().([]float32)}, Masks: stackMasks(batch)}
	for _, tp := range tps {
		in.Params[tp.Torch] = torchTensor{Shape: tp.TorchShape, Data: toTorch(byName[tp.Name].Value().Data().([]float32), tp.Shape, tp.Transpose)}
	}
	if _, err := G.Grad(loss, append(params, x)...); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(append(params, x)...))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}

	var want struct {
		Out       []float32            `json:"out"`
		Grads     map[string][]float32 `json:"grads"`
		InputGrad []float32            `json:"input_grad"`
	}
	testenv.RunPythonJSON(t, filepath.Join("testdata", "sequential_torch.py"), in, &want)
	closeTo(t, "output", y.Value().Data().([]float32), want.Out)
	if len(tps) != len(want.Grads) {
		t.Errorf("%d parameters, PyTorch's module %d", len(tps), len(want.Grads))
	}
	for _, tp := range tps {
		gv, err := byName[tp.Name].Grad()
		if err != nil {
			t.Fatal(err)
		}
		closeTo(t, tp.Torch+"'s gradient", toTorch(gv.Data().([]float32), tp.Shape, tp.Transpose), want.Grads[tp.Torch])
	}
	gx, err := x.Grad()
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "the input's gradient", gx.Data().([]float32), want.InputGrad)
}

// TestSequentialSpecFromJSON: the spec as an export's model_spec records
// it, JSON whose numbers are floats, builds the same model.
func TestSequentialSpecFromJSON(t *testing.T) {
	spec := testStack("")
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var back Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	names := func(s Spec) []string {
		tps, err := TorchParams(buildModel(t, s))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range tps {
			out = append(out, fmt.Sprint(p.Name, p.Shape))
		}
		return out
	}
	if got, want := names(back), names(spec); !slices.Equal(got, want) {
		t.Errorf("from JSON: %v\nwant %v", got, want)
	}
}
