package models

import (
	"fmt"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() { Register("mlp", buildMLP) }

// buildMLP makes Input -> Hidden... -> Classes with one Dense layer per arrow; every
// layer but the last applies the activation, the last emits logits.
func buildMLP(spec Spec) (*Model, error) {
	var check specCheck
	dt := check.dtype(spec.DType)
	check.atLeast("input", spec.Input, 1)
	act := spec.Activation
	if act == "" {
		act = "relu"
	}
	if activation(act) == nil {
		check.add("activation", "unknown activation %q (known: %s)", act, strings.Join(Activations(), ", "))
	}
	for i, h := range spec.Hidden {
		check.atLeast(fmt.Sprintf("hidden[%d]", i), h, 1)
	}
	check.atLeast("classes", spec.Classes, 2)
	if err := check.err(); err != nil {
		return nil, err
	}
	widths := append(append([]int{spec.Input}, spec.Hidden...), spec.Classes)
	m := &Model{Spec: spec, DType: dt, Example: tensor.Shape{spec.Input}, Classes: spec.Classes}
	for i := 0; i+1 < len(widths); i++ {
		a := act
		if i+2 == len(widths) {
			a = ""
		}
		m.Layers = append(m.Layers, &Dense{name: fmt.Sprintf("fc%d", i), In: widths[i], Out: widths[i+1], Act: a, dt: dt})
	}
	return m, nil
}

// activations are the functions an mlp's activation may name, in the order
// messages and the config schema list them.
var activations = []struct {
	name string
	f    func(*G.Node) (*G.Node, error)
}{{"relu", G.Rectify}, {"tanh", G.Tanh}, {"sigmoid", G.Sigmoid}}

// activation is the function named name, nil if none is.
func activation(name string) func(*G.Node) (*G.Node, error) {
	for _, a := range activations {
		if a.name == name {
			return a.f
		}
	}
	return nil
}

// Activations lists the activations model mlp accepts.
func Activations() []string {
	out := make([]string, len(activations))
	for i, a := range activations {
		out[i] = a.name
	}
	return out
}

// Dense is y = act(x W + b) on [batch, In] inputs.
type Dense struct {
	name    string
	In, Out int
	Act     string // "" for none (logits)
	dt      tensor.Dtype
}

func (d *Dense) Name() string { return d.name }

func (d *Dense) OutShape(in tensor.Shape) tensor.Shape { return tensor.Shape{in[0], d.Out} }

func (d *Dense) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	w := G.NewMatrix(g, d.dt, G.WithShape(d.In, d.Out), G.WithName(d.name+".weight"),
		G.WithValue(glorotUniform(d.dt, tensor.Shape{d.In, d.Out}, d.In, d.Out, paramRNG(seed, d.name, "weight"))))
	b := G.NewVector(g, d.dt, G.WithShape(d.Out), G.WithName(d.name+".bias"),
		G.WithValue(tensor.New(tensor.Of(d.dt), tensor.WithShape(d.Out))))
	params := []*G.Node{w, b}
	tap, err := d.BuildPart(g, 0, x, params)
	if err != nil {
		return Built{}, err
	}
	out := tap
	if d.Act != "" {
		if out, err = activation(d.Act)(tap); err != nil {
			return Built{}, fmt.Errorf("%s: %w", d.name, err)
		}
	}
	return Built{Out: out, Params: params, Parts: []Part{{In: x, Tap: tap, Params: params}}}, nil
}

// LinearWeight: the layer's one part is x W + b.
func (d *Dense) LinearWeight(i int) (int, bool, bool) { return 0, false, i == 0 }

// BuildPart is the layer's one part, x W + b, before the activation.
func (d *Dense) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i != 0 || len(params) != 2 {
		return nil, fmt.Errorf("%s: part %d with %d parameters; the layer has one part of 2", d.name, i, len(params))
	}
	xw, err := G.Mul(x, params[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	o := newOps(d.dt)
	y := o.biasAdd(xw, params[1])
	if o.err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, o.err)
	}
	return y, nil
}
