package models

import (
	"fmt"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
)

// torchSpecs is a small spec of every registered model, tied and untied.
var torchSpecs = map[string]Spec{
	"mlp":                   {Name: "mlp", Input: 8, Hidden: []int{7, 6}, Classes: 3},
	"cnn":                   {Name: "cnn", Input: 64, Channels: []int{2, 3}, Classes: 4},
	"gpt":                   {Name: "gpt", Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11},
	"gpt (tied)":            {Name: "gpt", Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11, TieEmbeddings: true},
	"llama":                 tinyLlama("float32", false, 1),
	"llama (tied, grouped)": tinyLlama("float32", true, 2),
	"sequential":            testStack("float32"),
}

// TestTorchParamsMatchTheBuilders: the map lists every parameter each
// model's builders make, in their order and shapes; a model registered
// without an entry could not be exported or started from PyTorch's weights.
func TestTorchParamsMatchTheBuilders(t *testing.T) {
	for _, name := range Names() {
		if _, ok := torchSpecs[name]; !ok {
			t.Errorf("model %s: no spec in torchSpecs, so its PyTorch map is untested", name)
		}
	}
	for label, spec := range torchSpecs {
		m, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := TorchParams(m)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		var got, want []string
		for _, p := range ps {
			got = append(got, fmt.Sprintf("%s %v", p.Name, p.Shape))
		}
		g := G.NewGraph()
		in := m.ShapeAt(0, 1)
		h := G.NewTensor(g, m.DType, len(in), G.WithShape(in...), G.WithName("input"))
		for _, layer := range m.Layers {
			b, err := layer.Build(g, h, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range b.Params {
				want = append(want, fmt.Sprintf("%s %v", p.Name(), []int(p.Shape())))
			}
			h = b.Out
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the map lists\n%q\nthe builders make\n%q", label, got, want)
		}
		torchNames := map[string]bool{}
		for _, p := range ps {
			if size(p.Shape) != size(p.TorchShape) {
				t.Errorf("%s: %s %v exported as %v", label, p.Name, p.Shape, p.TorchShape)
			}
			if !p.Copy {
				if torchNames[p.Torch] {
					t.Errorf("%s: %s exported twice", label, p.Torch)
				}
				torchNames[p.Torch] = true
			}
		}
	}
}

func size(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// TestTorchNames pins the map docs/weights.md documents.
func TestTorchNames(t *testing.T) {
	want := map[string][]string{
		"mlp": {"fc0.weight [8 7] fc0.weight [7 8] T", "fc0.bias [7] fc0.bias [7]", "fc1.weight [7 6] fc1.weight [6 7] T", "fc1.bias [6] fc1.bias [6]",
			"fc2.weight [6 3] fc2.weight [3 6] T", "fc2.bias [3] fc2.bias [3]"},
		"cnn": {"conv0.weight [2 1 3 3] conv0.weight [2 1 3 3]", "conv0.bias [2] conv0.bias [2]", "conv1.weight [3 2 3 3] conv1.weight [3 2 3 3]",
			"conv1.bias [3] conv1.bias [3]", "fc.weight [12 4] fc.weight [4 12] T", "fc.bias [4] fc.bias [4]"},
		"gpt (tied)": {"embed.tok [11 8] tok_emb.weight [11 8]", "embed.pos [5 8] pos_emb.weight [5 8]",
			"block0.ln1.gain [8] blocks.0.ln1.weight [8]", "block0.ln1.bias [8] blocks.0.ln1.bias [8]",
			"block0.attn.q.weight [8 8] blocks.0.attn.q.weight [8 8] T", "block0.attn.q.bias [8] blocks.0.attn.q.bias [8]",
			"block0.attn.k.weight [8 8] blocks.0.attn.k.weight [8 8] T", "block0.attn.k.bias [8] blocks.0.attn.k.bias [8]",
			"block0.attn.v.weight [8 8] blocks.0.attn.v.weight [8 8] T", "block0.attn.v.bias [8] blocks.0.attn.v.bias [8]",
			"block0.attn.proj.weight [8 8] blocks.0.attn.proj.weight [8 8] T", "block0.attn.proj.bias [8] blocks.0.attn.proj.bias [8]",
			"block0.ln2.gain [8] blocks.0.ln2.weight [8]", "block0.ln2.bias [8] blocks.0.ln2.bias [8]",
			"block0.mlp.fc.weight [8 32] blocks.0.mlp.fc.weight [32 8] T", "block0.mlp.fc.bias [32] blocks.0.mlp.fc.bias [32]",
			"block0.mlp.proj.weight [32 8] blocks.0.mlp.proj.weight [8 32] T", "block0.mlp.proj.bias [8] blocks.0.mlp.proj.bias [8]"},
	}
	for label, lines := range want {
		m, err := Build(torchSpecs[label])
		if err != nil {
			t.Fatal(err)
		}
		ps, err := TorchParams(m)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range ps {
			l := fmt.Sprintf("%s %v %s %v", p.Name, p.Shape, p.Torch, p.TorchShape)
			if p.Transpose {
				l += " T"
			}
			if p.Copy {
				l += " copy"
			}
			got = append(got, l)
		}
		if label == "gpt (tied)" {
			if tail := got[len(got)-3:]; !slices.Equal(tail, []string{"head.ln.gain [8] ln_f.weight [8]", "head.ln.bias [8] ln_f.bias [8]", "head.tok [11 8] tok_emb.weight [11 8] copy"}) {
				t.Errorf("tied GPT head: %q", tail)
			}
			got = got[:len(lines)]
		}
		if !slices.Equal(got, lines) {
			t.Errorf("%s map:\n%q\nwant\n%q", label, got, lines)
		}
	}
	// llama is the map of the tiny Llama's embedding and blocks, whose
	// keys and values are kvw wide.
	llama := func(kvw int) []string {
		out := []string{"embed.tok [11 8] model.embed_tokens.weight [11 8]"}
		kv := fmt.Sprintf("[8 %d] %%s [%d 8] T", kvw, kvw)
		for _, i := range []string{"0", "1"} {
			b, t := "block"+i+".", "model.layers."+i+"."
			out = append(out, b+"attn_norm.gain [8] "+t+"input_layernorm.weight [8]",
				b+"attn.q.weight [8 16] "+t+"self_attn.q_proj.weight [16 8] T",
				b+"attn.k.weight "+fmt.Sprintf(kv, t+"self_attn.k_proj.weight"), b+"attn.v.weight "+fmt.Sprintf(kv, t+"self_attn.v_proj.weight"),
				b+"attn.o.weight [16 8] "+t+"self_attn.o_proj.weight [8 16] T",
				b+"mlp_norm.gain [8] "+t+"post_attention_layernorm.weight [8]",
				b+"mlp.gate.weight [8 12] "+t+"mlp.gate_proj.weight [12 8] T", b+"mlp.up.weight [8 12] "+t+"mlp.up_proj.weight [12 8] T",
				b+"mlp.down.weight [12 8] "+t+"mlp.down_proj.weight [8 12] T")
		}
		return out
	}
	for label, want := range map[string][]string{
		"llama": append(llama(4), "head.norm.gain [8] model.norm.weight [8]", "head.weight [8 11] lm_head.weight [11 8] T"),
		"llama (tied, grouped)": append(llama(8), "head.norm.gain [8] model.norm.weight [8]",
			"head.tok [11 8] model.embed_tokens.weight [11 8] copy"),
	} {
		m, err := Build(torchSpecs[label])
		if err != nil {
			t.Fatal(err)
		}
		ps, err := TorchParams(m)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range ps {
			l := fmt.Sprintf("%s %v %s %v", p.Name, p.Shape, p.Torch, p.TorchShape)
			if p.Transpose {
				l += " T"
			}
			if p.Copy {
				l += " copy"
			}
			got = append(got, l)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s map:\n%q\nwant\n%q", label, got, want)
		}
	}
	m, _ := Build(torchSpecs["gpt"])
	ps, _ := TorchParams(m)
	if last := ps[len(ps)-1]; last.Name != "head.weight" || last.Torch != "head.weight" || !slices.Equal(last.TorchShape, []int{11, 8}) || !last.Transpose || last.Copy {
		t.Errorf("untied GPT head: %+v", last)
	}
}
