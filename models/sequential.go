package models

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// The sequential family: a classifier written in the config as a list of
// layer entries, model.stack, each a map with a type and that type's own
// fields. The list is called stack because model.layers is already the
// transformers' block count (a field of Spec every family shares).
//
// The stack is cut into units, the layers stages[i].layers counts: each
// top-level entry with parameters (linear, conv2d, a norm, a residual group)
// starts one and holds the entries without parameters after it (activations,
// pools, flatten), as a Keras Dense layer holds its activation; the entries
// before the first with parameters join the first unit. A residual entry
// with repeat: N is N entries, each with its own weights: repeated blocks
// are what a pipeline spreads over its stages. Units pass (batch, features)
// between them, flattened, as the cnn's layers do; inside a unit an
// activation has the example shape the stack gives it, (channels, height,
// width) for an image.
//
// Parameters are named after the PyTorch nn.Sequential holding the same
// stack: entry i's are i.weight, entry j of a residual group i.j.weight
// (the group being a module that subclasses nn.Sequential and adds its
// input), and pipetrain's are the same with "stack" before them; unit
// stack<i> is the one whose entry i has parameters.

func init() {
	// The types first: the family's doc lists them.
	for _, t := range []SeqType{
		{Name: "linear", Parse: parseLinear},
		{Name: "conv2d", Parse: parseConv2d},
		{Name: "maxpool", Parse: parseMaxPool},
		{Name: "avgpool", Parse: parseAvgPool},
		{Name: "flatten", Parse: func(*SeqEntry) SeqLayer { return seqFlatten{} }},
		{Name: "layernorm", Parse: func(*SeqEntry) SeqLayer { return seqLayerNorm{} }},
		{Name: "rmsnorm", Parse: parseRMSNorm},
		{Name: "dropout", Parse: parseDropout},
	} {
		RegisterSeqType(t)
	}
	for _, a := range seqActivations {
		RegisterSeqType(SeqType{Name: a.name, Parse: func(*SeqEntry) SeqLayer { return a }})
	}
	Register(family{name: "sequential", build: buildSequential, doc: FamilyDoc{
		Summary: "a stack of layers written in the config",
		Keys: []KeyDoc{
			{Key: "input", Doc: "Features of an example."},
			{Key: "input_shape", Type: "array", Doc: "The example's shape as the first layer takes it, e.g. [1, 28, 28] (channels, height, width) for a convolution; its product is input. Default [input]."},
			{Key: "classes", Doc: classesDoc},
			{Key: "stack", Type: "array", Doc: "The layers, in order: each a map with type (" + strings.Join(SeqTypes(), ", ") + ") and that type's fields (docs/models.md lists them); the last emits model.classes logits. Each entry with parameters and the entries without after it are a unit a stage can hold; a residual entry with repeat: N is N entries."},
		},
	}})
}

// SeqType is a kind of entry of a sequential model's stack, which entries
// name in their type field. Types register themselves with RegisterSeqType
// in an init function, as the built-in ones do; a program outside pipetrain
// registers its own the same way.
type SeqType struct {
	Name string
	// Parse reads the entry's fields with e's getters, which report every
	// missing or wrong field by its path (model.stack[2].out), and returns
	// the layer; what it returns when e has problems is not used.
	Parse func(e *SeqEntry) SeqLayer
}

// SeqLayer is one entry of a stack, a function of one input.
type SeqLayer interface {
	// OutShape is the shape of one example's output for one of shape in
	// (neither with the batch), or an error saying why the layer cannot
	// take in.
	OutShape(in []int) ([]int, error)
	// Params are the layer's parameters for input shape in, in the order
	// Forward takes them; none for a function without.
	Params(in []int) []SeqParam
	// Forward adds the layer's ops for x, (batch, in...), to g. It must
	// add the same ops whenever it is called (a zero-bubble schedule calls
	// it again to compute weight gradients) and keep no state between
	// runs (several micro-batches are in flight). Nor may its ops change a
	// tensor's shape in place, as gorgonia's Reshape and Conv2d do: a stage
	// keeps its tensors from one micro-batch to the next.
	Forward(g *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error)
}

