// Package familytest_test registers a model family from outside package
// models, as a program embedding pipetrain would: its own validation, its
// own documentation, layers composed from models' exported constructors and
// a layer type of its own with its PyTorch names. It lives apart from
// models' tests so that the toy family does not join the registry those
// tests list.
package familytest_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// toy is "two Dense layers and a learned per-class scale": model.hidden must
// give exactly one width.
type toy struct{}

func (toy) Name() string { return "toy" }

func (toy) Doc() models.FamilyDoc {
	return models.FamilyDoc{Summary: "two Dense layers and a scale", Keys: []models.KeyDoc{
		{Key: "input", Doc: "Features of an example."},
		{Key: "hidden", Doc: "The one hidden width."},
		{Key: "classes", Doc: "Classes predicted."},
		{Key: "gain", Type: "number", Doc: "The scale's initial value (1 when not given)."},
	}}
}

func (toy) Build(spec models.Spec) (*models.Model, error) {
	var errs models.SpecErrors
	if spec.Input < 1 {
		errs = append(errs, models.SpecError{Field: "input", Msg: fmt.Sprintf("must be at least 1, got %d", spec.Input)})
	}
	if len(spec.Hidden) != 1 {
		errs = append(errs, models.SpecError{Field: "hidden", Msg: fmt.Sprintf("%d widths; the toy model has one hidden layer", len(spec.Hidden))})
	}
	if spec.Classes < 2 {
		errs = append(errs, models.SpecError{Field: "classes", Msg: fmt.Sprintf("must be at least 2, got %d", spec.Classes)})
	}
	dt, err := models.ParseDType(spec.DType)
	if err != nil {
		errs = append(errs, models.SpecError{Field: "dtype", Msg: err.Error()})
	}
	own := struct {
		Gain *float64 `json:"gain"`
	}{}
	var ownErrs models.SpecErrors
	if errors.As(models.DecodeOwn(spec, &own), &ownErrs) {
		errs = append(errs, ownErrs...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	in, err := models.NewDense(models.DenseSpec{Name: "in", In: spec.Input, Out: spec.Hidden[0], Activation: "tanh", DType: dt})
	if err != nil {
		return nil, err
	}
	out, err := models.NewDense(models.DenseSpec{Name: "out", In: spec.Hidden[0], Out: spec.Classes, DType: dt})
	if err != nil {
		return nil, err
	}
	return &models.Model{Spec: spec, DType: dt, Example: tensor.Shape{spec.Input}, Classes: spec.Classes,
		Layers: []models.Layer{in, out, &scale{n: spec.Classes, gain: cmp.Or(own.Gain, &one), dt: dt}}}, nil
}

// scale is y = x ⊙ s with s one learned factor per column, a layer type
// models does not have; PyTorch holds s as "scale.s".
type scale struct {
	n    int
	gain *float64
	dt   tensor.Dtype
}

var one = 1.0

func (l *scale) Name() string                          { return "scale" }
func (l *scale) OutShape(in tensor.Shape) tensor.Shape { return in.Clone() }

func (l *scale) Build(g *G.ExprGraph, x *G.Node, seed uint64) (models.Built, error) {
	init := tensor.New(tensor.Of(l.dt), tensor.WithShape(l.n))
	for i := range l.n {
		if err := init.SetAt(convert(*l.gain, l.dt), i); err != nil {
			return models.Built{}, err
		}
	}
	s := G.NewVector(g, l.dt, G.WithShape(l.n), G.WithName("scale.s"), G.WithValue(init))
	y, err := G.BroadcastHadamardProd(x, s, nil, []byte{0})
	if err != nil {
		return models.Built{}, fmt.Errorf("scale: %w", err)
	}
	return models.Built{Out: y, Params: []*G.Node{s}}, nil
}

// convert is v in dtype dt.
func convert(v float64, dt tensor.Dtype) any {
	if dt == tensor.Float32 {
		return float32(v)
	}
	return v
}

func (l *scale) TorchParams() []models.TorchParam {
	return []models.TorchParam{{Name: "scale.s", Torch: "scale.s", Shape: []int{l.n}}}
}

func init() { models.Register(toy{}) }

// TestOutsideFamilyBuilds: a family registered from outside is listed, built
// by models.Build, counted and mapped to PyTorch names, its own layer type's
// through models.TorchNamed.
func TestOutsideFamilyBuilds(t *testing.T) {
	if !slices.Contains(models.Names(), "toy") {
		t.Fatalf("Names() = %v, want toy among them", models.Names())
	}
	if f, ok := models.Lookup("toy"); !ok || f.Doc().Summary == "" {
		t.Fatalf("Lookup(toy) = %v, %v", f, ok)
	}
	m, err := models.Build(models.Spec{Name: "toy", Input: 5, Hidden: []int{4}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.ShapeAt(len(m.Layers), 2); !got.Eq(tensor.Shape{2, 3}) {
		t.Errorf("output shape %v, want (2, 3)", got)
	}
	if n, err := models.ParamCount(m, 0, len(m.Layers)); err != nil || n != 5*4+4+4*3+3+3 {
		t.Errorf("ParamCount = %d, %v; want %d", n, err, 5*4+4+4*3+3+3)
	}
	ps, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, fmt.Sprintf("%s %v %s %v %v", p.Name, p.Shape, p.Torch, p.TorchShape, p.Transpose))
	}
	want := []string{"in.weight [5 4] in.weight [4 5] true", "in.bias [4] in.bias [4] false",
		"out.weight [4 3] out.weight [3 4] true", "out.bias [3] out.bias [3] false", "scale.s [3] scale.s [3] false"}
	if !slices.Equal(got, want) {
		t.Errorf("TorchParams:\n%q\nwant\n%q", got, want)
	}
}

// TestOutsideFamilyReportsEveryProblem: the family's own validation comes
// back through models.Build field by field, as the built-in families' does.
func TestOutsideFamilyReportsEveryProblem(t *testing.T) {
	_, err := models.Build(models.Spec{Name: "toy", Input: 0, Hidden: []int{4, 4}, Classes: 1})
	var got models.SpecErrors
	if !errors.As(err, &got) {
		t.Fatalf("error %v (%T), want SpecErrors", err, err)
	}
	var fields []string
	for _, e := range got {
		fields = append(fields, e.Field)
	}
	if !slices.Equal(fields, []string{"input", "hidden", "classes"}) {
		t.Errorf("problems in %v (%v), want input, hidden, classes", fields, err)
	}
	if !strings.Contains(err.Error(), "model.hidden: 2 widths") {
		t.Errorf("Error() = %q, want model.hidden named", err)
	}
}

// TestLayerWithoutTorchNames: a model with a layer that is no
// models.TorchNamed has no PyTorch map, and the error names the layer.
func TestLayerWithoutTorchNames(t *testing.T) {
	d, err := models.NewDense(models.DenseSpec{Name: "fc", In: 2, Out: 2})
	if err != nil {
		t.Fatal(err)
	}
	m := &models.Model{Spec: models.Spec{Name: "bare"}, DType: tensor.Float32, Example: tensor.Shape{2}, Classes: 2,
		Layers: []models.Layer{d, unnamed{d}}}
	if _, err := models.TorchParams(m); err == nil || !strings.Contains(err.Error(), "layer fc2") || !strings.Contains(err.Error(), "no PyTorch names") {
		t.Errorf("TorchParams = %v, want layer fc2 named as having no PyTorch names", err)
	}
}

// unnamed is a layer that does not say its PyTorch names.
type unnamed struct{ d *models.Dense }

func (u unnamed) Name() string                          { return "fc2" }
func (u unnamed) OutShape(in tensor.Shape) tensor.Shape { return u.d.OutShape(in) }
func (u unnamed) Build(g *G.ExprGraph, x *G.Node, seed uint64) (models.Built, error) {
	return u.d.Build(g, x, seed)
}

// TestLayerConstructorsCheckTheirSpecs: NewDense and NewConv refuse a bad
// spec naming the layer and every field at fault, and make the layers the
// built-in families make from a good one.
func TestLayerConstructorsCheckTheirSpecs(t *testing.T) {
	_, err := models.NewDense(models.DenseSpec{In: 0, Out: 3, Activation: "gelu"})
	if err == nil || !strings.Contains(err.Error(), `dense layer "": name: empty`) || !strings.Contains(err.Error(), "; in: must be at least 1, got 0") || !strings.Contains(err.Error(), `; activation: unknown activation "gelu"`) {
		t.Errorf("NewDense: %v", err)
	}
	_, err = models.NewConv(models.ConvSpec{Name: "conv0", In: 1, Out: 2, Size: 1, DType: tensor.Int32})
	if err == nil || !strings.Contains(err.Error(), `conv layer "conv0": size: must be at least 2, got 1; dtype: int32 is not one of float32, float64`) {
		t.Errorf("NewConv: %v", err)
	}
	m, err := models.Build(models.Spec{Name: "cnn", Input: 64, Channels: []int{2}, Classes: 4})
	if err != nil {
		t.Fatal(err)
	}
	conv, err := models.NewConv(models.ConvSpec{Name: "conv0", In: 1, Out: 2, Size: 8})
	if err != nil {
		t.Fatal(err)
	}
	fc, err := models.NewDense(models.DenseSpec{Name: "fc", In: 2 * 4 * 4, Out: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range []models.Layer{conv, fc} {
		if got, want := fmt.Sprintf("%+v", l), fmt.Sprintf("%+v", m.Layers[i]); got != want {
			t.Errorf("layer %d: %s, the cnn family makes %s", i, got, want)
		}
	}
}

// TestOutsideFamilyInConfigs: a config naming the toy family is validated by
// it, every problem named as a model field, and the config schema lists the
// family and takes its description of the keys it reads (grouped with
// hf-toy's, which are the same words).
func TestOutsideFamilyInConfigs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "toy.yaml")
	yaml := "model: {name: toy, input: 5, hidden: [4, 4], classes: 1}\nstages:\n  - {layers: \"0-2\", address: 127.0.0.1:7001}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := configs.Load(path)
	var p *configs.Problems
	if !errors.As(err, &p) {
		t.Fatalf("Load: %v (%T), want *configs.Problems", err, err)
	}
	for _, want := range []string{"model.hidden: 2 widths; the toy model has one hidden layer", "model.classes: must be at least 2, got 1"} {
		if !slices.Contains(p.Items, want) {
			t.Errorf("Load's problems %q lack %q", p.Items, want)
		}
	}
	raw, err := configs.Schema()
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Model struct {
				Properties map[string]struct {
					Description string
					Enum        []string
				}
			}
		}
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	keys := schema.Properties.Model.Properties
	if name := keys["name"]; !slices.Contains(name.Enum, "toy") || !strings.Contains(name.Description, "toy (two Dense layers and a scale)") {
		t.Errorf("model.name in the schema: %+v, want toy listed and described", name)
	}
	if got, want := keys["hidden"].Description, "hf-toy, toy: The one hidden width. mlp: Widths of the hidden Dense layers, in order: the layers are fc0, fc1, ..., the last emitting the classes."; got != want {
		t.Errorf("model.hidden in the schema: %q, want %q", got, want)
	}
}

// TestGPTLayersComposeOutside: the GPT's layers built one by one from
// GPTSpec are the layers model gpt builds, and a bad spec is refused naming
// the layer and each field.
func TestGPTLayersComposeOutside(t *testing.T) {
	m, err := models.Build(models.Spec{Name: "gpt", DType: "float64", Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11, TieEmbeddings: true})
	if err != nil {
		t.Fatal(err)
	}
	s := models.GPTSpec{Layers: 2, Width: 8, Heads: 2, Context: 5, Vocab: 11, TieEmbeddings: true, DType: tensor.Float64}
	var layers []models.Layer
	add := func(l models.Layer, err error) {
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	add(models.NewGPTEmbed(s))
	for i := range s.Layers {
		add(models.NewGPTBlock(i, s))
	}
	add(models.NewGPTHead(s))
	if len(layers) != len(m.Layers) {
		t.Fatalf("%d layers composed, model gpt has %d", len(layers), len(m.Layers))
	}
	for i, l := range layers {
		if got, want := fmt.Sprintf("%+v", l), fmt.Sprintf("%+v", m.Layers[i]); got != want {
			t.Errorf("layer %d: %s, model gpt makes %s", i, got, want)
		}
	}
	_, err = models.NewGPTBlock(0, models.GPTSpec{Layers: 1, Width: 8, Heads: 3, Context: 0, Vocab: 11})
	if err == nil || err.Error() != `gpt block layer "block0": context: must be at least 1, got 0; heads: 3 does not divide model.width 8` {
		t.Errorf("NewGPTBlock: %v", err)
	}
	if _, err := models.NewGPTBlock(2, s); err == nil || !strings.Contains(err.Error(), "index 2 outside the model's 2 blocks") {
		t.Errorf("NewGPTBlock(2): %v", err)
	}
}

// TestOutsideFamilyOwnKeys: a key only the toy family reads (gain, in
// models.Spec.Own) is taken in a config naming it and decoded by the family;
// misspelt, of the wrong type, or in a config of another family, it is
// refused naming model.gain; the schema lists it with its type.
func TestOutsideFamilyOwnKeys(t *testing.T) {
	const base = "model: {name: %s, input: 5, hidden: [4], classes: 3, %s}\nstages:\n  - {layers: \"0-2\", address: 127.0.0.1:7001}\n"
	modelProblems := func(family, extra string) ([]string, *configs.Config) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(base, family, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := configs.LoadUnchecked(path)
		if err != nil {
			t.Fatalf("%s: %v", extra, err)
		}
		var p *configs.Problems
		var out []string
		if errors.As(c.Validate(), &p) {
			for _, item := range p.Items {
				if strings.HasPrefix(item, "model") {
					out = append(out, item)
				}
			}
		}
		return out, c
	}
	if got, c := modelProblems("toy", "gain: 0.5"); len(got) > 0 {
		t.Errorf("gain: 0.5: %q", got)
	} else if m, err := models.Build(c.Model); err != nil {
		t.Error(err)
	} else if g := m.Layers[2].(*scale).gain; *g != 0.5 {
		t.Errorf("the scale starts at %v, want 0.5", *g)
	}
	for _, c := range []struct{ family, extra, want string }{
		{"toy", "gian: 0.5", "model.gian: unknown key (did you mean gain?)"},
		{"toy", "gain: big", "model.gain: a string, want a number"},
		{"mlp", "gain: 0.5", "model.gain: unknown key"},
	} {
		got, _ := modelProblems(c.family, c.extra)
		if len(got) != 1 || !strings.HasPrefix(got[0], c.want) {
			t.Errorf("model %s with %s: problems %q, want one starting %q", c.family, c.extra, got, c.want)
		}
	}
	raw, err := configs.Schema()
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Model struct {
				Properties map[string]map[string]any
			}
		}
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	if gain := schema.Properties.Model.Properties["gain"]; gain["type"] != "number" || gain["description"] != "hf-toy, toy: The scale's initial value (1 when not given)." {
		t.Errorf("model.gain in the schema: %v", gain)
	}
}

// hfToy is toy under Hugging Face-style names: "model." before each of its
// layers' PyTorch names.
type hfToy struct{ toy }

func (hfToy) Name() string                         { return "hf-toy" }
func (hfToy) TorchName(p models.TorchParam) string { return "model." + p.Torch }

func init() { models.Register(hfToy{}) }

// TestFamilyRenamesTorchNames: a models.TorchRenamer family names its
// parameters on the PyTorch side; layouts stay its layers'.
func TestFamilyRenamesTorchNames(t *testing.T) {
	spec := models.Spec{Name: "hf-toy", Input: 5, Hidden: []int{4}, Classes: 3}
	m, err := models.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := models.TorchParams(m)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, fmt.Sprintf("%s %s %v", p.Name, p.Torch, p.TorchShape))
	}
	want := []string{"in.weight model.in.weight [4 5]", "in.bias model.in.bias [4]", "out.weight model.out.weight [3 4]",
		"out.bias model.out.bias [3]", "scale.s model.scale.s [3]"}
	if !slices.Equal(got, want) {
		t.Errorf("TorchParams:\n%q\nwant\n%q", got, want)
	}
}
