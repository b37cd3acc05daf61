package models

import (
	"errors"
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() {
	Register(family{name: "gpt", build: buildGPT, doc: FamilyDoc{
		Summary: "a GPT-style decoder, for dataset text",
		Keys: []KeyDoc{
			{Key: "layers", Doc: "Transformer blocks: the model's layers are embed, block0 to blockN-1, and head."},
			{Key: "width", Doc: "Model width, the embedding size."},
			{Key: "heads", Doc: "Attention heads; they must divide model.width."},
			{Key: "context", Doc: "Tokens per example."},
			{Key: "vocab", Doc: "Vocabulary size: 256 with the byte tokenizer, the corpus's symbol count with char."},
			{Key: "tie_embeddings", Doc: "Makes the LM head use the token embedding matrix; the two stages holding it keep both copies identical."},
		},
	}})
}

// gptInitSD is GPT-2's standard deviation for embeddings and projections.
const gptInitSD = 0.02

// maxGPTLayers bounds the block count, so a stray digit is an error, not a
// model that exhausts memory while being described.
const maxGPTLayers = 4096

// maxFloat32ID bounds the vocabulary in float32: token ids travel as floats,
// and float32 holds every integer below 2^24 exactly.
const maxFloat32ID = 1 << 24

// gptSizes are the validated sizes every GPT layer needs.
type gptSizes struct {
	layers, width, heads, context, vocab int
	tied                                 bool
	dt                                   tensor.Dtype
}

// buildGPT makes a GPT-2 style decoder: layer "embed" (token and learned
// position embeddings), blocks "block0".."blockN-1", and "head" (final
// LayerNorm and the LM head). An example is Context token ids; activations
// between layers are (batch*context, width), one row per token, so they travel
// as 2-D tensors like the MLP's.
func buildGPT(spec Spec) (*Model, error) {
	sz, err := gptSizesOf(spec)
	if err != nil {
		return nil, err
	}
	m := &Model{
		Spec: spec, DType: sz.dt, Example: tensor.Shape{sz.context},
		Classes: sz.vocab, TargetsPerExample: sz.context,
	}
	m.Layers = append(m.Layers, &gptEmbed{sz: sz})
	for i := 0; i < sz.layers; i++ {
		m.Layers = append(m.Layers, &gptBlock{name: fmt.Sprintf("block%d", i), sz: sz})
	}
	m.Layers = append(m.Layers, &gptHead{sz: sz})
	if sz.tied {
		m.Tied = [][2]string{{"embed.tok", "head.tok"}}
		m.TiedShapes = [][]int{{sz.vocab, sz.width}}
	}
	return m, nil
}

// gptSizesOf validates the spec; errors name the config field at fault.
// Input, Hidden, Classes and Activation are ignored: the classes are the
// vocabulary, and config defaults fill in the image classifiers' sizes.
func gptSizesOf(spec Spec) (gptSizes, error) {
	var check specCheck
	dt := check.dtype(spec.DType)
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", spec.Layers}, {"width", spec.Width}, {"heads", spec.Heads}, {"context", spec.Context}} {
		check.atLeast(f.name, f.v, 1)
	}
	if spec.Layers > maxGPTLayers {
		check.add("layers", "%d is more than %d blocks", spec.Layers, maxGPTLayers)
	}
	if check.atLeast("vocab", spec.Vocab, 2) && dt == tensor.Float32 && spec.Vocab > maxFloat32ID {
		check.add("vocab", "%d is too large for float32 token ids (at most %d)", spec.Vocab, maxFloat32ID)
	}
	if spec.Width >= 1 && spec.Heads >= 1 && spec.Width%spec.Heads != 0 {
		check.add("heads", "%d does not divide model.width %d", spec.Heads, spec.Width)
	}
	if err := check.err(); err != nil {
		return gptSizes{}, err
	}
	return gptSizes{
		layers: spec.Layers, width: spec.Width, heads: spec.Heads, context: spec.Context,
		vocab: spec.Vocab, tied: spec.TieEmbeddings, dt: dt,
	}, nil
}

// GPTSpec is what every GPT layer needs to know of its model, for
// NewGPTEmbed, NewGPTBlock and NewGPTHead: the sizes of model gpt's config
// section. Layers matters to every block, whose residual projections start
// smaller the deeper the model.
type GPTSpec struct {
	Layers, Width, Heads, Context, Vocab int
	// TieEmbeddings makes the head use a copy of the token table (see
	// Model.Tied, which a model composing these layers must then set).
	TieEmbeddings bool
	// DType is the dtype of parameters and activations; the zero value is
	// float32.
	DType tensor.Dtype
}