// SeqParam is one parameter of a SeqLayer.
type SeqParam struct {
	// Name is the PyTorch module's name of it, "weight" or "bias".
	Name string
	// Shape is pipetrain's layout.
	Shape []int
	// Transpose says PyTorch holds the transpose of this 2-D weight.
	Transpose bool
	// Init is the initial value, drawn from r alone, so that a layer starts
	// with the same weights whichever stage builds it.
	Init func(dt tensor.Dtype, r *rand.Rand) *tensor.Dense
}

var seqTypes = map[string]SeqType{}

// RegisterSeqType adds an entry type under its name, replacing one
// registered before. Like Register, it is for init functions. The name
// residual is the stack's own group and cannot be registered.
func RegisterSeqType(t SeqType) {
	if t.Name == seqResidual {
		panic("models: " + seqResidual + " is the sequential stack's own entry type")
	}
	seqTypes[t.Name] = t
}

// SeqTypes lists the entry types a stack may give, residual included,
// sorted.
func SeqTypes() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for n := range seqTypes {
			if !yield(n) {
				return
			}
		}
		yield(seqResidual)
	})
}

// seqResidual is the type of a group whose output is its input plus its
// own stack's output.
const seqResidual = "residual"

// SeqEntry is one entry of a stack as its type parses it.
type SeqEntry struct {
	path   string // "stack[2]", "stack[3].stack[0]"
	fields map[string]any
	read   map[string]bool
	check  *specCheck
}

// Path is the entry's place in the model section, e.g. "stack[2]".
func (e *SeqEntry) Path() string { return e.path }

// Fail reports a problem with field key of the entry, or with the entry
// itself when key is "".
func (e *SeqEntry) Fail(key, format string, args ...any) {
	f := e.path
	if key != "" {
		f += "." + key
	}
	e.check.add(f, format, args...)
}

// value marks key read and returns its value.
func (e *SeqEntry) value(key string) (any, bool) {
	e.read[key] = true
	v, ok := e.fields[key]
	return v, ok && v != nil
}

// Int is the integer field key, def when absent; a value below lo is
// reported, as is an absent field whose def is below lo (a required one).
func (e *SeqEntry) Int(key string, def, lo int) int {
	v, ok := e.value(key)
	if !ok {
		if def < lo {
			e.Fail(key, "missing: give an integer of at least %d", lo)
		}
		return def
	}
	n, isInt := intOf(v)
	switch {
	case !isInt:
		e.Fail(key, "%v is not an integer", v)
	case n < lo:
		e.Fail(key, "must be at least %d, got %d", lo, n)
	}
	return n
}

// Float is the positive number field key, def when absent.
func (e *SeqEntry) Float(key string, def float64) float64 {
	f, ok := e.number(key, def)
	if ok && !(f > 0) {
		e.Fail(key, "must be positive, got %v", f)
	}
	return f
}

// Fraction is the field key in [0, 1), a probability such as dropout's,
// def when absent.
func (e *SeqEntry) Fraction(key string, def float64) float64 {
	f, ok := e.number(key, def)
	if ok && !(f >= 0 && f < 1) {
		e.Fail(key, "must be in [0, 1), got %v", f)
	}
	return f
}

// number is the numeric field key, def when absent; ok is false when the
// field is absent or not a number (reported).
func (e *SeqEntry) number(key string, def float64) (f float64, ok bool) {
	v, ok := e.value(key)
	if !ok {
		return def, false
	}
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	}
	n, isInt := intOf(v)
	if !isInt {
		e.Fail(key, "%v is not a number", v)
		return def, false
	}
	return float64(n), true
}

// Bool is the boolean field key, def when absent.
func (e *SeqEntry) Bool(key string, def bool) bool {
	v, ok := e.value(key)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		e.Fail(key, "%v is not a boolean", v)
		return def
	}
	return b
}

// intOf reads an integer as YAML (int) or JSON (an integral float64, as an
// export's recorded model spec holds it) gives it.
func intOf(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		return int(x), true
	case uint64:
		return int(x), true
	case float64:
		if x == float64(int(x)) {
			return int(x), true
		}
	}
	return 0, false
}

// seqNode is a parsed entry: a leaf layer or a residual group, with the
// example shapes it takes and gives once inferred.
type seqNode struct {
	path    string
	kind    string
	layer   SeqLayer  // nil for a residual group
	body    []seqNode // a residual group's stack, repeats expanded
	in, out []int
}

