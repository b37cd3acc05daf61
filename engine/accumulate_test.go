package engine

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// TestProductWeightsSumInPlace: every Dense weight's gradient is summed by
// an accumulation, not by gorgonia, in both modes; and the sums stay right
// when a weight has the shape of the activations (a register that held a
// sum could then be reused for an activation) over machines reused from
// one step to the next.
func TestProductWeightsSumInPlace(t *testing.T) {
	const seed, batch, width = 5, 4, 4
	m, err := models.Build(models.Spec{Name: "mlp", DType: "float64", Input: width, Hidden: []int{width, width}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	xs, ys := randInputs(r, 3, batch, width)
	want := map[string][]float64{}
	for k := range xs {
		_, g := symbolicGrads(t, m, xs[k], ys[k], seed)
		for name, v := range g {
			if want[name] == nil {
				want[name] = make([]float64, len(v))
			}
			for i := range v {
				want[name][i] += 2 * v[i] / float64(len(xs)) // two steps' worth
			}
		}
	}
	for _, split := range []bool{false, true} {
		var es []*Engine
		for i := range len(m.Layers) {
			e, err := NewEngine(m, i, i+1, batch, seed, Options{Split: split})
			if err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		for _, e := range es {
			accumulations := 0
			for _, n := range e.g.AllNodes() {
				if _, ok := n.Op().(*accumulateOp); ok {
					accumulations++
				}
			}
			if !split && accumulations != 1 {
				t.Errorf("fused layer %d: %d accumulations, want 1 (its weight's)", e.First, accumulations)
			}
			if _, err := e.Params()[0].Grad(); err == nil && !split {
				t.Errorf("fused layer %d: gorgonia also keeps a gradient of %s", e.First, e.Params()[0].Name())
			}
		}
		// Two steps' micro-batches without an optimizer step between them:
		// the second reuses the first's machines.
		for range 2 {
			runMicroBatches(t, es, xs, ys)
		}
		got := engineGrads(t, es)
		for name, w := range want {
			for i := range w {
				if d := math.Abs(got[name][i] - w[i]); d > 1e-12*(1+math.Abs(w[i])) {
					t.Fatalf("split %v: %s[%d] = %v, symbolic %v", split, name, i, got[name][i], w[i])
				}
			}
		}
	}
}

// runMicroBatches runs every micro-batch's forward through es, then every
// backward, as GPipe orders them, and returns the losses.
func runMicroBatches(t *testing.T, es []*Engine, xs []*tensor.Dense, ys [][]int) []float64 {
	t.Helper()
	losses := make([]float64, len(xs))
	for k, x := range xs {
		h := x
		for _, e := range es {
			out, err := e.Forward(k, h, ys[k])
			if err != nil {
				t.Fatal(err)
			}
			h = out
		}
		losses[k] = h.Data().([]float64)[0]
	}
	for k := range xs {
		g := es[len(es)-1].LossScale(len(xs))
		for i := len(es) - 1; i >= 0; i-- {
			dx, err := es[i].Backward(k, g)
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 && dx == nil {
				t.Fatalf("stage %d returned no input gradient", i)
			}
			g = dx
		}
	}
	return losses
}

// TestGPTProductsSumInPlace: a GPT block's six projections and the head's
// product (tied or not) sum their weights' gradients by accumulations, in
// both modes; the LayerNorms and embeddings are left to gorgonia.
func TestGPTProductsSumInPlace(t *testing.T) {
	for _, tied := range []bool{false, true} {
		m := smallGPT(t, "float32", tied)
		for _, split := range []bool{false, true} {
			e, err := NewEngine(m, 0, len(m.Layers), 2, 1, Options{Split: split})
			if err != nil {
				t.Fatal(err)
			}
			summed := map[string]bool{}
			e.accumulated(e.g, summed)
			if split {
				for _, w := range e.weights {
					e.accumulated(w.g, summed)
				}
			}
			want := 2*6 + 1
			if len(summed) != want {
				t.Errorf("tied %v split %v: %d weights summed by accumulation, want %d: %v", tied, split, len(summed), want, summed)
			}
			for name := range summed {
				if !strings.Contains(name, "weight") && name != "head.tok" {
					t.Errorf("tied %v split %v: %s summed as a product's weight", tied, split, name)
				}
			}
		}
	}
}

// accumulated marks the parameters whose gradients g's accumulations sum.
func (e *Engine) accumulated(g *G.ExprGraph, summed map[string]bool) {
	for _, n := range g.AllNodes() {
		if op, ok := n.Op().(*accumulateOp); ok {
			for i, sum := range e.grads {
				if sum == op.sum {
					summed[e.params[i].Name()] = true
				}
			}
		}
	}
}

// TestManyRowsLeftToGorgonia: a product over more than accumulateRows rows
// keeps gorgonia's product and add.
func TestManyRowsLeftToGorgonia(t *testing.T) {
	m := smallMLP(t, "float32")
	for _, rows := range []int{accumulateRows, accumulateRows + 1} {
		e, err := NewEngine(m, 0, len(m.Layers), rows, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		summed := map[string]bool{}
		e.accumulated(e.g, summed)
		want := 0
		if rows <= accumulateRows {
			want = len(m.Layers)
		}
		if len(summed) != want {
			t.Errorf("%d rows: %d weights summed by accumulation, want %d", rows, len(summed), want)
		}
	}
}
