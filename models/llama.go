package models

import (
	"errors"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() {
	Register(family{name: "llama", build: buildLlama, doc: FamilyDoc{
		Summary: "a Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention), for dataset text",
		Keys: []KeyDoc{
			{Key: "layers", Doc: "Decoder blocks: the model's layers are embed, block0 to blockN-1, and head."},
			{Key: "width", Doc: "Hidden size, the embedding width (Hugging Face's hidden_size)."},
			{Key: "heads", Doc: "Query heads (num_attention_heads)."},
			{Key: "context", Doc: "Tokens per example; rotary positions run from 0 to context-1."},
			{Key: "vocab", Doc: "Vocabulary size: 256 with the byte tokenizer, the corpus's symbol count with char."},
			{Key: "tie_embeddings", Doc: "Makes the LM head use the token embedding matrix (tie_word_embeddings); the two stages holding it keep both copies identical."},
			{Key: "intermediate", Type: "integer", Doc: "Width of the SwiGLU MLP (intermediate_size); required."},
			{Key: "kv_heads", Type: "integer", Doc: "Key and value heads (num_key_value_heads), each shared by heads/kv_heads query heads; they must divide model.heads. model.heads when not given."},
			{Key: "head_dim", Type: "integer", Doc: "Width of one attention head, even for the rotary embedding; model.width/model.heads when not given."},
			{Key: "rms_norm_eps", Type: "number", Doc: "The epsilon of every RMSNorm; 1e-6 when not given."},
			{Key: "rope_theta", Type: "number", Doc: "Base of the rotary embedding's frequencies; 10000 when not given."},
		},
	}})
}

// Defaults of the Llama family's own keys, Hugging Face's LlamaConfig's.
const (
	llamaDefaultEps   = 1e-6
	llamaDefaultTheta = 10000
)

// llamaOwn are the family's own keys, nil when not given.
type llamaOwn struct {
	Intermediate *int     `json:"intermediate"`
	KVHeads      *int     `json:"kv_heads"`
	HeadDim      *int     `json:"head_dim"`
	RMSNormEps   *float64 `json:"rms_norm_eps"`
	RopeTheta    *float64 `json:"rope_theta"`
}

// llamaSizes are the validated sizes every Llama layer needs.
type llamaSizes struct {
	layers, width, heads, kvHeads, headDim, intermediate, context, vocab int
	eps, theta                                                           float64
	tied                                                                 bool
	dt                                                                   tensor.Dtype
}

// qWidth is the width of the queries, heads·headDim; kvWidth that of the
// keys and values.
func (sz llamaSizes) qWidth() int  { return sz.heads * sz.headDim }
func (sz llamaSizes) kvWidth() int { return sz.kvHeads * sz.headDim }

func (sz llamaSizes) rotary() rotary {
	return rotary{context: sz.context, headDim: sz.headDim, theta: sz.theta}
}

// buildLlama makes a Llama decoder: layer "embed" (token embedding only:
// positions enter through the rotary embedding), blocks "block0" to
// "blockN-1", and "head" (final RMSNorm and LM head). Activations between
// layers are (batch*context, width), as the GPT's.
func buildLlama(spec Spec) (*Model, error) {
	sz, err := llamaSizesOf(spec)
	if err != nil {
		return nil, err
	}
	m := &Model{
		Spec: spec, DType: sz.dt, Example: tensor.Shape{sz.context},
		Classes: sz.vocab, TargetsPerExample: sz.context,
	}
	m.Layers = append(m.Layers, &llamaEmbed{sz: sz})
	for i := range sz.layers {
		m.Layers = append(m.Layers, &llamaBlock{name: fmt.Sprintf("block%d", i), sz: sz})
	}
	m.Layers = append(m.Layers, &llamaHead{sz: sz})
	if sz.tied {
		m.Tied = [][2]string{{"embed.tok", "head.tok"}}
		m.TiedShapes = [][]int{{sz.vocab, sz.width}}
	}
	return m, nil
}

// llamaSizesOf validates the spec and its own keys, reporting every
// problem by its key.
func llamaSizesOf(spec Spec) (llamaSizes, error) {
	var check specCheck
	dt := check.dtype(spec.DType)
	var own llamaOwn
	var ownErrs SpecErrors
	if errors.As(DecodeOwn(spec, &own), &ownErrs) {
		check.errs = append(check.errs, ownErrs...)
	}
	sz := llamaSizes{
		layers: spec.Layers, width: spec.Width, heads: spec.Heads, kvHeads: spec.Heads, context: spec.Context,
		vocab: spec.Vocab, tied: spec.TieEmbeddings, dt: dt, eps: llamaDefaultEps, theta: llamaDefaultTheta,
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", sz.layers}, {"width", sz.width}, {"heads", sz.heads}, {"context", sz.context}} {
		check.atLeast(f.name, f.v, 1)
	}
	if sz.layers > maxGPTLayers {
		check.add("layers", "%d is more than %d blocks", sz.layers, maxGPTLayers)
	}
	if check.atLeast("vocab", sz.vocab, 2) && dt == tensor.Float32 && sz.vocab > maxFloat32ID {
		check.add("vocab", "%d is too large for float32 token ids (at most %d)", sz.vocab, maxFloat32ID)
	}
	if own.Intermediate == nil {
		check.add("intermediate", "missing: the SwiGLU MLP's width (intermediate_size)")
	} else if check.atLeast("intermediate", *own.Intermediate, 1) {
		sz.intermediate = *own.Intermediate
	}
	if own.KVHeads != nil {
		sz.kvHeads = *own.KVHeads
		if check.atLeast("kv_heads", sz.kvHeads, 1) && sz.heads >= 1 && sz.heads%sz.kvHeads != 0 {
			check.add("kv_heads", "%d does not divide model.heads %d", sz.kvHeads, sz.heads)
		}
	}
	switch {
	case own.HeadDim != nil:
		sz.headDim = *own.HeadDim
		if check.atLeast("head_dim", sz.headDim, 2) && sz.headDim%2 != 0 {
			check.add("head_dim", "%d is odd; the rotary embedding turns pairs of dimensions", sz.headDim)
		}
	case sz.width >= 1 && sz.heads >= 1 && sz.width%sz.heads != 0:
		check.add("heads", "%d does not divide model.width %d (or give model.head_dim)", sz.heads, sz.width)
	case sz.width >= 1 && sz.heads >= 1:
		if sz.headDim = sz.width / sz.heads; sz.headDim%2 != 0 {
			check.add("heads", "model.width/model.heads = %d is odd; the rotary embedding turns pairs of dimensions (or give model.head_dim)", sz.headDim)
		}
	}
	if own.RMSNormEps != nil {
		if sz.eps = *own.RMSNormEps; !(sz.eps > 0) {
			check.add("rms_norm_eps", "must be positive, got %g", sz.eps)
		}
	}
	if own.RopeTheta != nil {
		if sz.theta = *own.RopeTheta; !(sz.theta > 1) {
			check.add("rope_theta", "must be more than 1, got %g", sz.theta)
		}
	}
	if err := check.err(); err != nil {
		return llamaSizes{}, err
	}
	return sz, nil
}

// LlamaSpec is what every Llama layer needs to know of its model, for
// NewLlamaEmbed, NewLlamaBlock and NewLlamaHead: the sizes of model llama's
// config section. A zero KVHeads, HeadDim, RMSNormEps or RopeTheta means
// the key's default, as when the key is not given.
type LlamaSpec struct {
	Layers, Width, Heads, KVHeads, HeadDim, Intermediate, Context, Vocab int
	RMSNormEps, RopeTheta                                                float64
	// TieEmbeddings makes the head use a copy of the token table (see
	// Model.Tied, which a model composing these layers must then set).
	TieEmbeddings bool
	// DType is the dtype of parameters and activations; the zero value is
	// float32.
	DType tensor.Dtype
}

// llamaSizesFor validates a LlamaSpec as model llama validates its section;
// errors name the layer and the field at fault.
func llamaSizesFor(kind, name string, s LlamaSpec) (llamaSizes, error) {
	var check specCheck
	dt := layerDType(&check, s.DType)
	spec := Spec{Layers: s.Layers, Width: s.Width, Heads: s.Heads, Context: s.Context, Vocab: s.Vocab,
		TieEmbeddings: s.TieEmbeddings, Own: map[string]any{"intermediate": s.Intermediate}}
	if len(check.errs) == 0 {
		spec.DType = dt.String()
	}
	for key, v := range map[string]int{"kv_heads": s.KVHeads, "head_dim": s.HeadDim} {
		if v != 0 {
			spec.Own[key] = v
		}
	}
	for key, v := range map[string]float64{"rms_norm_eps": s.RMSNormEps, "rope_theta": s.RopeTheta} {
		if v != 0 {
			spec.Own[key] = v
		}
	}
	sz, err := llamaSizesOf(spec)
	var errs SpecErrors
	if errors.As(err, &errs) {
		check.errs = append(check.errs, errs...)
	}
	if err := check.layerErr(kind, name); err != nil {
		return llamaSizes{}, err
	}
	return sz, nil
}

// NewLlamaEmbed makes model llama's layer "embed": the token embedding,
// (batch, context) token ids in, (batch*context, width) out.
func NewLlamaEmbed(s LlamaSpec) (Layer, error) {
	sz, err := llamaSizesFor("llama embedding", "embed", s)
	if err != nil {
		return nil, err
	}
	return &llamaEmbed{sz: sz}, nil
}

// NewLlamaBlock makes model llama's block i of s.Layers, "block<i>": a
// pre-norm decoder block on (batch*context, width) activations.
func NewLlamaBlock(i int, s LlamaSpec) (Layer, error) {
	name := fmt.Sprintf("block%d", i)
	if i < 0 || i >= s.Layers {
		return nil, fmt.Errorf("llama block layer %q: index %d outside the model's %d blocks", name, i, s.Layers)
	}
	sz, err := llamaSizesFor("llama block", name, s)
	if err != nil {
		return nil, err
	}
	return &llamaBlock{name: name, sz: sz}, nil
}

// NewLlamaHead makes model llama's layer "head": the final RMSNorm and the
// LM head, (batch*context, width) in, (batch*context, vocab) logits out.
func NewLlamaHead(s LlamaSpec) (Layer, error) {
	sz, err := llamaSizesFor("llama head", "head", s)
	if err != nil {
		return nil, err
	}
	return &llamaHead{sz: sz}, nil
}

// batchOf recovers the number of sequences from a (batch*context, width) input.
func (sz llamaSizes) batchOf(x *G.Node, layer string) (int, error) {
	s := x.Shape()
	if s.Dims() != 2 || s[1] != sz.width || s[0]%sz.context != 0 {
		return 0, fmt.Errorf("%s: input shape %v, want (batch*%d, %d)", layer, s, sz.context, sz.width)
	}
	return s[0] / sz.context, nil
}

// llamaTokenTable is the initial (vocab, width) token embedding, N(0, 0.02)
// as Hugging Face's initializer_range. A tied head builds its own copy from
// the same generator, so both start bit-identical.
func llamaTokenTable(sz llamaSizes, seed uint64) *tensor.Dense {
	return normalInit(sz.dt, tensor.Shape{sz.vocab, sz.width}, gptInitSD, paramRNG(seed, "embed", "tok"))
}

// llamaEmbed maps token ids (batch, context) to rows of the token table.
type llamaEmbed struct{ sz llamaSizes }

func (l *llamaEmbed) Name() string { return "embed" }

func (l *llamaEmbed) OutShape(in tensor.Shape) tensor.Shape {
	return tensor.Shape{in[0] * l.sz.context, l.sz.width}
}

func (l *llamaEmbed) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	if s := x.Shape(); s.Dims() != 2 || s[1] != l.sz.context {
		return Built{}, fmt.Errorf("embed: input shape %v, want (batch, %d) token ids", s, l.sz.context)
	}
	params := []*G.Node{newParam(g, "embed.tok", llamaTokenTable(l.sz, seed))}
	h, err := l.BuildPart(g, 0, x, params)
	if err != nil {
		return Built{}, err
	}
	return Built{Out: h, Params: params, Parts: []Part{{In: x, Tap: h, Params: params}}}, nil
}