// parseStack parses a list of entries at path, expanding each residual
// group's repeats in place.
func parseStack(check *specCheck, path string, v any) []seqNode {
	list, ok := v.([]any)
	if !ok {
		check.add(path, "a %s, want a list of layer entries, each a map with a type", typeWord(v))
		return nil
	}
	if len(list) == 0 {
		check.add(path, "empty; give at least one layer entry")
	}
	var out []seqNode
	for i, raw := range list {
		n, repeat := parseEntry(check, fmt.Sprintf("%s[%d]", path, i), raw)
		for range repeat {
			out = append(out, n)
		}
	}
	return out
}

// typeWord names a YAML value's kind in messages.
func typeWord(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case []any:
		return "list"
	case map[string]any, map[any]any:
		return "map"
	}
	return "number"
}

// parseEntry parses one entry and says how many times it repeats.
func parseEntry(check *specCheck, path string, raw any) (seqNode, int) {
	fields, ok := entryFields(raw)
	if !ok {
		check.add(path, "a %s, want a map with a type, e.g. {type: linear, out: 64}", typeWord(raw))
		return seqNode{path: path}, 0
	}
	e := &SeqEntry{path: path, fields: fields, read: map[string]bool{}, check: check}
	kind, _ := e.value("type")
	name, _ := kind.(string)
	n := seqNode{path: path, kind: name}
	repeat := 1
	switch t, known := seqTypes[name]; {
	case name == seqResidual:
		repeat = e.Int("repeat", 1, 1)
		body, _ := e.value("stack")
		n.body = parseStack(check, path+".stack", body)
	case known:
		n.layer = t.Parse(e)
	case kind == nil:
		e.Fail("type", "missing: give one of %s", strings.Join(SeqTypes(), ", "))
		return n, 0
	default:
		e.Fail("type", "unknown layer type %v (known: %s)", kind, strings.Join(SeqTypes(), ", "))
		return n, 0
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !e.read[k] {
			e.Fail(k, "unknown field of a %s entry", name)
		}
	}
	return n, repeat
}

// entryFields is an entry's map with lower-case keys, as configs match keys
// without regard to case.
func entryFields(raw any) (map[string]any, bool) {
	out := map[string]any{}
	switch m := raw.(type) {
	case map[string]any:
		for k, v := range m {
			out[strings.ToLower(k)] = v
		}
	case map[any]any:
		for k, v := range m {
			out[strings.ToLower(fmt.Sprint(k))] = v
		}
	default:
		return nil, false
	}
	return out, true
}

// inferShapes sets each node's shapes from in, reporting the first node
// that cannot take its input (the shapes after it are unknown), and returns
// the list's output shape.
func inferShapes(check *specCheck, nodes []seqNode, in []int) ([]int, bool) {
	for i := range nodes {
		n := &nodes[i]
		n.in = in
		if n.layer == nil {
			out, ok := inferShapes(check, n.body, in)
			if !ok {
				return nil, false
			}
			if !slices.Equal(out, in) {
				check.add(n.path, "the residual group's stack maps %s to %s; it must keep its input's shape, which it is added to", shapeString(in), shapeString(out))
				return nil, false
			}
			n.out = in
		} else {
			out, err := n.layer.OutShape(in)
			if err != nil {
				check.add(n.path, "%s on input %s: %v", n.kind, shapeString(in), err)
				return nil, false
			}
			n.out = out
		}
		in = n.out
	}
	return in, true
}

// shapeString writes an example shape as 16x7x7.
func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, "x")
}

func buildSequential(spec Spec) (*Model, error) {
	var check specCheck
	dt := check.dtype(spec.DType)
	check.atLeast("input", spec.Input, 1)
	check.atLeast("classes", spec.Classes, 2)
	var own struct {
		InputShape []int `json:"input_shape"`
	}
	if err := DecodeOwn(Spec{Own: map[string]any{"input_shape": spec.Own["input_shape"]}}, &own); err != nil {
		check.errs = append(check.errs, err.(SpecErrors)...)
	}
	in := []int{spec.Input}
	if own.InputShape != nil {
		for i, d := range own.InputShape {
			check.atLeast(fmt.Sprintf("input_shape[%d]", i), d, 1)
		}
		if p := tensor.Shape(own.InputShape).TotalSize(); len(own.InputShape) == 0 || p != spec.Input {
			check.add("input_shape", "%v holds %d features, model.input %d", own.InputShape, p, spec.Input)
		}
		in = own.InputShape
	}
	nodes := parseStack(&check, "stack", spec.Own["stack"])
	if len(check.errs) == 0 {
		if out, ok := inferShapes(&check, nodes, in); ok && !slices.Equal(out, []int{spec.Classes}) {
			check.add("stack", "the last layer emits %s per example; a classifier of %d classes needs %d logits", shapeString(out), spec.Classes, spec.Classes)
		}
	}
	var units []*seqUnit
	if len(check.errs) == 0 {
		if units = groupUnits(nodes, dt); len(units) == 0 {
			check.add("stack", "no entry has parameters: give at least one linear, conv2d or norm")
		}
	}
	if err := check.err(); err != nil {
		return nil, err
	}
	m := &Model{Spec: spec, DType: dt, Example: tensor.Shape{spec.Input}, Classes: spec.Classes}
	for _, u := range units {
		m.Layers = append(m.Layers, u)
	}
	return m, nil
}