// gptSizesFor validates a GPTSpec as model gpt validates its section; errors
// name the layer and the field at fault.
func gptSizesFor(kind, name string, s GPTSpec) (gptSizes, error) {
	var check specCheck
	dt := layerDType(&check, s.DType)
	dtName := ""
	if len(check.errs) == 0 {
		dtName = dt.String()
	}
	sz, err := gptSizesOf(Spec{DType: dtName, Layers: s.Layers, Width: s.Width, Heads: s.Heads,
		Context: s.Context, Vocab: s.Vocab, TieEmbeddings: s.TieEmbeddings})
	var errs SpecErrors
	if errors.As(err, &errs) {
		check.errs = append(check.errs, errs...)
	}
	if err := check.layerErr(kind, name); err != nil {
		return gptSizes{}, err
	}
	return sz, nil
}

// NewGPTEmbed makes model gpt's layer "embed": token and learned position
// embeddings, (batch, context) token ids in, (batch*context, width) out.
func NewGPTEmbed(s GPTSpec) (Layer, error) {
	sz, err := gptSizesFor("gpt embedding", "embed", s)
	if err != nil {
		return nil, err
	}
	return &gptEmbed{sz: sz}, nil
}

// NewGPTBlock makes model gpt's block i of s.Layers, "block<i>": a pre-norm
// transformer block on (batch*context, width) activations.
func NewGPTBlock(i int, s GPTSpec) (Layer, error) {
	name := fmt.Sprintf("block%d", i)
	if i < 0 || i >= s.Layers {
		return nil, fmt.Errorf("gpt block layer %q: index %d outside the model's %d blocks", name, i, s.Layers)
	}
	sz, err := gptSizesFor("gpt block", name, s)
	if err != nil {
		return nil, err
	}
	return &gptBlock{name: name, sz: sz}, nil
}

// NewGPTHead makes model gpt's layer "head": the final LayerNorm and the LM
// head, (batch*context, width) in, (batch*context, vocab) logits out.
func NewGPTHead(s GPTSpec) (Layer, error) {
	sz, err := gptSizesFor("gpt head", "head", s)
	if err != nil {
		return nil, err
	}
	return &gptHead{sz: sz}, nil
}

// batchOf recovers the number of sequences from a (batch*context, width) input.
func (sz gptSizes) batchOf(x *G.Node, layer string) (int, error) {
	s := x.Shape()
	if s.Dims() != 2 || s[1] != sz.width || s[0]%sz.context != 0 {
		return 0, fmt.Errorf("%s: input shape %v, want (batch*%d, %d)", layer, s, sz.context, sz.width)
	}
	return s[0] / sz.context, nil
}

// gptEmbed maps token ids (batch, context) to tok[id] + pos[t], one row per token.
type gptEmbed struct{ sz gptSizes }

func (l *gptEmbed) Name() string { return "embed" }

func (l *gptEmbed) OutShape(in tensor.Shape) tensor.Shape {
	return tensor.Shape{in[0] * l.sz.context, l.sz.width}
}

func (l *gptEmbed) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	sz := l.sz
	if s := x.Shape(); s.Dims() != 2 || s[1] != sz.context {
		return Built{}, fmt.Errorf("embed: input shape %v, want (batch, %d) token ids", s, sz.context)
	}
	tok := newParam(g, "embed.tok", tokenTable(sz, seed))
	pos := newParam(g, "embed.pos", normalInit(sz.dt, tensor.Shape{sz.context, sz.width}, gptInitSD, paramRNG(seed, "embed", "pos")))
	params := []*G.Node{tok, pos}
	h, err := l.BuildPart(g, 0, x, params)
	if err != nil {
		return Built{}, err
	}
	return Built{Out: h, Params: params, Parts: []Part{{In: x, Tap: h, Params: params}}}, nil
}

// BuildPart is the whole layer, one part: its parameters' gradients need
// only the token ids and the output's gradient.
func (l *gptEmbed) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i != 0 || len(params) != 2 {
		return nil, fmt.Errorf("embed: part %d with %d parameters; the layer has one part of 2", i, len(params))
	}
	o := newOps(l.sz.dt)
	h := o.embed(x, params[0], params[1])
	if o.err != nil {
		return nil, fmt.Errorf("embed: %w", o.err)
	}
	return h, nil
}

