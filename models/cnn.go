package models

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() {
	Register(family{name: "cnn", build: buildCNN, doc: FamilyDoc{
		Summary: "conv layers, then a Dense classifier",
		Keys: []KeyDoc{
			{Key: "input", Doc: "The pixels of a square single-channel image (784 = 28x28)."},
			{Key: "classes", Doc: classesDoc},
			{Key: "channels", Doc: "Output channels of each conv layer: conv0, conv1, ..., each a 3x3 convolution, ReLU and 2x2 max pool, then the Dense layer fc."},
		},
	}})
}

// buildCNN makes a small image classifier: one conv layer per entry of
// Channels ("conv0", "conv1", ...: 3x3 conv with padding 1, ReLU, 2x2 max
// pool), then "fc", a Dense layer from the flattened features to the classes.
// Input is a square single-channel image of Input pixels (784 = 28x28 for
// Fashion-MNIST). Activations between layers stay (batch, C*H*W), so they
// travel as 2-D tensors; each conv layer reshapes to and from NCHW inside.
func buildCNN(spec Spec) (*Model, error) {
	var check specCheck
	dt := check.dtype(spec.DType)
	side := int(math.Round(math.Sqrt(float64(spec.Input))))
	square := spec.Input >= 1 && side*side == spec.Input
	if !square {
		check.add("input", "%d is not the pixel count of a square image (model cnn)", spec.Input)
	}
	check.atLeast("classes", spec.Classes, 2)
	if len(spec.Channels) == 0 {
		check.add("channels", "empty; give the output channels of each conv layer, e.g. [8, 16]")
	}
	for i, c := range spec.Channels {
		check.atLeast(fmt.Sprintf("channels[%d]", i), c, 1)
	}
	if square {
		// Each conv layer halves the image; it needs at least 2x2 to pool.
		for i, h := 0, side; i < len(spec.Channels); i, h = i+1, h/2 {
			if h < 2 {
				check.add("channels", "%d conv layers, but a %dx%d image is %dx%d before conv%d and cannot be pooled", len(spec.Channels), side, side, h, h, i)
				break
			}
		}
	}
	if err := check.err(); err != nil {
		return nil, err
	}
	m := &Model{Spec: spec, DType: dt, Example: tensor.Shape{spec.Input}, Classes: spec.Classes}
	in, h := 1, side
	for i, c := range spec.Channels {
		m.Layers = append(m.Layers, &Conv{name: fmt.Sprintf("conv%d", i), In: in, Out: c, Size: h, dt: dt})
		in, h = c, h/2
	}
	m.Layers = append(m.Layers, &Dense{name: "fc", In: in * h * h, Out: spec.Classes, dt: dt})
	return m, nil
}

// ConvSpec describes a Conv layer for NewConv.
type ConvSpec struct {
	// Name is the layer's global name; its parameters are Name.weight
	// ([Out, In, 3, 3]) and Name.bias, and it seeds their initial values.
	Name    string
	In, Out int // channels
	// Size is the input image's height and width, at least 2 to pool.
	Size int
	// DType is the dtype of the parameters and activations; the zero
	// value is float32.
	DType tensor.Dtype
}

// NewConv makes the Conv layer s describes, for a model composed outside
// this package; errors name the field at fault.
func NewConv(s ConvSpec) (*Conv, error) {
	var check specCheck
	layerName(&check, s.Name)
	check.atLeast("in", s.In, 1)
	check.atLeast("out", s.Out, 1)
	check.atLeast("size", s.Size, 2)
	dt := layerDType(&check, s.DType)
	if err := check.layerErr("conv", s.Name); err != nil {
		return nil, err
	}
	return &Conv{name: s.Name, In: s.In, Out: s.Out, Size: s.Size, dt: dt}, nil
}

// Conv is 3x3 convolution (padding 1, stride 1) with bias, ReLU and 2x2 max
// pooling (stride 2, odd edges dropped) on square images: (batch, In*Size*Size)
// in, (batch, Out*(Size/2)^2) out, both flattened NCHW.
type Conv struct {
	name    string
	In, Out int // channels
	Size    int // input height and width
	dt      tensor.Dtype
}

const convKernel = 3

// FreshValues: see the interface; im2col cannot reuse last run's output.
func (c *Conv) FreshValues() {}

func (c *Conv) Name() string { return c.name }

func (c *Conv) OutShape(in tensor.Shape) tensor.Shape {
	p := c.Size / 2
	return tensor.Shape{in[0], c.Out * p * p}
}

func (c *Conv) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	if s := x.Shape(); s.Dims() != 2 || s[1] != c.In*c.Size*c.Size {
		return Built{}, fmt.Errorf("%s: input shape %v, want (batch, %d)", c.name, s, c.In*c.Size*c.Size)
	}
	fanIn, fanOut := c.In*convKernel*convKernel, c.Out*convKernel*convKernel
	filterShape := tensor.Shape{c.Out, c.In, convKernel, convKernel}
	w := newParam(g, c.name+".weight", glorotUniform(c.dt, filterShape, fanIn, fanOut, paramRNG(seed, c.name, "weight")))
	b := newParam(g, c.name+".bias", constInit(c.dt, tensor.Shape{c.Out}, 0))
	batch, p := x.Shape()[0], c.Size/2
	o := newOps(c.dt)
	img := o.reshape(x, batch, c.In, c.Size, c.Size)
	conv := o.do("conv2d", func() (*G.Node, error) {
		return G.Conv2d(img, w, tensor.Shape{convKernel, convKernel}, []int{1, 1}, []int{1, 1}, []int{1, 1})
	})
	act := o.relu(o.bcastAdd(conv, b, 0, 2, 3))
	// Not G.MaxPool2D: its gradient reads an argmax mask that the op keeps
	// from its last forward run, which breaks with several micro-batches in
	// flight (see pool.go).
	pooled := o.do("max pool", func() (*G.Node, error) { return maxPool2x2(act) })
	out := o.reshape(pooled, batch, c.Out*p*p)
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", c.name, o.err)
	}
	return Built{Out: out, Params: []*G.Node{w, b}}, nil
}