// seqUnit is a Layer: one top-level entry with parameters and the entries
// without that follow it (the ones before the first such entry join the
// first unit). An engine cannot split the backward of a stage part without
// parameters, and the planner measures each unit alone, so every unit has
// some.
type seqUnit struct {
	name  string // "stack<i>", i the index of its entry with parameters
	first int    // the index of its first entry in the expanded stack
	nodes []seqNode
	dt    tensor.Dtype
	// parts are the leaves with parameters, in Build's order, with their
	// PyTorch names' prefixes ("7.", "9.1.").
	parts []seqPart
}

type seqPart struct {
	node *seqNode
	path string
}

// hasParams reports whether n or an entry of its stack has parameters.
func hasParams(n *seqNode) bool {
	if n.layer != nil {
		return len(n.layer.Params(n.in)) > 0
	}
	return slices.ContainsFunc(n.body, func(c seqNode) bool { return hasParams(&c) })
}

// groupUnits cuts the expanded stack into units, none if no entry has
// parameters.
func groupUnits(nodes []seqNode, dt tensor.Dtype) []*seqUnit {
	var out []*seqUnit
	lead := 0 // entries without parameters before the first with
	for i := range nodes {
		switch {
		case hasParams(&nodes[i]):
			first := i - lead
			lead = 0
			out = append(out, &seqUnit{name: fmt.Sprintf("stack%d", i), first: first, nodes: nodes[first : i+1], dt: dt})
		case len(out) == 0:
			lead++
		default:
			u := out[len(out)-1]
			u.nodes = nodes[u.first : i+1]
		}
	}
	for _, u := range out {
		var walk func(n *seqNode, path string)
		walk = func(n *seqNode, path string) {
			if n.layer != nil {
				if len(n.layer.Params(n.in)) > 0 {
					u.parts = append(u.parts, seqPart{n, path})
				}
				return
			}
			for j := range n.body {
				walk(&n.body[j], fmt.Sprintf("%s%d.", path, j))
			}
		}
		for j := range u.nodes {
			walk(&u.nodes[j], fmt.Sprintf("%d.", u.first+j))
		}
	}
	return out
}

func (u *seqUnit) Name() string { return u.name }

func (u *seqUnit) in() []int  { return u.nodes[0].in }
func (u *seqUnit) out() []int { return u.nodes[len(u.nodes)-1].out }

func (u *seqUnit) OutShape(in tensor.Shape) tensor.Shape {
	return tensor.Shape{in[0], tensor.Shape(u.out()).TotalSize()}
}

// Described is a layer that says in a line what it is, for pipetrain
// validate to list under its stage: a sequential unit names its stack
// entries and the example shapes it takes and gives.
type Described interface {
	Layer
	Describe() string
}

// Describe: "stack[0] conv2d, stack[1] relu, stack[2] maxpool: 1x28x28 -> 8x14x14".
func (u *seqUnit) Describe() string {
	entries := make([]string, len(u.nodes))
	for i, n := range u.nodes {
		entries[i] = n.path + " " + n.kind
	}
	return fmt.Sprintf("%s: %s -> %s", strings.Join(entries, ", "), shapeString(u.in()), shapeString(u.out()))
}

