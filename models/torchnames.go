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
	var out []TorchParam
	seen := map[string]string{}
	for _, l := range m.Layers {
		ps, err := layerTorchParams(l)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", m.Spec.Name, err)
		}
		for _, p := range ps {
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

// layerTorchParams lists one layer's parameters in Build's order, with
// pipetrain's shapes, PyTorch's names and whether the layouts transpose.
func layerTorchParams(l Layer) ([]TorchParam, error) {
	same := func(name, torch string, shape ...int) TorchParam {
		return TorchParam{Name: name, Torch: torch, Shape: shape}
	}
	dense := func(name, torch string, in, out int) []TorchParam {
		return []TorchParam{
			{Name: name + ".weight", Torch: torch + ".weight", Shape: []int{in, out}, Transpose: true},
			same(name+".bias", torch+".bias", out),
		}
	}
	switch l := l.(type) {
	case *Dense:
		return dense(l.name, l.name, l.In, l.Out), nil
	case *Conv:
		return []TorchParam{
			same(l.name+".weight", l.name+".weight", l.Out, l.In, convKernel, convKernel),
			same(l.name+".bias", l.name+".bias", l.Out),
		}, nil
	case *gptEmbed:
		return []TorchParam{
			same("embed.tok", "tok_emb.weight", l.sz.vocab, l.sz.width),
			same("embed.pos", "pos_emb.weight", l.sz.context, l.sz.width),
		}, nil
	case *gptBlock:
		w, b := l.sz.width, l.name+"."
		t := "blocks." + strings.TrimPrefix(l.name, "block") + "."
		norm := func(n string) []TorchParam {
			return []TorchParam{same(b+n+".gain", t+n+".weight", w), same(b+n+".bias", t+n+".bias", w)}
		}
		var out []TorchParam
		out = append(out, norm("ln1")...)
		for _, n := range []string{"attn.q", "attn.k", "attn.v", "attn.proj"} {
			out = append(out, dense(b+n, t+n, w, w)...)
		}
		out = append(out, norm("ln2")...)
		out = append(out, dense(b+"mlp.fc", t+"mlp.fc", w, 4*w)...)
		return append(out, dense(b+"mlp.proj", t+"mlp.proj", 4*w, w)...), nil
	case *gptHead:
		w := l.sz.width
		out := []TorchParam{same("head.ln.gain", "ln_f.weight", w), same("head.ln.bias", "ln_f.bias", w)}
		if l.sz.tied {
			return append(out, same("head.tok", "tok_emb.weight", l.sz.vocab, w)), nil
		}
		return append(out, TorchParam{Name: "head.weight", Torch: "head.weight", Shape: []int{w, l.sz.vocab}, Transpose: true}), nil
	}
	return nil, fmt.Errorf("layer %s (%T) has no PyTorch names", l.Name(), l)
}
