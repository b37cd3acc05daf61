package models

import (
	"fmt"
	"strings"
)

// The map between pipetrain's parameters and the names and layouts a PyTorch
// module of the same model uses (docs/weights.md shows the modules). It is
// the one place that knows both: `pipetrain export` writes the PyTorch side,
// train.init_from reads it.
//
// Layouts differ in one way: pipetrain computes x·W, so a dense layer's
// weight is [in, out], where nn.Linear holds [out, in] and computes x·Wᵀ.
// Convolution filters ([out_c, in_c, kh, kw]), embeddings ([rows, width]),
// biases and LayerNorm gains and biases are laid out alike.
//
//	model  pipetrain                 PyTorch                   layout
//	mlp    fc<i>.weight  [in, out]   fc<i>.weight  [out, in]   transposed
//	       fc<i>.bias                fc<i>.bias
//	cnn    conv<i>.weight, .bias     conv<i>.weight, .bias     same
//	       fc.weight     [in, out]   fc.weight     [out, in]   transposed
//	       fc.bias                   fc.bias
//	gpt    embed.tok                 tok_emb.weight            same
//	       embed.pos                 pos_emb.weight            same
//	       block<i>.ln1.gain, .bias  blocks.<i>.ln1.weight, .bias
//	       block<i>.attn.q.weight    blocks.<i>.attn.q.weight  transposed (also k, v, proj)
//	       block<i>.attn.q.bias      blocks.<i>.attn.q.bias    (also k, v, proj)
//	       block<i>.ln2.gain, .bias  blocks.<i>.ln2.weight, .bias
//	       block<i>.mlp.fc.weight    blocks.<i>.mlp.fc.weight  transposed (also mlp.proj)
//	       block<i>.mlp.fc.bias      blocks.<i>.mlp.fc.bias    (also mlp.proj)
//	       head.ln.gain, .bias       ln_f.weight, .bias
//	       head.weight [width, vocab] head.weight [vocab, width] transposed (untied)
//	       head.tok                  tok_emb.weight            tied: not exported again
//	sequential stack<i>.weight        <i>.weight                transposed for linear
//	       stack<i>.<j>.bias         <i>.<j>.bias              (an nn.Sequential's state_dict)

// TorchParam is one parameter's entry in the map.
type TorchParam struct {
	Name  string // pipetrain's name, e.g. "fc0.weight"
	Shape []int  // pipetrain's layout, e.g. [in, out]
	Torch string // PyTorch's name, e.g. "fc0.weight"
	// TorchShape is PyTorch's layout, e.g. [out, in].
	TorchShape []int
	// Transpose says the two layouts of this 2-D weight are each other's
	// transpose.
	Transpose bool
	// Copy marks the second holder of a tied weight (the GPT's head.tok,
	// a copy of embed.tok): PyTorch holds the weight once, under Torch, so
	// it is exported once and both copies are filled from it.
	Copy bool
}

// TorchParams is the map of m: every parameter of the model in pipetrain's
// order (layer by layer, as the stages hold them), with its PyTorch name and
// layout. It is worked out from the layers' sizes, without building them, so
// it costs nothing for a model too large for this process to hold;
// TestTorchParamsMatchTheBuilders holds it to what the builders make.
func TorchParams(m *Model) ([]TorchParam, error) {
	copies := map[string]bool{}
	for _, pair := range m.Tied {
		copies[pair[1]] = true
	}
	f, _ := Lookup(m.Spec.Name)
	renamer, _ := f.(TorchRenamer)
	var out []TorchParam
	seen := map[string]string{}
	for _, l := range m.Layers {
		ps, err := layerTorchParams(l)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", m.Spec.Name, err)
		}
		for _, p := range ps {
			if renamer != nil {
				p.Torch = renamer.TorchName(p)
			}
			p.TorchShape, p.Copy = p.Shape, copies[p.Name]
			if p.Transpose {
				p.TorchShape = []int{p.Shape[1], p.Shape[0]}
			}
			if prev, dup := seen[p.Torch]; dup && !p.Copy {
				return nil, fmt.Errorf("model %s: parameters %s and %s both map to %s", m.Spec.Name, prev, p.Name, p.Torch)
			}
			seen[p.Torch] = p.Name
			out = append(out, p)
		}
	}
	return out, nil
}