func (u *seqUnit) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	batch := x.Shape()[0]
	o := newOps(u.dt)
	h := x
	if len(u.in()) > 1 {
		h = o.reshapeCopy(x, append([]int{batch}, u.in()...)...)
	}
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", u.name, o.err)
	}
	var b Built
	for j := range u.nodes {
		var err error
		if h, err = u.forward(g, &u.nodes[j], fmt.Sprintf("%d.", u.first+j), h, seed, &b); err != nil {
			return Built{}, fmt.Errorf("%s (model.%s): %w", u.name, u.nodes[j].path, err)
		}
	}
	if len(u.out()) > 1 {
		h = o.reshapeCopy(h, batch, tensor.Shape(u.out()).TotalSize())
	}
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", u.name, o.err)
	}
	b.Out = h
	return b, nil
}

// forward adds node n, whose parameters' PyTorch names start with path, to
// g, appending its parameters and parts to b.
func (u *seqUnit) forward(g *G.ExprGraph, n *seqNode, path string, x *G.Node, seed uint64, b *Built) (*G.Node, error) {
	if n.layer == nil {
		h := x
		for j := range n.body {
			var err error
			if h, err = u.forward(g, &n.body[j], fmt.Sprintf("%s%d.", path, j), h, seed, b); err != nil {
				return nil, err
			}
		}
		return G.Add(x, h)
	}
	var params []*G.Node
	for _, p := range n.layer.Params(n.in) {
		value := p.Init(u.dt, paramRNG(seed, "stack", path+p.Name))
		params = append(params, newParam(g, "stack"+path+p.Name, value))
	}
	var out *G.Node
	var err error
	if d, ok := n.layer.(SeqDrawing); ok {
		out, err = u.forwardDrawing(g, d, path, x, len(params), seed, b)
	} else {
		out, err = n.layer.Forward(g, x, params)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.path, err)
	}
	if len(params) > 0 {
		b.Params = append(b.Params, params...)
		b.Parts = append(b.Parts, Part{In: x, Tap: out, Params: params})
	}
	return out, nil
}

// forwardDrawing adds a leaf that draws random numbers, its stream the
// module path (path "9.1." is [9, 1]); the unit's leaves share one key,
// b.Draws, which the engine sets before each run.
func (u *seqUnit) forwardDrawing(g *G.ExprGraph, d SeqDrawing, path string, x *G.Node, params int, seed uint64, b *Built) (*G.Node, error) {
	if params > 0 {
		return nil, fmt.Errorf("a layer that draws random numbers cannot have parameters (%d)", params)
	}
	var layer []int
	for _, s := range strings.Split(strings.TrimSuffix(path, "."), ".") {
		i, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("module path %q: %w", path, err)
		}
		layer = append(layer, i)
	}
	if b.Draws == nil {
		b.Draws = &DrawKey{}
	}
	return d.ForwardDrawing(g, x, Drawer{Key: b.Draws, Seed: seed, Layer: layer})
}

// BuildPart: each leaf with parameters is a part, its tap the leaf's output.
func (u *seqUnit) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i < 0 || i >= len(u.parts) {
		return nil, fmt.Errorf("%s: part %d of %d", u.name, i, len(u.parts))
	}
	return u.parts[i].node.layer.Forward(g, x, params)
}

// LinearWeight: a linear leaf is x·W (+ b).
func (u *seqUnit) LinearWeight(i int) (int, bool, bool) {
	if i < 0 || i >= len(u.parts) {
		return 0, false, false
	}
	_, ok := u.parts[i].node.layer.(seqLinear)
	return 0, false, ok
}

// TorchParams: the nn.Sequential's state_dict names, pipetrain's being
// "stack" and the same.
func (u *seqUnit) TorchParams() []TorchParam {
	var out []TorchParam
	for _, p := range u.parts {
		for _, sp := range p.node.layer.Params(p.node.in) {
			out = append(out, TorchParam{Name: "stack" + p.path + sp.Name, Torch: p.path + sp.Name, Shape: sp.Shape, Transpose: sp.Transpose})
		}
	}
	return out
}

// ---- the built-in entry types ----

// features is the width of a flat example shape, or an error for another.
func features(in []int) (int, error) {
	if len(in) != 1 {
		return 0, fmt.Errorf("takes flat features, got %s: put a flatten before it", shapeString(in))
	}
	return in[0], nil
}

// image is the (channels, height, width) of an image shape, or an error.
func image(in []int) (c, h, w int, err error) {
	if len(in) != 3 {
		return 0, 0, 0, fmt.Errorf("takes an image (channels x height x width), got %s: give model.input_shape", shapeString(in))
	}
	return in[0], in[1], in[2], nil
}

