package models

import (
	"fmt"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() {
	Register(family{name: "mlp", build: buildMLP, doc: FamilyDoc{
		Summary: "Dense layers",
		Keys: []KeyDoc{
			{Key: "input", Doc: "Features of an example."},
			{Key: "hidden", Doc: "Widths of the hidden Dense layers, in order: the layers are fc0, fc1, ..., the last emitting the classes."},
			{Key: "classes", Doc: classesDoc},
			{Key: "activation", Doc: "Activation of every Dense layer but the last, which emits logits.", Values: Activations()},
		},
	}})
}

// classesDoc is what model.classes means to the classifiers.
const classesDoc = "Classes predicted; every label of the data must be below it."

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

// DenseSpec describes a Dense layer for NewDense.
type DenseSpec struct {
	// Name is the layer's global name; its parameters are Name.weight
	// ([In, Out]) and Name.bias, and it seeds their initial values.
	Name    string
	In, Out int
	// Activation is one of Activations, or "" for none (logits).
	Activation string
	// DType is the dtype of the parameters and activations; the zero
	// value is float32.
	DType tensor.Dtype
}

// NewDense makes the Dense layer s describes, for a model composed outside
// this package; errors name the field at fault.
func NewDense(s DenseSpec) (*Dense, error) {
	var check specCheck
	layerName(&check, s.Name)
	check.atLeast("in", s.In, 1)
	check.atLeast("out", s.Out, 1)
	if s.Activation != "" && activation(s.Activation) == nil {
		check.add("activation", "unknown activation %q (known: %s)", s.Activation, strings.Join(Activations(), ", "))
	}
	dt := layerDType(&check, s.DType)
	if err := check.layerErr("dense", s.Name); err != nil {
		return nil, err
	}
	return &Dense{name: s.Name, In: s.In, Out: s.Out, Act: s.Activation, dt: dt}, nil
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
