package models

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// tinyGPT is the spec of the gradient-checked model.
func tinyGPT(dtype string, tied bool) Spec {
	return Spec{Name: "gpt", DType: dtype, Layers: 2, Width: 8, Heads: 2, Context: 4, Vocab: 11, TieEmbeddings: tied}
}

func buildModel(t *testing.T, spec Spec) *Model {
	t.Helper()
	m, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// paramNames builds each layer alone and lists its parameter names.
func paramNames(t *testing.T, m *Model, batch int) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for i, l := range m.Layers {
		s := buildTestStage(t, m, i, i+1, batch, 1)
		for _, p := range s.params {
			out[l.Name()] = append(out[l.Name()], p.Name())
		}
	}
	return out
}

func TestGPTLayout(t *testing.T) {
	m := buildModel(t, tinyGPT("float32", true))
	var names []string
	for _, l := range m.Layers {
		names = append(names, l.Name())
	}
	if want := []string{"embed", "block0", "block1", "head"}; !slices.Equal(names, want) {
		t.Fatalf("layers %v, want %v", names, want)
	}
	for i, want := range []tensor.Shape{{3, 4}, {12, 8}, {12, 8}, {12, 8}, {12, 11}} {
		if got := m.ShapeAt(i, 3); !got.Eq(want) {
			t.Errorf("ShapeAt(%d) = %v, want %v", i, got, want)
		}
	}
	if m.Classes != 11 || m.Targets() != 4 || !m.Example.Eq(tensor.Shape{4}) {
		t.Errorf("Classes %d, Targets %d, Example %v", m.Classes, m.Targets(), m.Example)
	}
	if want := [][2]string{{"embed.tok", "head.tok"}}; !slices.Equal(m.Tied, want) {
		t.Errorf("Tied = %v, want %v", m.Tied, want)
	}
	params := paramNames(t, m, 2)
	wantBlock := []string{"ln1.gain", "ln1.bias", "attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias",
		"attn.v.weight", "attn.v.bias", "attn.proj.weight", "attn.proj.bias", "ln2.gain", "ln2.bias",
		"mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"}
	for _, c := range []struct {
		layer string
		want  []string
	}{
		{"embed", []string{"embed.tok", "embed.pos"}},
		{"block1", prefixed("block1.", wantBlock)},
		{"head", []string{"head.ln.gain", "head.ln.bias", "head.tok"}},
	} {
		if !slices.Equal(params[c.layer], c.want) {
			t.Errorf("%s params %v, want %v", c.layer, params[c.layer], c.want)
		}
	}

	untied := buildModel(t, tinyGPT("float32", false))
	if untied.Tied != nil {
		t.Errorf("untied model has Tied = %v", untied.Tied)
	}
	if got := paramNames(t, untied, 2)["head"]; !slices.Equal(got, []string{"head.ln.gain", "head.ln.bias", "head.weight"}) {
		t.Errorf("untied head params %v", got)
	}
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

func TestGPTBuildErrors(t *testing.T) {
	ok := Spec{Name: "gpt", Layers: 2, Width: 64, Heads: 4, Context: 16, Vocab: 256}
	with := func(f func(*Spec)) Spec { s := ok; f(&s); return s }
	cases := []struct {
		spec Spec
		want string
	}{
		{with(func(s *Spec) { s.Heads = 3 }), "model.heads: 3 does not divide model.width 64"},
		{with(func(s *Spec) { s.Layers = 0 }), "model.layers: must be at least 1, got 0"},
		{with(func(s *Spec) { s.Width = -1 }), "model.width: must be at least 1, got -1"},
		{with(func(s *Spec) { s.Heads = 0 }), "model.heads: must be at least 1, got 0"},
		{with(func(s *Spec) { s.Context = 0 }), "model.context: must be at least 1, got 0"},
		{with(func(s *Spec) { s.Vocab = 1 }), "model.vocab: must be at least 2, got 1"},
		{with(func(s *Spec) { s.Vocab = 1<<24 + 1 }), "model.vocab: 16777217 is too large for float32 token ids"},
		{with(func(s *Spec) { s.DType = "int8" }), `model.dtype: unknown dtype "int8"`},
	}
	for _, c := range cases {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.spec, err, c.want)
		}
	}
	// The image classifiers' config defaults must not get in the way.
	if m, err := Build(with(func(s *Spec) { s.Input, s.Classes = 784, 10 })); err != nil || m.Classes != 256 {
		t.Errorf("valid spec: %v", err)
	}
}

// TestGPTTiedInit: the head's copy of the token table must start bit-identical
// to the embedding's, whichever stage builds each, or tied training diverges
// from the first step.
func TestGPTTiedInit(t *testing.T) {
	for _, dt := range []string{"float32", "float64"} {
		m := buildModel(t, tinyGPT(dt, true))
		embed := buildTestStage(t, m, 0, 1, 2, 21).params[0]
		head := buildTestStage(t, m, len(m.Layers)-1, len(m.Layers), 2, 21).params[2]
		if embed.Name() != "embed.tok" || head.Name() != "head.tok" {
			t.Fatalf("got %s and %s", embed.Name(), head.Name())
		}
		a, b := embed.Value().(*tensor.Dense), head.Value().(*tensor.Dense)
		if !a.Shape().Eq(b.Shape()) || !sameBits(a, b) {
			t.Errorf("%s: head.tok differs from embed.tok", dt)
		}
		if a.Uintptr() == b.Uintptr() {
			t.Errorf("%s: head.tok shares embed.tok's memory; each stage must own its copy", dt)
		}
	}
}

