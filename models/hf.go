package models

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Hugging Face checkpoint directories: a config.json naming the model
// (model_type llama or gpt2) and its weights under Hugging Face's names.
// SpecFromHF turns the config into a Spec, HFParams says where each of the
// model's parameters lies in the checkpoint's tensors and HFConfig writes
// the config of an export (docs/weights.md).

// HFModelTypes maps the model_type values read to the family built.
var HFModelTypes = map[string]string{"llama": "llama", "gpt2": "gpt"}

// hfMetadata are config.json keys that leave the model's function alone:
// names, token ids, the dtype of the weights on disk, generation and
// loading settings, initialisation.
var hfMetadata = []string{
	"_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
	"bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
	"use_cache", "initializer_range", "tokenizer_class", "return_dict", "output_attentions",
	"output_hidden_states", "id2label", "label2id", "task_specific_params", "prefix",
	"_attn_implementation", "_commit_hash", "is_encoder_decoder", "torchscript",
	// GPT2DoubleHeadsModel's classifier, absent from the LM.
	"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
	// pretraining's dropout: pipetrain trains without dropout.
	"resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout",
	// numerics only: the upcast to float32 pipetrain computes in anyway.
	"reorder_and_upcast_attn",
}

// hfConfig is a config.json read: its keys, and the file for errors.
type hfConfig struct {
	path string
	keys map[string]any
	used map[string]bool
}

func (c *hfConfig) errorf(key, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", c.path, key, fmt.Sprintf(format, args...))
}

// int reads a required (or, with def >= 0, optional) positive integer key.
func (c *hfConfig) int(key string, def int) (int, error) {
	c.used[key] = true
	v, ok := c.keys[key]
	if !ok || v == nil {
		if def >= 0 {
			return def, nil
		}
		return 0, c.errorf(key, "missing")
	}
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || f < 1 {
		return 0, c.errorf(key, "%v is not a positive integer", v)
	}
	return int(f), nil
}

func (c *hfConfig) number(key string, def float64) (float64, error) {
	c.used[key] = true
	v, ok := c.keys[key]
	if !ok || v == nil {
		return def, nil
	}
	f, ok := v.(float64)
	if !ok {
		return 0, c.errorf(key, "%v is not a number", v)
	}
	return f, nil
}

func (c *hfConfig) bool(key string, def bool) (bool, error) {
	c.used[key] = true
	v, ok := c.keys[key]
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, c.errorf(key, "%v is not true or false", v)
	}
	return b, nil
}

// must refuses key unless it is absent, null or one of the values pipetrain
// computes: a value that would change the model pipetrain cannot honour.
func (c *hfConfig) must(key string, why string, ok ...any) error {
	c.used[key] = true
	v, given := c.keys[key]
	if !given || v == nil || slices.Contains(ok, v) {
		return nil
	}
	return c.errorf(key, "%v is not supported: %s", v, why)
}

// SpecFromHF builds the model section of the Hugging Face checkpoint whose
// config.json is path, holding raw. given are the keys the config's model
// section sets beside `from` (lower case, without from): each must agree
// with config.json, except dtype (pipetrain's compute dtype, float32 when
// not given) and, for a Llama, context, at most max_position_embeddings
// (rotary positions have no parameters; GPT-2's position table has
// n_positions rows, so its context is n_positions). A key config.json
// holds that pipetrain does not read, or a value it cannot honour, is
// refused by name.
func SpecFromHF(path string, raw []byte, given map[string]any) (Spec, error) {
	c := &hfConfig{path: path, used: map[string]bool{}}
	if err := json.Unmarshal(raw, &c.keys); err != nil {
		return Spec{}, fmt.Errorf("%s: %v", path, err)
	}
	mt, _ := c.keys["model_type"].(string)
	var spec Spec
	var maxContext int
	var err error
	switch mt {
	case "llama":
		spec, maxContext, err = llamaFromHF(c)
	case "gpt2":
		spec, err = gpt2FromHF(c)
		maxContext = spec.Context
	default:
		return Spec{}, c.errorf("model_type", "%q is not read (llama, gpt2)", c.keys["model_type"])
	}
	if err != nil {
		return Spec{}, err
	}
	for _, k := range hfMetadata {
		c.used[k] = true
	}
	var unknown []string
	for k := range c.keys {
		if !c.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return Spec{}, fmt.Errorf("%s: %s not read by pipetrain's %s (a key it does not know may change the model)", path, strings.Join(unknown, ", "), spec.Name)
	}
	spec.DType = "float32"
	return spec, agreeWithHF(path, &spec, maxContext, given)
}

