// Package models holds pipetrain's model zoo: a registry from the model names used
// in configs to families (Family), each of which validates its part of the config's
// model section and builds a model as an ordered list of layers. A stage builds
// only its own contiguous range of layers into its gorgonia graph.
package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Spec is the model section of a config: a registered name and its sizes.
type Spec struct {
	Name       string `mapstructure:"name" json:"name"`
	DType      string `mapstructure:"dtype" json:"dtype"`
	Input      int    `mapstructure:"input" json:"input"`
	Hidden     []int  `mapstructure:"hidden" json:"hidden"`
	Classes    int    `mapstructure:"classes" json:"classes"`
	Activation string `mapstructure:"activation" json:"activation"`

	// Transformer sizes (models "gpt" and "llama"): blocks, model width, attention heads,
	// tokens per example and vocabulary size; TieEmbeddings makes the LM head
	// use the token embedding matrix (see Model.Tied).
	Layers        int  `mapstructure:"layers" json:"layers,omitempty"`
	Width         int  `mapstructure:"width" json:"width,omitempty"`
	Heads         int  `mapstructure:"heads" json:"heads,omitempty"`
	Context       int  `mapstructure:"context" json:"context,omitempty"`
	Vocab         int  `mapstructure:"vocab" json:"vocab,omitempty"`
	TieEmbeddings bool `mapstructure:"tie_embeddings" json:"tie_embeddings,omitempty"`

	// Channels are the output channels of each conv layer (model "cnn").
	Channels []int `mapstructure:"channels" json:"channels,omitempty"`

	// From is a Hugging Face checkpoint directory whose config.json sets
	// the other keys (configs resolves it with SpecFromHF).
	From string `mapstructure:"from" json:"from,omitempty"`

	// Own holds the keys of the section that are none of the fields above:
	// the keys a family reads that no other does (KeyDoc with a Type),
	// which it decodes itself with DecodeOwn. A config refuses every other
	// key by name.
	Own map[string]any `mapstructure:",remain" json:"own,omitempty"`
}

// Layer is one unit a config can place on a stage. Build adds the layer's ops to a
// stage's graph; parameters are created by Build and initialised from the run's seed
// and the layer's global index, so a layer starts with the same weights whichever
// stage builds it.
type Layer interface {
	// Name is the layer's global name, e.g. "fc2"; parameter names start with it.
	Name() string
	// OutShape is the shape of the layer's output for a micro-batch of the given input shape.
	OutShape(in tensor.Shape) tensor.Shape
	// Build adds the layer's forward ops for input x, creating its parameters.
	Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error)
}

// RecomputingInternals is a layer that can keep less for its backward:
// RecomputingInternals returns the same layer, with the same parameters and
// the same results bit for bit, whose backward computes again the internals
// that take the most memory (attention's probabilities) instead of keeping
// them from the forward: selective activation recomputation.
type RecomputingInternals interface {
	Layer
	RecomputingInternals() Layer
}

// Built is what a layer added to a graph.
type Built struct {
	Out    *G.Node
	Params []*G.Node
	// Parts are, for a Splittable layer, its parameterised parts, in the
	// order BuildPart numbers them; every parameter is in exactly one.
	Parts []Part
	// Draws, for a layer whose ops draw random numbers in training
	// (dropout), is where they read which run they draw for, forward and
	// backward: whoever runs the graph sets it before each run (the engine,
	// from what the runtime tells it). nil for a layer that draws none; a
	// graph whose Draws nobody sets draws nothing, as evaluation wants.
	Draws *DrawKey
}

// Part is one parameterised part of a layer, Tap = f(In, Params): with In, the
// gradient of Tap determines the gradient of each of Params. In may be the
// layer's input or any node of the layer (another part's Tap, or what a
// parameterless op made of one); parts may share it.
type Part struct {
	In, Tap *G.Node
	Params  []*G.Node
}