// sameBits reports whether two float tensors hold identical bit patterns.
func sameBits(a, b *tensor.Dense) bool {
	switch x := a.Data().(type) {
	case []float32:
		y, ok := b.Data().([]float32)
		return ok && slices.Equal(x, y)
	case []float64:
		y, ok := b.Data().([]float64)
		return ok && slices.Equal(x, y)
	}
	return false
}

// TestGPTGradients checks the symbolic gradient of the whole tiny GPT's loss
// with respect to every parameter against central differences (a spread of
// entries per parameter, to keep the test fast).
func TestGPTGradients(t *testing.T) {
	for _, tied := range []bool{true, false} {
		m := buildModel(t, tinyGPT("float64", tied))
		// Larger weights than the 0.02 init, so attention is far from uniform
		// and every path carries a sizeable gradient.
		const batch = 2
		s := buildTestStage(t, m, 0, len(m.Layers), batch, 3)
		r := rand.New(rand.NewPCG(8, 8))
		for _, p := range s.params {
			for i, v := range p.Value().Data().([]float64) {
				p.Value().Data().([]float64)[i] = v + r.NormFloat64()*0.3
			}
		}
		x, y := randomBatch(m, batch, r)
		if err := G.Let(s.x, x); err != nil {
			t.Fatal(err)
		}
		if err := G.Let(s.onehot, oneHotTargets(m, y)); err != nil {
			t.Fatal(err)
		}
		checkGraphGrads(t, s.g, s.out, s.params, 12)
	}
}

func TestGPTSplitEquivalence(t *testing.T) {
	for _, dt := range []string{"float32", "float64"} {
		for _, tied := range []bool{true, false} {
			checkSplitEquivalence(t, buildModel(t, tinyGPT(dt, tied)), 3)
		}
	}
}

func TestGPTFloat32Backward(t *testing.T) {
	checkFloat32Backward(t, tinyGPT("", true), 2)
}

// TestPartsRebuildTheirTaps: each part of each layer, rebuilt alone by
// BuildPart from its input's value, computes its tap's bits; together the
// parts hold every parameter once. A zero-bubble weight pass relies on both.
func TestPartsRebuildTheirTaps(t *testing.T) {
	for _, spec := range []Spec{tinyGPT("float32", true), tinyGPT("float64", false), tinyLlama("float32", true, 2), tinyLlama("float64", false, 1),
		{Name: "mlp", DType: "float32", Input: 6, Hidden: []int{5}, Classes: 3}} {
		m := buildModel(t, spec)
		r := rand.New(rand.NewPCG(14, 14))
		x, _ := randomBatch(m, 2, r)
		for _, l := range m.Layers {
			sl, ok := l.(Splittable)
			if !ok {
				t.Fatalf("%s %s is not Splittable", spec.Name, l.Name())
			}
			g := G.NewGraph()
			in := G.NewTensor(g, m.DType, x.Dims(), G.WithShape(x.Shape()...), G.WithName("input"), G.WithValue(x))
			b, err := l.Build(g, in, 4)
			if err != nil {
				t.Fatal(err)
			}
			var reads []G.Value
			for range b.Parts {
				reads = append(reads, nil, nil)
			}
			for i, p := range b.Parts {
				G.Read(p.In, &reads[2*i])
				G.Read(p.Tap, &reads[2*i+1])
			}
			vm := G.NewTapeMachine(g)
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			vm.Close()
			owned := map[*G.Node]int{}
			for i, p := range b.Parts {
				for _, n := range p.Params {
					owned[n]++
				}
				pg := G.NewGraph()
				v := reads[2*i].(*tensor.Dense)
				px := G.NewTensor(pg, m.DType, v.Dims(), G.WithShape(v.Shape()...), G.WithName("x"), G.WithValue(v))
				var ps []*G.Node
				for _, n := range p.Params {
					ps = append(ps, newParam(pg, n.Name(), n.Value().(*tensor.Dense)))
				}
				tap, err := sl.BuildPart(pg, i, px, ps)
				if err != nil {
					t.Fatal(err)
				}
				pvm := G.NewTapeMachine(pg)
				if err := pvm.RunAll(); err != nil {
					t.Fatal(err)
				}
				got := tap.Value().(*tensor.Dense)
				if got.IsMaterializable() {
					got = got.Materialize().(*tensor.Dense)
				}
				if !sameBits(got, reads[2*i+1].(*tensor.Dense)) {
					t.Errorf("%s %s part %d: rebuilt tap differs from the layer's", spec.Name, l.Name(), i)
				}
				pvm.Close()
			}
			for _, n := range b.Params {
				if owned[n] != 1 {
					t.Errorf("%s %s: %s is in %d parts", spec.Name, l.Name(), n.Name(), owned[n])
				}
			}
			if _, err := sl.BuildPart(G.NewGraph(), len(b.Parts), in, nil); err == nil {
				t.Errorf("%s %s: part %d of %d accepted", spec.Name, l.Name(), len(b.Parts), len(b.Parts))
			}
			out := b.Out.Value().(*tensor.Dense)
			if out.IsMaterializable() {
				out = out.Materialize().(*tensor.Dense)
			}
			x = out.Clone().(*tensor.Dense)
		}
	}
}
