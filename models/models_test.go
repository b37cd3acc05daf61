package models

import (
	"errors"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestBuildErrors(t *testing.T) {
	cases := []struct {
		spec Spec
		want string
	}{
		{Spec{Name: "transformer"}, `model.name: unknown model "transformer" (known: cnn, gpt, llama, mlp, sequential)`},
		{Spec{Name: "mlp", Input: 4, Classes: 3, DType: "int8"}, `model.dtype: unknown dtype "int8" (known: float32, float64)`},
		{Spec{Name: "mlp", Input: 0, Classes: 3}, "model.input: must be at least 1, got 0"},
		{Spec{Name: "mlp", Input: 4, Classes: 3, Hidden: []int{5, 0}}, "model.hidden[1]: must be at least 1, got 0"},
		{Spec{Name: "mlp", Input: 4, Classes: 3, Activation: "swish"}, `model.activation: unknown activation "swish"`},
	}
	for _, c := range cases {
		if _, err := Build(c.spec); err == nil || err.Error() != c.want && !strings.HasPrefix(err.Error(), c.want+" (") {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.want)
		}
	}
	if n := Names(); !slices.Equal(n, []string{"cnn", "gpt", "llama", "mlp", "sequential"}) {
		t.Errorf("Names() = %v", n)
	}
}

// TestBuildReportsEveryProblem: a spec with several bad fields gets one
// SpecError per field, each naming it, not just the first.
func TestBuildReportsEveryProblem(t *testing.T) {
	_, err := Build(Spec{Name: "mlp", DType: "float16", Input: 784, Hidden: []int{512, 0, 128}, Classes: 0, Activation: "gelu"})
	var got SpecErrors
	if !errors.As(err, &got) {
		t.Fatalf("error %v (%T), want SpecErrors", err, err)
	}
	want := SpecErrors{
		{"dtype", `unknown dtype "float16" (known: float32, float64)`},
		{"activation", `unknown activation "gelu" (known: relu, tanh, sigmoid)`},
		{"hidden[1]", "must be at least 1, got 0"},
		{"classes", "must be at least 2, got 0"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if msg := err.Error(); !strings.Contains(msg, "model.dtype: ") || !strings.Contains(msg, "; model.hidden[1]: ") {
		t.Errorf("Error() = %q, want fields named model.dtype, model.hidden[1]", msg)
	}
}

func TestMLPShapes(t *testing.T) {
	m, err := Build(Spec{Name: "mlp", Input: 784, Hidden: []int{512, 256}, Classes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Layers) != 3 {
		t.Fatalf("%d layers, want 3", len(m.Layers))
	}
	for i, want := range []tensor.Shape{{32, 784}, {32, 512}, {32, 256}, {32, 10}} {
		if got := m.ShapeAt(i, 32); !got.Eq(want) {
			t.Errorf("ShapeAt(%d) = %v, want %v", i, got, want)
		}
	}
}

// TestInitIndependentOfSplit builds layer fc1 alone and after fc0: its weights must
// be identical, or a pipelined model would start from different weights than the
// one-process reference.
func TestInitIndependentOfSplit(t *testing.T) {
	m, err := Build(Spec{Name: "mlp", DType: "float64", Input: 6, Hidden: []int{5, 4}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	weightsOf := func(first int) []float64 {
		g := G.NewGraph()
		x := G.NewMatrix(g, tensor.Float64, G.WithShape(m.ShapeAt(first, 2)...), G.WithName("x"))
		h := x
		var ps []*G.Node
		for _, l := range m.Layers[first:2] {
			b, err := l.Build(g, h, 9)
			if err != nil {
				t.Fatal(err)
			}
			h, ps = b.Out, append(ps, b.Params...)
		}
		w := ps[len(ps)-2] // fc1.weight
		if w.Name() != "fc1.weight" {
			t.Fatalf("got %s", w.Name())
		}
		return w.Value().Data().([]float64)
	}
	alone, after := weightsOf(1), weightsOf(0)
	for i := range alone {
		if alone[i] != after[i] {
			t.Fatalf("fc1.weight[%d]: %v alone, %v after fc0", i, alone[i], after[i])
		}
	}
	if alone[0] == 0 && alone[1] == 0 {
		t.Error("weights not initialised")
	}
}

func TestParamCountSumsLayers(t *testing.T) {
	m, err := Build(Spec{Name: "mlp", DType: "float32", Input: 784, Hidden: []int{512, 256}, Classes: 10, Activation: "relu"})
	if err != nil {
		t.Fatal(err)
	}
	want := []int{784*512 + 512, 512*256 + 256, 256*10 + 10}
	total := 0
	for i, w := range want {
		n, err := ParamCount(m, i, i+1)
		if err != nil || n != w {
			t.Errorf("layer %d: %d parameters (%v), want %d", i, n, err, w)
		}
		total += w
	}
	if n, err := ParamCount(m, 0, 3); err != nil || n != total {
		t.Errorf("layers 0-2: %d (%v), want %d", n, err, total)
	}
}
