package familytest_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pipetrain/pipetrain/models"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// gain is a sequential entry type of this program's own: a learned gain
// per feature, starting at the entry's init.
type gain struct{ init float64 }

func init() {
	models.RegisterSeqType(models.SeqType{Name: "gain", Parse: func(e *models.SeqEntry) models.SeqLayer {
		return gain{e.Float("init", 1)}
	}})
}

func (s gain) OutShape(in []int) ([]int, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("takes flat features, got %v", in)
	}
	return in, nil
}

func (s gain) Params(in []int) []models.SeqParam {
	return []models.SeqParam{{Name: "weight", Shape: []int{in[0]}, Init: func(dt tensor.Dtype, _ *rand.Rand) *tensor.Dense {
		v := make([]float64, in[0])
		for i := range v {
			v[i] = s.init
		}
		return tensor.New(tensor.WithShape(in[0]), tensor.WithBacking(v))
	}}}
}

func (s gain) Forward(_ *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error) {
	return G.BroadcastHadamardProd(x, params[0], nil, []byte{0})
}

// TestSeqTypeFromOutside: a stack names the type registered above; its
// parameters get the nn.Sequential's names, its unit (with the tanh after
// it) computes what its Forward says, and its fields are checked by path.
func TestSeqTypeFromOutside(t *testing.T) {
	spec := models.Spec{Name: "sequential", DType: "float64", Input: 4, Classes: 3, Own: map[string]any{"stack": []any{
		map[string]any{"type": "gain", "init": 2.0}, map[string]any{"type": "tanh"}, map[string]any{"type": "linear", "out": 3},
	}}}
	m, err := models.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	tps, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range tps {
		names = append(names, p.Name+" "+p.Torch)
	}
	if want := []string{"stack0.weight 0.weight", "stack2.weight 2.weight", "stack2.bias 2.bias"}; !slices.Equal(names, want) {
		t.Errorf("names %q, want %q", names, want)
	}
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(1, 4), G.WithName("x"), G.WithValue(tensor.New(tensor.WithShape(1, 4), tensor.WithBacking([]float64{1, -1, 0.5, 0}))))
	b, err := m.Layers[0].Build(g, x, 1)
	if err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	// Unit 0 is the gain and the tanh after it.
	if got, want := b.Out.Value().Data().([]float64), []float64{math.Tanh(2), math.Tanh(-2), math.Tanh(1), 0}; !slices.Equal(got, want) {
		t.Errorf("unit 0 (gain 2, tanh) gives %v, want %v", got, want)
	}
	spec.Own["stack"].([]any)[0] = map[string]any{"type": "gain", "init": -1}
	if _, err := models.Build(spec); err == nil || err.Error() != "model.stack[0].init: must be positive, got -1" {
		t.Errorf("init -1: %v", err)
	}
}