// BuildPart is the whole layer, one part: the table's gradient needs only
// the token ids and the output's gradient.
func (l *llamaEmbed) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i != 0 || len(params) != 1 {
		return nil, fmt.Errorf("embed: part %d with %d parameters; the layer has one part of 1", i, len(params))
	}
	o := newOps(l.sz.dt)
	h := o.lookup(x, params[0])
	if o.err != nil {
		return nil, fmt.Errorf("embed: %w", o.err)
	}
	return h, nil
}

// llamaBlock is a pre-norm decoder block:
// h = x + o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x)))), then
// h + down(silu(gate(n2(h)))·up(n2(h))), n1 and n2 RMSNorms, no biases.
type llamaBlock struct {
	name string
	sz   llamaSizes
	// recompute: attention keeps no probabilities for its backward, which
	// computes them again (selective recomputation, RecomputingInternals).
	recompute bool
}

func (l *llamaBlock) Name() string { return l.name }

// RecomputingInternals is the block with attention's probabilities
// recomputed in the backward instead of kept.
func (l *llamaBlock) RecomputingInternals() Layer {
	c := *l
	c.recompute = true
	return &c
}

func (l *llamaBlock) OutShape(in tensor.Shape) tensor.Shape { return in.Clone() }

// A block's parts, in Built.Parts order, one parameter each: the attention
// RMSNorm on the block input; the q, k and v projections of its output; the
// attention output's projection o; the MLP's RMSNorm on the residual
// stream; the gate and up projections of its output; and, on the SwiGLU's
// output, the down projection. RoPE, attention, SwiGLU and the residual
// adds have no parameters and lie between parts.
const (
	llamaAttnNorm = iota
	llamaQ
	llamaK
	llamaV
	llamaO
	llamaMLPNorm
	llamaGate
	llamaUp
	llamaDown
	llamaParts
)