// TorchRenamer is a Family whose PyTorch module names its parameters
// otherwise than its layers do, e.g. a Hugging Face checkpoint's
// "model.layers.0.mlp.up_proj.weight" for a block's "block0.mlp.fc.weight".
// TorchParams asks it for the PyTorch name of each entry its layers give
// (shapes and layouts stay the layers'), whichever stage's layers the model
// holds.
type TorchRenamer interface {
	Family
	// TorchName is p's PyTorch name; p.Torch is the layer's.
	TorchName(p TorchParam) string
}

// TorchNamed is a layer that knows the PyTorch names and layouts of its
// parameters. Every layer of a model that is exported, or started from
// PyTorch's weights, must be one.
type TorchNamed interface {
	Layer
	// TorchParams lists the layer's parameters in Build's order, with
	// pipetrain's shapes, PyTorch's names and whether the layouts
	// transpose; TorchShape and Copy are left to the model's map.
	TorchParams() []TorchParam
}

// layerTorchParams is l's part of the map.
func layerTorchParams(l Layer) ([]TorchParam, error) {
	n, ok := l.(TorchNamed)
	if !ok {
		return nil, fmt.Errorf("layer %s (%T) has no PyTorch names", l.Name(), l)
	}
	return n.TorchParams(), nil
}

// torchSame is a parameter laid out alike on both sides.
func torchSame(name, torch string, shape ...int) TorchParam {
	return TorchParam{Name: name, Torch: torch, Shape: shape}
}

// torchLinear is a dense weight [in, out] and its bias, as nn.Linear holds
// them under torch.weight [out, in] and torch.bias.
func torchLinear(name, torch string, in, out int) []TorchParam {
	return []TorchParam{
		{Name: name + ".weight", Torch: torch + ".weight", Shape: []int{in, out}, Transpose: true},
		torchSame(name+".bias", torch+".bias", out),
	}
}

// TorchParams: nn.Linear under the layer's own name.
func (d *Dense) TorchParams() []TorchParam { return torchLinear(d.name, d.name, d.In, d.Out) }

// TorchParams: nn.Conv2d under the layer's own name.
func (c *Conv) TorchParams() []TorchParam {
	return []TorchParam{
		torchSame(c.name+".weight", c.name+".weight", c.Out, c.In, convKernel, convKernel),
		torchSame(c.name+".bias", c.name+".bias", c.Out),
	}
}

// TorchParams: the two nn.Embedding tables.
func (l *gptEmbed) TorchParams() []TorchParam {
	return []TorchParam{
		torchSame("embed.tok", "tok_emb.weight", l.sz.vocab, l.sz.width),
		torchSame("embed.pos", "pos_emb.weight", l.sz.context, l.sz.width),
	}
}

// TorchParams: blocks.<i> of the module's nn.ModuleList.
func (l *gptBlock) TorchParams() []TorchParam {
	w, b := l.sz.width, l.name+"."
	t := "blocks." + strings.TrimPrefix(l.name, "block") + "."
	norm := func(n string) []TorchParam {
		return []TorchParam{torchSame(b+n+".gain", t+n+".weight", w), torchSame(b+n+".bias", t+n+".bias", w)}
	}
	var out []TorchParam
	out = append(out, norm("ln1")...)
	for _, n := range []string{"attn.q", "attn.k", "attn.v", "attn.proj"} {
		out = append(out, torchLinear(b+n, t+n, w, w)...)
	}
	out = append(out, norm("ln2")...)
	out = append(out, torchLinear(b+"mlp.fc", t+"mlp.fc", w, 4*w)...)
	return append(out, torchLinear(b+"mlp.proj", t+"mlp.proj", 4*w, w)...)
}

// TorchParams: ln_f, then the untied head.weight or the tied copy of the
// token table.
func (l *gptHead) TorchParams() []TorchParam {
	w := l.sz.width
	out := []TorchParam{torchSame("head.ln.gain", "ln_f.weight", w), torchSame("head.ln.bias", "ln_f.bias", w)}
	if l.sz.tied {
		return append(out, torchSame("head.tok", "tok_emb.weight", l.sz.vocab, w))
	}
	return append(out, TorchParam{Name: "head.weight", Torch: "head.weight", Shape: []int{w, l.sz.vocab}, Transpose: true})
}