// Splittable layers can compute their weight gradients apart from their input
// gradient, as zero-bubble schedules need: the parameter gradients of each
// part (Built.Parts) depend only on its input and the gradient of its tap,
// never on another part's forward values, so a program that holds just those
// two per part computes them without rerunning the layer's forward. It
// rebuilds each part with BuildPart and differentiates it, so BuildPart must
// add the ops Build added for that part: then the program computes each
// weight gradient with the ops of the layer's own backward, in the same
// order, and gives the same bits.
type Splittable interface {
	Layer
	// BuildPart adds part i of Built.Parts to g again, tap = f(x, params),
	// with params created by the caller in the shapes and order of that
	// part's Params.
	BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error)
}

// LinearWeights is implemented by Splittable layers some of whose parts
// are a product with a weight, Tap = In·W or In·Wᵀ, plus terms in the
// part's other parameters (a bias). W's gradient is then one product of In
// and the tap's gradient, which the engine sums straight into W's summed
// gradient instead of computing each micro-batch's apart and adding it.
type LinearWeights interface {
	Splittable
	// LinearWeight reports whether part i is such a product, with the
	// index of W in the part's Params, and whether the product is with Wᵀ.
	LinearWeight(i int) (w int, transposed, ok bool)
}

// FreshValues is implemented by layers whose ops must not write into the
// tensors a compiled program kept from its previous run: gorgonia's im2col
// (convolutions) fills a preallocated output whose shape a later op changed in
// place. A stage holding such a layer lets the program allocate anew each run.
type FreshValues interface {
	Layer
	FreshValues()
}

// Model is a built model description: its layers in order and the shape of one example.
type Model struct {
	Spec    Spec
	DType   tensor.Dtype
	Layers  []Layer
	Example tensor.Shape // shape of one input example, without the batch dimension
	Classes int

	// TargetsPerExample is how many classified rows one example yields: 1 for a
	// classifier, Context for a language model, which predicts every next token.
	// The logits and one-hot targets of a micro-batch of b examples are
	// (b*Targets(), Classes). Zero means 1.
	TargetsPerExample int
	// Tied lists pairs of parameter names that are one weight held twice, on
	// whichever stages own the two layers. Both start bit-identical; the runtime
	// must sum their gradients so that they stay so.
	Tied [][2]string
	// TiedShapes[i] is the shape of tied pair i's weight.
	TiedShapes [][]int
}

// Targets is TargetsPerExample with zero read as 1.
func (m *Model) Targets() int { return max(m.TargetsPerExample, 1) }

// SpecError is one problem of a Spec. Field is the key in the config's model
// section ("dtype", "hidden[1]"), so a config can report it as model.<Field>.
type SpecError struct {
	Field string
	Msg   string
}

func (e SpecError) Error() string { return "model." + e.Field + ": " + e.Msg }

// SpecErrors is every problem Build found in a Spec, in field order.
type SpecErrors []SpecError

func (e SpecErrors) Error() string {
	parts := make([]string, len(e))
	for i, p := range e {
		parts[i] = p.Error()
	}
	return strings.Join(parts, "; ")
}

// specCheck collects a builder's SpecErrors.
type specCheck struct{ errs SpecErrors }

