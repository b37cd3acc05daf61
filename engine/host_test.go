package engine

import (
	"slices"
	"testing"

	"gorgonia.org/tensor"
)

// TestLoadWeights: Weights gives the engine's parameters by name in Params'
// order; loading another engine's weights makes this one's equal to them,
// and weights of another stage are refused by name.
func TestLoadWeights(t *testing.T) {
	m := smallMLP(t, "float32")
	a, err := NewEngine(m, 0, 3, 2, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewEngine(m, 0, 3, 2, 2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ws := a.Weights()
	for i, p := range a.Params() {
		if ws[i].Name != p.Name() || ws[i].Value != p.Value() {
			t.Fatalf("weight %d is %s, want parameter %s's own value", i, ws[i].Name, p.Name())
		}
	}
	if slices.Equal(ws[0].Value.Data().([]float32), b.Weights()[0].Value.Data().([]float32)) {
		t.Fatal("engines of seeds 1 and 2 start equal; the test shows nothing")
	}
	if err := b.LoadWeights(ws); err != nil {
		t.Fatal(err)
	}
	for i, w := range b.Weights() {
		if !slices.Equal(w.Value.Data().([]float32), ws[i].Value.Data().([]float32)) {
			t.Errorf("weight %s differs from the one loaded", w.Name)
		}
	}
	other, err := NewEngine(m, 1, 3, 2, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	refused(t, "another stage's weights", other.LoadWeights(ws), "weights for a stage of")
	swapped := slices.Clone(ws)
	swapped[0].Value = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(1, 1))
	refused(t, "a weight of another shape", a.LoadWeights(swapped), "weight 0: "+ws[0].Name)
}