// seqLinear is x·W + b, W [in, out] (nn.Linear's weight transposed).
type seqLinear struct {
	out  int
	bias bool
}

func parseLinear(e *SeqEntry) SeqLayer {
	return seqLinear{out: e.Int("out", 0, 1), bias: e.Bool("bias", true)}
}

func (l seqLinear) OutShape(in []int) ([]int, error) {
	_, err := features(in)
	return []int{l.out}, err
}

func (l seqLinear) Params(in []int) []SeqParam {
	n := in[0]
	ps := []SeqParam{{Name: "weight", Shape: []int{n, l.out}, Transpose: true, Init: func(dt tensor.Dtype, r *rand.Rand) *tensor.Dense {
		return glorotUniform(dt, tensor.Shape{n, l.out}, n, l.out, r)
	}}}
	if l.bias {
		ps = append(ps, SeqParam{Name: "bias", Shape: []int{l.out}, Init: constParam(l.out, 0)})
	}
	return ps
}

// Forward is Dense's part: the same product and bias add.
func (l seqLinear) Forward(g *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error) {
	xw, err := G.Mul(x, params[0])
	if err != nil || !l.bias {
		return xw, err
	}
	o := newOps(x.Dtype())
	y := o.biasAdd(xw, params[1])
	return y, o.err
}

// constParam initialises a vector of n entries v (biases, gains).
func constParam(n int, v float64) func(tensor.Dtype, *rand.Rand) *tensor.Dense {
	return func(dt tensor.Dtype, _ *rand.Rand) *tensor.Dense { return constInit(dt, tensor.Shape{n}, v) }
}

// seqConv is nn.Conv2d with bias: square kernel, stride and zero padding.
type seqConv struct{ out, kernel, stride, padding int }

func parseConv2d(e *SeqEntry) SeqLayer {
	return seqConv{out: e.Int("out", 0, 1), kernel: e.Int("kernel", 3, 1), stride: e.Int("stride", 1, 1), padding: e.Int("padding", 0, 0)}
}

func (l seqConv) OutShape(in []int) ([]int, error) {
	_, h, w, err := image(in)
	if err != nil {
		return nil, err
	}
	if h+2*l.padding < l.kernel || w+2*l.padding < l.kernel {
		return nil, fmt.Errorf("a %dx%d kernel does not fit a %dx%d image padded by %d", l.kernel, l.kernel, h, w, l.padding)
	}
	side := func(n int) int { return (n+2*l.padding-l.kernel)/l.stride + 1 }
	return []int{l.out, side(h), side(w)}, nil
}

func (l seqConv) Params(in []int) []SeqParam {
	c, k := in[0], l.kernel
	shape := []int{l.out, c, k, k}
	return []SeqParam{
		{Name: "weight", Shape: shape, Init: func(dt tensor.Dtype, r *rand.Rand) *tensor.Dense {
			return glorotUniform(dt, shape, c*k*k, l.out*k*k, r)
		}},
		{Name: "bias", Shape: []int{l.out}, Init: constParam(l.out, 0)},
	}
}

// Forward is one fused op, convolution and bias.
func (l seqConv) Forward(g *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error) {
	o := newOps(x.Dtype())
	y := o.conv2d(x, params[0], params[1], l.stride, l.padding)
	return y, o.err
}

// seqMaxPool is pool.go's 2x2, stride-2 max pool.
type seqMaxPool struct{}

func parseMaxPool(e *SeqEntry) SeqLayer {
	if k := e.Int("kernel", 2, 2); k != 2 {
		e.Fail("kernel", "max pooling takes 2x2 windows (stride 2) only, got %d", k)
	}
	return seqMaxPool{}
}

func (seqMaxPool) OutShape(in []int) ([]int, error) {
	c, h, w, err := image(in)
	if err == nil && (h < 2 || w < 2) {
		err = fmt.Errorf("a %dx%d image is too small for a 2x2 window", h, w)
	}
	return []int{c, h / 2, w / 2}, err
}

func (seqMaxPool) Params([]int) []SeqParam { return nil }

func (seqMaxPool) Forward(_ *G.ExprGraph, x *G.Node, _ []*G.Node) (*G.Node, error) {
	return maxPool2x2(x)
}

// seqAvgPool averages k x k windows with stride k, an odd edge dropped, as
// nn.AvgPool2d(k) does.
type seqAvgPool struct{ k int }