// tokenTable is the initial (vocab, width) token embedding. A tied head builds
// its own copy from the same generator, so both start bit-identical.
func tokenTable(sz gptSizes, seed uint64) *tensor.Dense {
	return normalInit(sz.dt, tensor.Shape{sz.vocab, sz.width}, gptInitSD, paramRNG(seed, "embed", "tok"))
}

// gptBlock is a pre-norm transformer block:
// x + proj(attn(ln1(x))), then x + mlp(ln2(x)) with a GELU MLP of width 4*width.
type gptBlock struct {
	name string
	sz   gptSizes
	// recompute: attention keeps no probabilities for its backward, which
	// computes them again (selective recomputation, RecomputingInternals).
	recompute bool
}

func (l *gptBlock) Name() string { return l.name }

// RecomputingInternals is the block with attention's probabilities, context
// × context per head and token, recomputed in the backward instead of kept.
func (l *gptBlock) RecomputingInternals() Layer {
	c := *l
	c.recompute = true
	return &c
}

func (l *gptBlock) OutShape(in tensor.Shape) tensor.Shape { return in.Clone() }

// blockParams are a block's parameters in Build's (and Params') order.
type blockParams struct {
	ln1Gain, ln1Bias, q, qb, k, kb, v, vb, proj, projb *G.Node
	ln2Gain, ln2Bias, fc, fcb, out, outb               *G.Node
}

func (p *blockParams) list() []*G.Node {
	return []*G.Node{p.ln1Gain, p.ln1Bias, p.q, p.qb, p.k, p.kb, p.v, p.vb, p.proj, p.projb,
		p.ln2Gain, p.ln2Bias, p.fc, p.fcb, p.out, p.outb}
}

// params creates the block's parameters. The two projections that write into
// the residual stream start smaller, by 1/sqrt(2*layers) as in GPT-2, so the
// stream's variance does not grow with depth.
func (l *gptBlock) params(g *G.ExprGraph, seed uint64) *blockParams {
	sz := l.sz
	w, hid := sz.width, 4*sz.width
	residualSD := gptInitSD / math.Sqrt(float64(2*sz.layers))
	matrix := func(name string, rows, cols int, sd float64) *G.Node {
		return newParam(g, l.name+"."+name, normalInit(sz.dt, tensor.Shape{rows, cols}, sd, paramRNG(seed, l.name, name)))
	}
	vector := func(name string, n int, v float64) *G.Node {
		return newParam(g, l.name+"."+name, constInit(sz.dt, tensor.Shape{n}, v))
	}
	return &blockParams{
		ln1Gain: vector("ln1.gain", w, 1), ln1Bias: vector("ln1.bias", w, 0),
		q: matrix("attn.q.weight", w, w, gptInitSD), qb: vector("attn.q.bias", w, 0),
		k: matrix("attn.k.weight", w, w, gptInitSD), kb: vector("attn.k.bias", w, 0),
		v: matrix("attn.v.weight", w, w, gptInitSD), vb: vector("attn.v.bias", w, 0),
		proj: matrix("attn.proj.weight", w, w, residualSD), projb: vector("attn.proj.bias", w, 0),
		ln2Gain: vector("ln2.gain", w, 1), ln2Bias: vector("ln2.bias", w, 0),
		fc: matrix("mlp.fc.weight", w, hid, gptInitSD), fcb: vector("mlp.fc.bias", hid, 0),
		out: matrix("mlp.proj.weight", hid, w, residualSD), outb: vector("mlp.proj.bias", w, 0),
	}
}

// A block's parts, in Built.Parts order: LayerNorm 1 on the block input;
// the q, k and v projections of its output; the attention output's
// projection; LayerNorm 2 on the residual stream; the MLP's fc and, on the
// GELU's output, its proj. Part i owns parameters 2i and 2i+1 of
// blockParams.list, its weight (or gain) and bias. Attention, GELU and the
// residual adds have no parameters and lie between parts: the weight
// gradients never need their forward values.
const (
	partLN1 = iota
	partQ
	partK
	partV
	partAttnProj
	partLN2
	partFC
	partMLPProj
	blockParts
)

// part adds block part i on x: a LayerNorm or an affine map.
func (l *gptBlock) part(o *ops, i int, x *G.Node, params []*G.Node) *G.Node {
	if i == partLN1 || i == partLN2 {
		return o.layerNorm(x, params[0], params[1])
	}
	return o.affine(x, params[0], params[1])
}

