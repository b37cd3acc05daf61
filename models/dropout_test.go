package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// trainKey is a training run's key for the tests.
var trainKey = DrawKey{Train: true, Step: 3, MicroBatch: 2}

// TestGradDropout: dropout's hand-written backward, with the mask the key
// fixes, against central differences in float64, on an image batch and on
// rows; and the forward zeroes exactly the mask's dropped elements and
// scales the rest by 1/(1-p).
func TestGradDropout(t *testing.T) {
	for _, shape := range [][]int{{3, 2, 3, 3}, {4, 7}} {
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			const p = 0.3
			key := trainKey
			d := Drawer{Key: &key, Seed: 11, Layer: []int{4}}
			x := randDense(rand.New(rand.NewPCG(1, 2)), 1, shape...)
			checkGrads(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
				o := newOps(tensor.Float64)
				y := o.dropout(in[0], p, d)
				return y, o.err
			})
			y, err := runNode(t, []*tensor.Dense{x}, func(o *ops, in []*G.Node) *G.Node { return o.dropout(in[0], p, d) })
			if err != nil {
				t.Fatal(err)
			}
			mask, xs, ys := d.Mask(key, p, x.Shape().TotalSize()), x.Data().([]float64), y.Data().([]float64)
			kept := 0
			for i := range xs {
				want := 0.0
				if mask[i] {
					want, kept = xs[i]*(1/(1-p)), kept+1
				}
				if ys[i] != want {
					t.Fatalf("element %d: %v, want %v (kept %v)", i, ys[i], want, mask[i])
				}
			}
			if kept == 0 || kept == len(xs) {
				t.Errorf("kept %d of %d: the mask drops nothing or everything", kept, len(xs))
			}
		})
	}
}

// TestDropoutMatchesPyTorch: the op's forward and the gradient of
// sum(y·R) equal PyTorch's dropout given the same mask, applied as
// F.dropout applies its own (testdata/dropout_torch.py), to within 1e-6,
// in float64 and float32.
func TestDropoutMatchesPyTorch(t *testing.T) {
	testenv.NeedTorch(t)
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			const p = 0.2
			shape := []int{5, 3, 4}
			key := trainKey
			d := Drawer{Key: &key, Seed: 5, Layer: []int{7, 1}}
			r := rand.New(rand.NewPCG(8, 8))
			xv, rv := randDense(r, 1, shape...).Data().([]float64), randDense(r, 1, shape...).Data().([]float64)
			g := G.NewGraph()
			x := newParam(g, "x", denseOf(dt, xv, shape...))
			o := newOps(dt)
			y := o.dropout(x, p, d)
			if o.err != nil {
				t.Fatal(o.err)
			}
			loss := mustNode(G.Sum(mustNode(G.HadamardProd(y, G.NewConstant(denseOf(dt, rv, shape...), G.WithName("r"))))))
			if _, err := G.Grad(loss, x); err != nil {
				t.Fatal(err)
			}
			vm := G.NewTapeMachine(g, G.BindDualValues(x))
			defer vm.Close()
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			gx, err := x.Grad()
			if err != nil {
				t.Fatal(err)
			}
			mask := make([]float64, len(xv))
			for i, k := range d.Mask(key, p, len(xv)) {
				if k {
					mask[i] = 1
				}
			}
			in := map[string]any{"dtype": dt.String(), "shape": shape, "p": p, "x": valuesOf(x.Value()), "mask": mask, "r": rv}
			var want struct {
				Out       []float64 `json:"out"`
				InputGrad []float64 `json:"input_grad"`
			}
			testenv.RunPythonJSON(t, filepath.Join("testdata", "dropout_torch.py"), in, &want)
			within(t, "output", valuesOf(y.Value()), want.Out, 1e-6)
			within(t, "input gradient", valuesOf(gx), want.InputGrad, 1e-6)
		})
	}
}

// valuesOf is a float32 or float64 value's entries as float64s.
func valuesOf(v G.Value) []float64 {
	switch d := v.Data().(type) {
	case []float64:
		return slices.Clone(d)
	case []float32:
		out := make([]float64, len(d))
		for i, x := range d {
			out[i] = float64(x)
		}
		return out
	}
	return nil
}

// within fails unless got and want differ by at most tol relative to the
// larger entry (absolute below 1).
func within(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, PyTorch %d", what, len(got), len(want))
	}
	worst := 0.0
	for i := range got {
		worst = max(worst, math.Abs(got[i]-want[i])/max(1, math.Abs(want[i])))
	}
	if worst > tol {
		t.Errorf("%s: differs from PyTorch's by up to %g", what, worst)
	}
	t.Logf("%s: largest difference %.2g", what, worst)
}

