package models

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestCNNLayout(t *testing.T) {
	m := buildModel(t, Spec{Name: "cnn", Input: 784, Channels: []int{8, 16}, Classes: 10})
	var names []string
	for _, l := range m.Layers {
		names = append(names, l.Name())
	}
	if want := []string{"conv0", "conv1", "fc"}; !slices.Equal(names, want) {
		t.Fatalf("layers %v, want %v", names, want)
	}
	for i, want := range []tensor.Shape{{5, 784}, {5, 8 * 14 * 14}, {5, 16 * 7 * 7}, {5, 10}} {
		if got := m.ShapeAt(i, 5); !got.Eq(want) {
			t.Errorf("ShapeAt(%d) = %v, want %v", i, got, want)
		}
	}
	params := paramNames(t, m, 2)
	for layer, want := range map[string][]string{
		"conv0": {"conv0.weight", "conv0.bias"},
		"conv1": {"conv1.weight", "conv1.bias"},
		"fc":    {"fc.weight", "fc.bias"},
	} {
		if !slices.Equal(params[layer], want) {
			t.Errorf("%s params %v, want %v", layer, params[layer], want)
		}
	}
	if m.Targets() != 1 || m.Tied != nil {
		t.Errorf("Targets %d, Tied %v", m.Targets(), m.Tied)
	}
	// Odd sizes pool down, dropping the last row and column.
	odd := buildModel(t, Spec{Name: "cnn", Input: 784, Channels: []int{2, 2, 2}, Classes: 10})
	if got := odd.ShapeAt(3, 1); !got.Eq(tensor.Shape{1, 2 * 3 * 3}) {
		t.Errorf("after three pools: %v, want (1, 18)", got)
	}
	checkSplitEquivalence(t, odd, 1)
}

func TestCNNBuildErrors(t *testing.T) {
	cases := []struct {
		spec Spec
		want string
	}{
		{Spec{Name: "cnn", Input: 780, Channels: []int{8}, Classes: 10}, "model.input: 780 is not the pixel count of a square image"},
		{Spec{Name: "cnn", Input: 784, Channels: []int{8}, Classes: 1}, "model.classes: must be at least 2, got 1"},
		{Spec{Name: "cnn", Input: 784, Classes: 10}, "model.channels: empty"},
		{Spec{Name: "cnn", Input: 784, Channels: []int{8, 0}, Classes: 10}, "model.channels[1]: must be at least 1, got 0"},
		{Spec{Name: "cnn", Input: 16, Channels: []int{1, 1, 1}, Classes: 10}, "model.channels: 3 conv layers, but a 4x4 image is 1x1 before conv2 and cannot be pooled"},
		{Spec{Name: "cnn", Input: 784, Channels: []int{8}, Classes: 10, DType: "bf16"}, `model.dtype: unknown dtype "bf16"`},
	}
	for _, c := range cases {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.want)
		}
	}
}

// TestGradConv checks one conv layer (conv, bias, ReLU, max pool) against
// central differences, for its input as well as its parameters, since a
// pipeline sends the input gradient upstream.
func TestGradConv(t *testing.T) {
	conv := &Conv{name: "conv0", In: 2, Out: 3, Size: 6, dt: tensor.Float64}
	r := rand.New(rand.NewPCG(6, 6))
	g := G.NewGraph()
	x := newParam(g, "x", randDense(r, 1, 2, 2*6*6))
	b, err := conv.Build(g, x, 4)
	if err != nil {
		t.Fatal(err)
	}
	// A non-zero bias, so its gradient is tested away from the init.
	copy(b.Params[1].Value().Data().([]float64), []float64{0.1, -0.2, 0.3})
	checkGraphGrads(t, g, weightedSum(t, g, b.Out), append([]*G.Node{x}, b.Params...), 0)
}

// TestCNNGradients checks a whole small CNN with its loss.
func TestCNNGradients(t *testing.T) {
	m := buildModel(t, Spec{Name: "cnn", DType: "float64", Input: 36, Channels: []int{2, 3}, Classes: 4})
	s := buildTestStage(t, m, 0, len(m.Layers), 2, 9)
	x, y := randomBatch(m, 2, rand.New(rand.NewPCG(10, 10)))
	if err := G.Let(s.x, x); err != nil {
		t.Fatal(err)
	}
	if err := G.Let(s.onehot, oneHotTargets(m, y)); err != nil {
		t.Fatal(err)
	}
	checkGraphGrads(t, s.g, s.out, s.params, 0)
}

func TestCNNSplitEquivalence(t *testing.T) {
	for _, dt := range []string{"float32", "float64"} {
		checkSplitEquivalence(t, buildModel(t, Spec{Name: "cnn", DType: dt, Input: 784, Channels: []int{4, 8}, Classes: 10}), 2)
	}
}

func TestCNNFloat32Backward(t *testing.T) {
	checkFloat32Backward(t, Spec{Name: "cnn", Input: 64, Channels: []int{3, 4}, Classes: 5}, 3)
}