func (l *gptBlock) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	batch, err := l.sz.batchOf(x, l.name)
	if err != nil {
		return Built{}, err
	}
	params := l.params(g, seed).list()
	o := newOps(l.sz.dt)
	parts := make([]Part, 0, blockParts)
	part := func(i int, in *G.Node) *G.Node {
		ps := params[2*i : 2*i+2]
		tap := l.part(o, i, in, ps)
		parts = append(parts, Part{In: in, Tap: tap, Params: ps})
		return tap
	}
	a := part(partLN1, x)
	att := o.causalAttention(part(partQ, a), part(partK, a), part(partV, a), batch, l.sz.context, l.sz.heads, !l.recompute)
	x = o.add(x, part(partAttnProj, att))
	m := part(partLN2, x)
	x = o.add(x, part(partMLPProj, o.gelu(part(partFC, m))))
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", l.name, o.err)
	}
	return Built{Out: x, Params: params, Parts: parts}, nil
}

// LinearWeight: every part but the LayerNorms is x W + b.
func (l *gptBlock) LinearWeight(i int) (int, bool, bool) {
	return 0, false, i >= 0 && i < blockParts && i != partLN1 && i != partLN2
}

// BuildPart adds block part i (see partLN1) on x. A LayerNorm part's gain
// gradient needs the normalised input, which it recomputes from x: a pass
// over x per row, cheaper than keeping the normalised rows from the forward.
func (l *gptBlock) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i < 0 || i >= blockParts || len(params) != 2 {
		return nil, fmt.Errorf("%s: part %d with %d parameters; the block has %d parts of 2", l.name, i, len(params), blockParts)
	}
	o := newOps(l.sz.dt)
	tap := l.part(o, i, x, params)
	if o.err != nil {
		return nil, fmt.Errorf("%s: %w", l.name, o.err)
	}
	return tap, nil
}

// gptHead is the final LayerNorm and the LM head: logits (batch*context, vocab).
// Tied, it multiplies by the transpose of its own copy "head.tok" of the token
// table; otherwise by its own (width, vocab) "head.weight".
type gptHead struct{ sz gptSizes }

func (l *gptHead) Name() string { return "head" }

func (l *gptHead) OutShape(in tensor.Shape) tensor.Shape { return tensor.Shape{in[0], l.sz.vocab} }

func (l *gptHead) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	sz := l.sz
	if _, err := sz.batchOf(x, "head"); err != nil {
		return Built{}, err
	}
	gain := newParam(g, "head.ln.gain", constInit(sz.dt, tensor.Shape{sz.width}, 1))
	bias := newParam(g, "head.ln.bias", constInit(sz.dt, tensor.Shape{sz.width}, 0))
	var w *G.Node
	if sz.tied {
		w = newParam(g, "head.tok", tokenTable(sz, seed))
	} else {
		w = newParam(g, "head.weight", normalInit(sz.dt, tensor.Shape{sz.width, sz.vocab}, gptInitSD, paramRNG(seed, "head", "weight")))
	}
	norm := []*G.Node{gain, bias}
	h, err := l.BuildPart(g, 0, x, norm)
	if err != nil {
		return Built{}, err
	}
	logits, err := l.BuildPart(g, 1, h, []*G.Node{w})
	if err != nil {
		return Built{}, err
	}
	return Built{Out: logits, Params: []*G.Node{gain, bias, w},
		Parts: []Part{{In: x, Tap: h, Params: norm}, {In: h, Tap: logits, Params: []*G.Node{w}}}}, nil
}

// LinearWeight: part 1 is x W, or x Wᵀ with the tied token table.
func (l *gptHead) LinearWeight(i int) (int, bool, bool) { return 0, l.sz.tied, i == 1 }

// BuildPart adds the head's part 0, the final LayerNorm, or part 1, the
// product with the output matrix: tied, the head's own copy of the token
// table, whose gradient the weight pass computes like any other, before the
// pipeline sums the two copies' gradients (stages/tied.go).
func (l *gptHead) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if want := []int{2, 1}; i < 0 || i >= len(want) || len(params) != want[i] {
		return nil, fmt.Errorf("head: part %d with %d parameters; the head has 2 parts, of 2 and 1", i, len(params))
	}
	o := newOps(l.sz.dt)
	var out *G.Node
	switch {
	case i == 0:
		out = o.layerNorm(x, params[0], params[1])
	case l.sz.tied:
		out = o.matMul(x, o.transpose(params[0], 1, 0))
	default:
		out = o.matMul(x, params[0])
	}
	if o.err != nil {
		return nil, fmt.Errorf("head: %w", o.err)
	}
	return out, nil
}
