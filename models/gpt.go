package models

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() { Register("gpt", buildGPT) }

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
	batch := x.Shape()[0]
	tok := newParam(g, "embed.tok", tokenTable(sz, seed))
	pos := newParam(g, "embed.pos", normalInit(sz.dt, tensor.Shape{sz.context, sz.width}, gptInitSD, paramRNG(seed, "embed", "pos")))
	o := newOps(sz.dt)
	h := o.matMul(o.apply(oneHotOp{vocab: sz.vocab}, x), tok)
	// Seen as (batch, context*width), every sequence gets the same flattened
	// position table, which a broadcast over the batch axis adds.
	h = o.bcastAdd(o.reshape(h, batch, sz.context*sz.width), o.reshape(pos, sz.context*sz.width), 0)
	h = o.reshape(h, batch*sz.context, sz.width)
	if o.err != nil {
		return Built{}, fmt.Errorf("embed: %w", o.err)
	}
	return Built{Out: h, Params: []*G.Node{tok, pos}}, nil
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
}

func (l *gptBlock) Name() string { return l.name }

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

func (l *gptBlock) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	batch, err := l.sz.batchOf(x, l.name)
	if err != nil {
		return Built{}, err
	}
	p := l.params(g, seed)
	o := newOps(l.sz.dt)
	a := o.layerNorm(x, p.ln1Gain, p.ln1Bias)
	att := o.causalAttention(o.affine(a, p.q, p.qb), o.affine(a, p.k, p.kb), o.affine(a, p.v, p.vb), batch, l.sz.context, l.sz.heads)
	x = o.add(x, o.affine(att, p.proj, p.projb))
	m := o.layerNorm(x, p.ln2Gain, p.ln2Bias)
	x = o.add(x, o.affine(o.gelu(o.affine(m, p.fc, p.fcb)), p.out, p.outb))
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", l.name, o.err)
	}
	return Built{Out: x, Params: p.list()}, nil
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
	o := newOps(sz.dt)
	h := o.layerNorm(x, gain, bias)
	var w, logits *G.Node
	if sz.tied {
		w = newParam(g, "head.tok", tokenTable(sz, seed))
		logits = o.matMul(h, o.transpose(w, 1, 0))
	} else {
		w = newParam(g, "head.weight", normalInit(sz.dt, tensor.Shape{sz.width, sz.vocab}, gptInitSD, paramRNG(seed, "head", "weight")))
		logits = o.matMul(h, w)
	}
	if o.err != nil {
		return Built{}, fmt.Errorf("head: %w", o.err)
	}
	return Built{Out: logits, Params: []*G.Node{gain, bias, w}}, nil
}