func llamaFromHF(c *hfConfig) (spec Spec, maxContext int, err error) {
	spec.Name = "llama"
	for _, f := range []struct {
		key string
		dst *int
	}{{"vocab_size", &spec.Vocab}, {"hidden_size", &spec.Width}, {"num_hidden_layers", &spec.Layers},
		{"num_attention_heads", &spec.Heads}, {"max_position_embeddings", &maxContext}} {
		if *f.dst, err = c.int(f.key, -1); err != nil {
			return
		}
	}
	spec.Context = maxContext
	own := map[string]any{}
	inter, err := c.int("intermediate_size", -1)
	if err != nil {
		return
	}
	own["intermediate"] = inter
	kv, err := c.int("num_key_value_heads", spec.Heads)
	if err != nil {
		return
	}
	own["kv_heads"] = kv
	if _, ok := c.keys["head_dim"]; ok && c.keys["head_dim"] != nil {
		hd, e := c.int("head_dim", -1)
		if err = e; err != nil {
			return
		}
		own["head_dim"] = hd
	}
	c.used["head_dim"] = true
	if own["rms_norm_eps"], err = c.number("rms_norm_eps", llamaDefaultEps); err != nil {
		return
	}
	if own["rope_theta"], err = c.number("rope_theta", llamaDefaultTheta); err != nil {
		return
	}
	if spec.TieEmbeddings, err = c.bool("tie_word_embeddings", false); err != nil {
		return
	}
	spec.Own = own
	for _, m := range []struct {
		key, why string
		ok       []any
	}{
		{"hidden_act", "pipetrain's Llama MLP is SwiGLU with silu", []any{"silu"}},
		{"rope_scaling", "pipetrain's rotary embedding is unscaled", nil},
		{"attention_bias", "pipetrain's Llama projections have no biases", []any{false}},
		{"mlp_bias", "pipetrain's Llama MLP has no biases", []any{false}},
		{"pretraining_tp", "pipetrain computes each projection whole", []any{1.0}},
	} {
		if err = c.must(m.key, m.why, m.ok...); err != nil {
			return
		}
	}
	return spec, maxContext, nil
}

// gpt2LayerNormEps is GPT-2's layer_norm_epsilon, the one pipetrain's GPT
// computes with (layerNormEps).
const gpt2LayerNormEps = layerNormEps

func gpt2FromHF(c *hfConfig) (spec Spec, err error) {
	spec.Name = "gpt"
	for _, f := range []struct {
		key string
		dst *int
	}{{"vocab_size", &spec.Vocab}, {"n_embd", &spec.Width}, {"n_layer", &spec.Layers},
		{"n_head", &spec.Heads}, {"n_positions", &spec.Context}} {
		if *f.dst, err = c.int(f.key, -1); err != nil {
			return
		}
	}
	if nctx, e := c.int("n_ctx", spec.Context); e != nil || nctx != spec.Context {
		if e != nil {
			return spec, e
		}
		return spec, c.errorf("n_ctx", "%d differs from n_positions %d", nctx, spec.Context)
	}
	if spec.TieEmbeddings, err = c.bool("tie_word_embeddings", true); err != nil {
		return
	}
	if inner, ok := c.keys["n_inner"]; ok && inner != nil && inner != float64(4*spec.Width) {
		return spec, c.errorf("n_inner", "%v is not supported: pipetrain's GPT MLP is 4·n_embd = %d wide", inner, 4*spec.Width)
	}
	c.used["n_inner"] = true
	eps, err := c.number("layer_norm_epsilon", gpt2LayerNormEps)
	if err != nil {
		return
	}
	if eps != gpt2LayerNormEps {
		return spec, c.errorf("layer_norm_epsilon", "%g is not supported: pipetrain's GPT normalises with %g", eps, gpt2LayerNormEps)
	}
	for _, m := range []struct {
		key, why string
		ok       []any
	}{
		{"activation_function", "pipetrain's GPT MLP uses GELU's tanh approximation (gelu_new)", []any{"gelu_new", "gelu_pytorch_tanh"}},
		{"scale_attn_weights", "pipetrain's attention scales by 1/sqrt(head width)", []any{true}},
		{"scale_attn_by_inverse_layer_idx", "pipetrain's attention scales every layer alike", []any{false}},
		{"add_cross_attention", "pipetrain's GPT is a decoder only", []any{false}},
	} {
		if err = c.must(m.key, m.why, m.ok...); err != nil {
			return
		}
	}
	return spec, nil
}