// llamaParams are the names and shapes of a block's parameters, by part.
func (l *llamaBlock) llamaParams() []struct {
	name  string
	shape tensor.Shape
} {
	w, q, kv, m := l.sz.width, l.sz.qWidth(), l.sz.kvWidth(), l.sz.intermediate
	return []struct {
		name  string
		shape tensor.Shape
	}{
		{"attn_norm.gain", tensor.Shape{w}},
		{"attn.q.weight", tensor.Shape{w, q}}, {"attn.k.weight", tensor.Shape{w, kv}},
		{"attn.v.weight", tensor.Shape{w, kv}}, {"attn.o.weight", tensor.Shape{q, w}},
		{"mlp_norm.gain", tensor.Shape{w}},
		{"mlp.gate.weight", tensor.Shape{w, m}}, {"mlp.up.weight", tensor.Shape{w, m}},
		{"mlp.down.weight", tensor.Shape{m, w}},
	}
}

// params creates the block's parameters: gains of one, weights N(0, 0.02)
// as Hugging Face's LlamaPreTrainedModel initialises them.
func (l *llamaBlock) params(g *G.ExprGraph, seed uint64) []*G.Node {
	var out []*G.Node
	for _, p := range l.llamaParams() {
		var v *tensor.Dense
		if p.shape.Dims() == 1 {
			v = constInit(l.sz.dt, p.shape, 1)
		} else {
			v = normalInit(l.sz.dt, p.shape, gptInitSD, paramRNG(seed, l.name, p.name))
		}
		out = append(out, newParam(g, l.name+"."+p.name, v))
	}
	return out
}