func parseAvgPool(e *SeqEntry) SeqLayer { return seqAvgPool{e.Int("kernel", 2, 1)} }

func (l seqAvgPool) OutShape(in []int) ([]int, error) {
	c, h, w, err := image(in)
	if err == nil && (h < l.k || w < l.k) {
		err = fmt.Errorf("a %dx%d image is too small for a %dx%d window", h, w, l.k, l.k)
	}
	return []int{c, h / l.k, w / l.k}, err
}

func (seqAvgPool) Params([]int) []SeqParam { return nil }

func (l seqAvgPool) Forward(_ *G.ExprGraph, x *G.Node, _ []*G.Node) (*G.Node, error) {
	o := newOps(x.Dtype())
	y := o.fused(avgPoolOp[float32](l.k), avgPoolOp[float64](l.k), x)
	return y, o.err
}

// seqFlatten makes an example flat features, as nn.Flatten does.
type seqFlatten struct{}

func (seqFlatten) OutShape(in []int) ([]int, error) {
	return []int{tensor.Shape(in).TotalSize()}, nil
}

func (seqFlatten) Params([]int) []SeqParam { return nil }

func (seqFlatten) Forward(_ *G.ExprGraph, x *G.Node, _ []*G.Node) (*G.Node, error) {
	if x.Dims() == 2 {
		return x, nil
	}
	o := newOps(x.Dtype())
	s := x.Shape()
	y := o.reshapeCopy(x, s[0], s.TotalSize()/s[0])
	return y, o.err
}

// seqLayerNorm is nn.LayerNorm over the features (eps 1e-5, PyTorch's
// default), the GPT's fused op.
type seqLayerNorm struct{}

func (seqLayerNorm) OutShape(in []int) ([]int, error) {
	_, err := features(in)
	return in, err
}

func (seqLayerNorm) Params(in []int) []SeqParam {
	return []SeqParam{{Name: "weight", Shape: []int{in[0]}, Init: constParam(in[0], 1)}, {Name: "bias", Shape: []int{in[0]}, Init: constParam(in[0], 0)}}
}

func (seqLayerNorm) Forward(_ *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error) {
	o := newOps(x.Dtype())
	y := o.layerNorm(x, params[0], params[1])
	return y, o.err
}

// seqRMSNorm is nn.RMSNorm over the features, the Llama's fused op.
type seqRMSNorm struct{ eps float64 }

func parseRMSNorm(e *SeqEntry) SeqLayer { return seqRMSNorm{e.Float("eps", 1e-6)} }

func (seqRMSNorm) OutShape(in []int) ([]int, error) {
	_, err := features(in)
	return in, err
}

func (seqRMSNorm) Params(in []int) []SeqParam {
	return []SeqParam{{Name: "weight", Shape: []int{in[0]}, Init: constParam(in[0], 1)}}
}

func (l seqRMSNorm) Forward(_ *G.ExprGraph, x *G.Node, params []*G.Node) (*G.Node, error) {
	o := newOps(x.Dtype())
	y := o.rmsNorm(x, params[0], l.eps)
	return y, o.err
}

// seqActivation is an element-wise function; the fused ones (gelu, silu)
// take rows, so an image is viewed as one row per example around them.
type seqActivation struct {
	name string
	f    func(o *ops, x *G.Node) *G.Node
}

var seqActivations = []seqActivation{
	{"relu", (*ops).relu},
	{"gelu", (*ops).gelu},
	{"silu", (*ops).silu},
	{"tanh", (*ops).tanh},
	{"sigmoid", func(o *ops, x *G.Node) *G.Node {
		return o.do("sigmoid", func() (*G.Node, error) { return G.Sigmoid(x) })
	}},
}

func (a seqActivation) OutShape(in []int) ([]int, error) { return in, nil }

func (seqActivation) Params([]int) []SeqParam { return nil }

func (a seqActivation) Forward(_ *G.ExprGraph, x *G.Node, _ []*G.Node) (*G.Node, error) {
	o := newOps(x.Dtype())
	s := x.Shape().Clone()
	rows := a.name == "gelu" || a.name == "silu"
	h := x
	if rows && x.Dims() != 2 {
		h = o.reshapeCopy(x, s[0], s.TotalSize()/s[0])
	}
	y := a.f(o, h)
	if rows && x.Dims() != 2 {
		y = o.reshapeCopy(y, s...)
	}
	return y, o.err
}