// agreeWithHF applies the keys the config gives beside `from`, refusing
// one that disagrees with config.json.
func agreeWithHF(path string, spec *Spec, maxContext int, given map[string]any) error {
	have := map[string]any{
		"name": spec.Name, "layers": spec.Layers, "width": spec.Width, "heads": spec.Heads,
		"context": spec.Context, "vocab": spec.Vocab, "tie_embeddings": spec.TieEmbeddings,
	}
	if spec.Name == "llama" && spec.Heads > 0 {
		have["head_dim"] = spec.Width / spec.Heads // what the family derives when not given
	}
	maps.Copy(have, spec.Own)
	for _, key := range slices.Sorted(maps.Keys(given)) {
		v := given[key]
		switch key {
		case "dtype":
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("model.dtype: %v is not a string", v)
			}
			spec.DType = s
			continue
		case "context":
			n, ok := asNumber(v)
			if spec.Name == "llama" && ok && n == math.Trunc(n) && n >= 1 && n <= float64(maxContext) {
				spec.Context = int(n)
				continue
			}
			if spec.Name == "llama" {
				return fmt.Errorf("model.context: %v must be a whole number from 1 to %s's max_position_embeddings %d", v, path, maxContext)
			}
		}
		want, known := have[key]
		if !known {
			return fmt.Errorf("model.%s: not set beside model.from: %s sets the %s model", key, path, spec.Name)
		}
		if !sameValue(v, want) {
			return fmt.Errorf("model.%s: %v disagrees with %s, which gives %v", key, v, path, want)
		}
	}
	return nil
}

