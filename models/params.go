package models

import (
	"math/rand/v2"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// normalInit fills a new tensor with N(0, sd^2) samples.
func normalInit(dt tensor.Dtype, shape tensor.Shape, sd float64, r *rand.Rand) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	switch d := t.Data().(type) {
	case []float64:
		for i := range d {
			d[i] = r.NormFloat64() * sd
		}
	case []float32:
		for i := range d {
			d[i] = float32(r.NormFloat64() * sd)
		}
	}
	return t
}

// constInit is a new tensor with every entry v (zeros for biases, ones for gains).
func constInit(dt tensor.Dtype, shape tensor.Shape, v float64) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	if v != 0 {
		for i := 0; i < shape.TotalSize(); i++ {
			setAt(t, i, v)
		}
	}
	return t
}

// newParam adds a parameter node holding value to g.
func newParam(g *G.ExprGraph, name string, value *tensor.Dense) *G.Node {
	return G.NewTensor(g, value.Dtype(), value.Dims(), G.WithShape(value.Shape()...), G.WithName(name), G.WithValue(value))
}