func (c *specCheck) add(field, format string, args ...any) {
	c.errs = append(c.errs, SpecError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// atLeast reports field unless v >= lo.
func (c *specCheck) atLeast(field string, v, lo int) bool {
	if v < lo {
		c.add(field, "must be at least %d, got %d", lo, v)
		return false
	}
	return true
}

// dtype parses spec's dtype, reporting an unknown one.
func (c *specCheck) dtype(s string) tensor.Dtype {
	dt, err := ParseDType(s)
	if err != nil {
		c.add("dtype", "%v", err)
	}
	return dt
}

// layerName reports an empty layer name: parameters are named after it.
func layerName(c *specCheck, name string) {
	if name == "" {
		c.add("name", "empty; parameters are named after their layer")
	}
}

// layerDType checks a layer's dtype, the zero value meaning float32.
func layerDType(c *specCheck, dt tensor.Dtype) tensor.Dtype {
	for _, d := range dtypes {
		if d.dt == dt {
			return dt
		}
	}
	if dt == (tensor.Dtype{}) {
		return dtypes[0].dt
	}
	c.add("dtype", "%v is not one of %s", dt, strings.Join(DTypes(), ", "))
	return dt
}

// layerErr is nil when nothing was reported, else every problem of the
// layer spec, naming the layer.
func (c *specCheck) layerErr(kind, name string) error {
	if len(c.errs) == 0 {
		return nil
	}
	parts := make([]string, len(c.errs))
	for i, e := range c.errs {
		parts[i] = e.Field + ": " + e.Msg
	}
	return fmt.Errorf("%s layer %q: %s", kind, name, strings.Join(parts, "; "))
}

// err is nil when nothing was reported.
func (c *specCheck) err() error {
	if len(c.errs) == 0 {
		return nil
	}
	return c.errs
}

// dtypes are the dtype names a config may give, the default first.
var dtypes = []struct {
	name string
	dt   tensor.Dtype
}{{"float32", tensor.Float32}, {"float64", tensor.Float64}}

// DTypes lists the dtype names ParseDType accepts besides "" (float32).
func DTypes() []string {
	out := make([]string, len(dtypes))
	for i, d := range dtypes {
		out[i] = d.name
	}
	return out
}

// ParseDType maps a config dtype name to gorgonia's dtype.
func ParseDType(s string) (tensor.Dtype, error) {
	if s == "" {
		return dtypes[0].dt, nil
	}
	for _, d := range dtypes {
		if d.name == s {
			return d.dt, nil
		}
	}
	return tensor.Dtype{}, fmt.Errorf("unknown dtype %q (known: %s)", s, strings.Join(DTypes(), ", "))
}

// ShapeAt returns the shape of the activation entering layer i (i == len(Layers)
// gives the model's output) for micro-batches of mb examples.
func (m *Model) ShapeAt(i, mb int) tensor.Shape {
	s := append(tensor.Shape{mb}, m.Example...)
	for _, l := range m.Layers[:i] {
		s = l.OutShape(s)
	}
	return s
}

// paramRNG returns the deterministic generator for one parameter of one layer.
func paramRNG(seed uint64, layer string, param string) *rand.Rand {
	h := uint64(14695981039346656037)
	for _, c := range []byte(layer + "/" + param) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

// glorotUniform fills a new tensor with U(-a, a), a = sqrt(6/(fanIn+fanOut)).
func glorotUniform(dt tensor.Dtype, shape tensor.Shape, fanIn, fanOut int, r *rand.Rand) *tensor.Dense {
	a := math.Sqrt(6 / float64(fanIn+fanOut))
	n := shape.TotalSize()
	switch dt {
	case tensor.Float64:
		v := make([]float64, n)
		for i := range v {
			v[i] = (2*r.Float64() - 1) * a
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
	default:
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((2*r.Float64() - 1) * a)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
	}
}

// ParamCount counts the parameters of layers [first, last), building them
// once in a scratch graph: what a stage's gradients hold, known before any
// engine exists (the replicas' handshakes compare their all-reduce plans,
// the simulator charges the all-reduce).
func ParamCount(m *Model, first, last int) (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("counting the parameters of layers [%d, %d): %v", first, last, r)
		}
	}()
	g := G.NewGraph()
	in := m.ShapeAt(first, 1)
	h := G.NewTensor(g, m.DType, len(in), G.WithShape(in...), G.WithName("input"))
	for _, layer := range m.Layers[first:last] {
		b, err := layer.Build(g, h, 0)
		if err != nil {
			return 0, err
		}
		for _, p := range b.Params {
			n += p.Shape().TotalSize()
		}
		h = b.Out
	}
	return n, nil
}