// part adds block part i on x: an RMSNorm or a product with a weight.
func (l *llamaBlock) part(o *ops, i int, x, param *G.Node) *G.Node {
	if i == llamaAttnNorm || i == llamaMLPNorm {
		return o.rmsNorm(x, param, l.sz.eps)
	}
	return o.matMul(x, param)
}

func (l *llamaBlock) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	batch, err := l.sz.batchOf(x, l.name)
	if err != nil {
		return Built{}, err
	}
	params := l.params(g, seed)
	o := newOps(l.sz.dt)
	parts := make([]Part, 0, llamaParts)
	part := func(i int, in *G.Node) *G.Node {
		tap := l.part(o, i, in, params[i])
		parts = append(parts, Part{In: in, Tap: tap, Params: params[i : i+1]})
		return tap
	}
	sz := l.sz
	a := part(llamaAttnNorm, x)
	q, k, v := o.rope(part(llamaQ, a), sz.rotary()), o.rope(part(llamaK, a), sz.rotary()), part(llamaV, a)
	att := o.groupedAttention(q, k, v, batch, sz.context, sz.heads, sz.kvHeads, !l.recompute)
	x = o.add(x, part(llamaO, att))
	m := part(llamaMLPNorm, x)
	x = o.add(x, part(llamaDown, o.swiglu(part(llamaGate, m), part(llamaUp, m))))
	if o.err != nil {
		return Built{}, fmt.Errorf("%s: %w", l.name, o.err)
	}
	return Built{Out: x, Params: params, Parts: parts}, nil
}

// LinearWeight: every part but the RMSNorms is x W.
func (l *llamaBlock) LinearWeight(i int) (int, bool, bool) {
	return 0, false, i >= 0 && i < llamaParts && i != llamaAttnNorm && i != llamaMLPNorm
}

// BuildPart adds block part i (see llamaAttnNorm) on x; an RMSNorm part's
// gain gradient recomputes each row's scale from x.
func (l *llamaBlock) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i < 0 || i >= llamaParts || len(params) != 1 {
		return nil, fmt.Errorf("%s: part %d with %d parameters; the block has %d parts of 1", l.name, i, len(params), llamaParts)
	}
	o := newOps(l.sz.dt)
	tap := l.part(o, i, x, params[0])
	if o.err != nil {
		return nil, fmt.Errorf("%s: %w", l.name, o.err)
	}
	return tap, nil
}