// TestDropoutMaskStatistics: the kept fraction is 1-p to within 4 sigma;
// equal keys draw equal masks and a different step, micro-batch, layer or
// seed a different one; p 0 keeps everything; a run that is not training
// (evaluation's) is the identity.
func TestDropoutMaskStatistics(t *testing.T) {
	const n = 200000
	d := Drawer{Seed: 11, Layer: []int{3}}
	for _, p := range []float64{0.05, 0.1, 0.5, 0.9} {
		kept := 0
		for _, k := range d.Mask(trainKey, p, n) {
			if k {
				kept++
			}
		}
		sigma := math.Sqrt(n * p * (1 - p))
		if dev := math.Abs(float64(kept) - n*(1-p)); dev > 4*sigma {
			t.Errorf("p %v: kept %d of %d, %.1f sigma from %v", p, kept, n, dev/sigma, n*(1-p))
		}
	}
	base := d.Mask(trainKey, 0.5, 4096)
	if again := d.Mask(trainKey, 0.5, 4096); !slices.Equal(base, again) {
		t.Error("equal keys drew different masks")
	}
	others := map[string][]bool{
		"step":        d.Mask(DrawKey{Train: true, Step: 4, MicroBatch: 2}, 0.5, 4096),
		"micro-batch": d.Mask(DrawKey{Train: true, Step: 3, MicroBatch: 3}, 0.5, 4096),
		"layer":       Drawer{Seed: 11, Layer: []int{3, 0}}.Mask(trainKey, 0.5, 4096),
		"seed":        Drawer{Seed: 12, Layer: []int{3}}.Mask(trainKey, 0.5, 4096),
	}
	for what, m := range others {
		same := 0
		for i := range m {
			if m[i] == base[i] {
				same++
			}
		}
		// Independent masks agree on half the elements, to within 4 sigma (32).
		if same < 2048-128 || same > 2048+128 {
			t.Errorf("another %s: %d of 4096 elements agree, want about 2048", what, same)
		}
	}
	if m := d.Mask(trainKey, 0, 4096); slices.Contains(m, false) {
		t.Error("p 0 dropped an element")
	}
	x := []float64{1, -2, 3, 4}
	out := make([]float64, 4)
	for _, key := range []*DrawKey{nil, {Step: 3, MicroBatch: 2}} {
		dropout(Drawer{Key: key, Seed: 11}, 0.5, out, x)
		if !slices.Equal(out, x) {
			t.Errorf("key %v: %v, want the input %v", key, out, x)
		}
	}
}

// TestDropoutEntry: a dropout entry takes any shape, has no parameters,
// joins the unit before it, and refuses a p outside [0, 1) naming the
// entry and field; a unit holding one draws in training.
func TestDropoutEntry(t *testing.T) {
	spec := Spec{Name: "sequential", Input: 8, Classes: 3, Own: map[string]any{
		"input_shape": []any{2, 2, 2},
		"stack": []any{
			entry{"type": "dropout", "p": 0.1},
			entry{"type": "flatten"},
			entry{"type": "linear", "out": 4},
			entry{"type": "dropout"},
			entry{"type": "linear", "out": 3},
		},
	}}
	m := buildModel(t, spec)
	var got []string
	for _, l := range m.Layers {
		got = append(got, fmt.Sprintf("%s %v", l.(Described).Describe(), l.(DrawingLayer).DrawsInTraining()))
	}
	want := []string{"stack[0] dropout, stack[1] flatten, stack[2] linear, stack[3] dropout: 2x2x2 -> 4 true", "stack[4] linear: 4 -> 3 false"}
	if !slices.Equal(got, want) {
		t.Errorf("units %q, want %q", got, want)
	}
	if !m.DrawsInTraining(0, 2) || m.DrawsInTraining(1, 2) {
		t.Error("DrawsInTraining: want the first unit only")
	}
	for _, c := range []struct {
		p    any
		want string
	}{
		{1, "model.stack[3].p: must be in [0, 1), got 1"},
		{-0.1, "model.stack[3].p: must be in [0, 1), got -0.1"},
		{"half", "model.stack[3].p: half is not a number"},
	} {
		spec.Own["stack"].([]any)[3] = entry{"type": "dropout", "p": c.p}
		if _, err := Build(spec); err == nil || err.Error() != c.want {
			t.Errorf("p %v: %v, want %s", c.p, err, c.want)
		}
	}
}
