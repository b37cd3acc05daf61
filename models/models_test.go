package models

import (
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
		{Spec{Name: "transformer"}, `unknown model "transformer"`},
		{Spec{Name: "mlp", Input: 4, Classes: 3, DType: "int8"}, `unknown dtype "int8"`},
		{Spec{Name: "mlp", Input: 0, Classes: 3}, "input >= 1"},
		{Spec{Name: "mlp", Input: 4, Classes: 3, Hidden: []int{5, 0}}, "hidden[1] = 0"},
		{Spec{Name: "mlp", Input: 4, Classes: 3, Activation: "swish"}, `unknown activation "swish"`},
	}
	for _, c := range cases {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.want)
		}
	}
	if n := Names(); !slices.Equal(n, []string{"cnn", "gpt", "mlp"}) {
		t.Errorf("Names() = %v", n)
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