func asNumber(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

func sameValue(a, b any) bool {
	if x, ok := asNumber(a); ok {
		y, ok := asNumber(b)
		return ok && x == y
	}
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// HFParam is where one of the model's parameters lies in a Hugging Face
// checkpoint: in tensor HF of shape HFShape, transposed ([out, in] of
// nn.Linear against pipetrain's [in, out]) or, with Cols, a slice of the
// last dimension (GPT-2's fused q/k/v).
type HFParam struct {
	Name    string
	Shape   []int
	HF      string
	HFShape []int
	// Transpose: the 2-D tensor is the parameter's transpose.
	Transpose bool
	// Cols, when Cols[1] > 0, is the range [lo, hi) of the tensor's last
	// dimension that holds the parameter.
	Cols [2]int
	// Copy marks the second holder of a tied weight, filled from the one
	// tensor the checkpoint keeps and not written again.
	Copy bool
}

// HFParams is the map of m, a llama or a gpt, to a Hugging Face checkpoint
// (LlamaForCausalLM's or GPT2LMHeadModel's names), in the model's order.
func HFParams(m *Model) ([]HFParam, error) {
	tps, err := TorchParams(m)
	if err != nil {
		return nil, err
	}
	var out []HFParam
	for _, p := range tps {
		h := HFParam{Name: p.Name, Shape: p.Shape, HF: p.Torch, HFShape: p.TorchShape, Transpose: p.Transpose, Copy: p.Copy}
		switch m.Spec.Name {
		case "llama":
		case "gpt":
			h, err = gpt2Param(p, m.Spec.Width)
			if err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("model %s has no Hugging Face layout (llama and gpt do)", m.Spec.Name)
		}
		out = append(out, h)
	}
	return out, nil
}

// gpt2Names maps the GPT's parameter names, after "block<i>.", to
// GPT2LMHeadModel's after "transformer.h.<i>.".
var gpt2Names = map[string]string{
	"ln1.gain": "ln_1.weight", "ln1.bias": "ln_1.bias", "ln2.gain": "ln_2.weight", "ln2.bias": "ln_2.bias",
	"attn.proj.weight": "attn.c_proj.weight", "attn.proj.bias": "attn.c_proj.bias",
	"mlp.fc.weight": "mlp.c_fc.weight", "mlp.fc.bias": "mlp.c_fc.bias",
	"mlp.proj.weight": "mlp.c_proj.weight", "mlp.proj.bias": "mlp.c_proj.bias",
}

// gpt2Param places p in GPT2LMHeadModel's tensors. GPT-2's Conv1D holds
// its weights [in, out], pipetrain's layout, so nothing transposes but an
// untied lm_head; q, k and v are thirds of c_attn's columns.
func gpt2Param(p TorchParam, width int) (HFParam, error) {
	h := HFParam{Name: p.Name, Shape: p.Shape, HFShape: p.Shape, Copy: p.Copy}
	switch p.Name {
	case "embed.tok", "head.tok":
		h.HF = "transformer.wte.weight"
		return h, nil
	case "embed.pos":
		h.HF = "transformer.wpe.weight"
		return h, nil
	case "head.ln.gain":
		h.HF = "transformer.ln_f.weight"
		return h, nil
	case "head.ln.bias":
		h.HF = "transformer.ln_f.bias"
		return h, nil
	case "head.weight":
		h.HF, h.HFShape, h.Transpose = "lm_head.weight", []int{p.Shape[1], p.Shape[0]}, true
		return h, nil
	}
	block, rest, ok := strings.Cut(strings.TrimPrefix(p.Name, "block"), ".")
	if !ok || !strings.HasPrefix(p.Name, "block") {
		return h, fmt.Errorf("gpt parameter %s has no GPT-2 name", p.Name)
	}
	prefix := "transformer.h." + block + "."
	if n, ok := gpt2Names[rest]; ok {
		h.HF = prefix + n
		return h, nil
	}
	for i, qkv := range []string{"attn.q.", "attn.k.", "attn.v."} {
		if kind, ok := strings.CutPrefix(rest, qkv); ok {
			h.HF = prefix + "attn.c_attn." + kind
			h.HFShape = slices.Clone(p.Shape)
			h.HFShape[len(h.HFShape)-1] = 3 * width
			h.Cols = [2]int{i * width, (i + 1) * width}
			return h, nil
		}
	}
	return h, fmt.Errorf("gpt parameter %s has no GPT-2 name", p.Name)
}

// HFConfig is the config.json of m as Hugging Face's LlamaForCausalLM or
// GPT2LMHeadModel reads it, over base (the config.json the model came
// from, whose other keys it keeps) when not nil; dtype is torch_dtype.
func HFConfig(m *Model, base map[string]any, dtype string) (map[string]any, error) {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]any{}
	}
	s := m.Spec
	switch s.Name {
	case "llama":
		var own llamaOwn
		if err := DecodeOwn(s, &own); err != nil {
			return nil, err
		}
		sz, err := llamaSizesOf(s)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, map[string]any{
			"model_type": "llama", "architectures": []any{"LlamaForCausalLM"},
			"vocab_size": sz.vocab, "hidden_size": sz.width, "intermediate_size": sz.intermediate,
			"num_hidden_layers": sz.layers, "num_attention_heads": sz.heads, "num_key_value_heads": sz.kvHeads,
			"head_dim": sz.headDim, "hidden_act": "silu", "rms_norm_eps": sz.eps, "rope_theta": sz.theta,
			"tie_word_embeddings": sz.tied, "attention_bias": false, "mlp_bias": false,
		})
		// A context cut shorter than the checkpoint's keeps its
		// max_position_embeddings: rotary positions have no parameters.
		if mpe, ok := asNumber(out["max_position_embeddings"]); !ok || mpe < float64(sz.context) {
			out["max_position_embeddings"] = sz.context
		}
	case "gpt":
		maps.Copy(out, map[string]any{
			"model_type": "gpt2", "architectures": []any{"GPT2LMHeadModel"},
			"vocab_size": s.Vocab, "n_embd": s.Width, "n_layer": s.Layers, "n_head": s.Heads,
			"n_positions": s.Context, "n_ctx": s.Context, "activation_function": "gelu_new",
			"layer_norm_epsilon": gpt2LayerNormEps, "tie_word_embeddings": s.TieEmbeddings,
		})
	default:
		return nil, fmt.Errorf("model %s has no Hugging Face config (llama and gpt do)", s.Name)
	}
	out["torch_dtype"] = dtype
	return out, nil
}