// llamaHead is the final RMSNorm and the LM head: logits (batch*context,
// vocab). Tied, it multiplies by the transpose of its own copy "head.tok" of
// the token table; otherwise by its own (width, vocab) "head.weight".
type llamaHead struct{ sz llamaSizes }

func (l *llamaHead) Name() string { return "head" }

func (l *llamaHead) OutShape(in tensor.Shape) tensor.Shape { return tensor.Shape{in[0], l.sz.vocab} }

func (l *llamaHead) Build(g *G.ExprGraph, x *G.Node, seed uint64) (Built, error) {
	sz := l.sz
	if _, err := sz.batchOf(x, "head"); err != nil {
		return Built{}, err
	}
	gain := newParam(g, "head.norm.gain", constInit(sz.dt, tensor.Shape{sz.width}, 1))
	var w *G.Node
	if sz.tied {
		w = newParam(g, "head.tok", llamaTokenTable(sz, seed))
	} else {
		w = newParam(g, "head.weight", normalInit(sz.dt, tensor.Shape{sz.width, sz.vocab}, gptInitSD, paramRNG(seed, "head", "weight")))
	}
	h, err := l.BuildPart(g, 0, x, []*G.Node{gain})
	if err != nil {
		return Built{}, err
	}
	logits, err := l.BuildPart(g, 1, h, []*G.Node{w})
	if err != nil {
		return Built{}, err
	}
	return Built{Out: logits, Params: []*G.Node{gain, w},
		Parts: []Part{{In: x, Tap: h, Params: []*G.Node{gain}}, {In: h, Tap: logits, Params: []*G.Node{w}}}}, nil
}

// LinearWeight: part 1 is x W, or x Wᵀ with the tied token table.
func (l *llamaHead) LinearWeight(i int) (int, bool, bool) { return 0, l.sz.tied, i == 1 }

// BuildPart adds the head's part 0, the final RMSNorm, or part 1, the
// product with the output matrix (tied: the head's copy of the token table,
// whose gradient the pipeline sums with the embedding's).
func (l *llamaHead) BuildPart(g *G.ExprGraph, i int, x *G.Node, params []*G.Node) (*G.Node, error) {
	if i < 0 || i > 1 || len(params) != 1 {
		return nil, fmt.Errorf("head: part %d with %d parameters; the head has 2 parts of 1", i, len(params))
	}
	o := newOps(l.sz.dt)
	var out *G.Node
	switch {
	case i == 0:
		out = o.rmsNorm(x, params[0], l.sz.eps)
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

// TorchParams: the token table as Hugging Face's LlamaForCausalLM holds it.
func (l *llamaEmbed) TorchParams() []TorchParam {
	return []TorchParam{torchSame("embed.tok", "model.embed_tokens.weight", l.sz.vocab, l.sz.width)}
}

// llamaTorchNames are the Hugging Face names of a block's parameters, in
// llamaParams' order, after "model.layers.<i>.".
var llamaTorchNames = [llamaParts]string{
	"input_layernorm.weight",
	"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
	"post_attention_layernorm.weight",
	"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
}

// TorchParams: model.layers.<i> of LlamaForCausalLM; its projections are
// nn.Linear weights [out, in], transposed.
func (l *llamaBlock) TorchParams() []TorchParam {
	t := "model.layers." + l.name[len("block"):] + "."
	var out []TorchParam
	for i, p := range l.llamaParams() {
		out = append(out, TorchParam{Name: l.name + "." + p.name, Torch: t + llamaTorchNames[i],
			Shape: []int(p.shape.Clone()), Transpose: p.shape.Dims() == 2})
	}
	return out
}

// TorchParams: model.norm, then lm_head.weight, or, tied, the copy of
// model.embed_tokens.weight (a tied checkpoint has no lm_head.weight).
func (l *llamaHead) TorchParams() []TorchParam {
	w := l.sz.width
	out := []TorchParam{torchSame("head.norm.gain", "model.norm.weight", w)}
	if l.sz.tied {
		return append(out, torchSame("head.tok", "model.embed_tokens.weight", l.sz.vocab, w))
	}
	return append(out, TorchParam{Name: "head.weight", Torch: "lm_head.weight", Shape: []int{w, l.sz.vocab}, Transpose: true})
}
