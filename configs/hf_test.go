package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const hfLlama = `{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 256,
 "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "hidden_act": "silu", "attention_bias": false, "rope_scaling": null, "tie_word_embeddings": true,
 "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", "transformers_version": "4.44.0"%s}`

const hfGPT2 = `{"model_type": "gpt2", "vocab_size": 256, "n_embd": 16, "n_layer": 2, "n_head": 2,
 "n_positions": 8, "n_ctx": 8, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
 "resid_pdrop": 0.1, "scale_attn_weights": true%s}`

// loadFrom loads a config of model section model whose model.from is a
// folder ck holding config.json.
func loadFrom(t *testing.T, configJSON, model string) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "ck"), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "ck", "config.json"), []byte(configJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("model: "+model+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadUnchecked(path)
}

// TestModelFromHF: model.from builds the model section from config.json
// (llama and gpt2), keys beside it agreeing, dtype and a Llama's context
// chosen by the config.
func TestModelFromHF(t *testing.T) {
	c, err := loadFrom(t, strings.Replace(hfLlama, "%s", "", 1), "{from: ck, context: 32, kv_heads: 2, head_dim: 4, tie_embeddings: true, dtype: float64}")
	if err != nil {
		t.Fatal(err)
	}
	m := c.Model
	if m.Name != "llama" || m.Width != 16 || m.Layers != 2 || m.Heads != 4 || m.Vocab != 256 || m.Context != 32 ||
		!m.TieEmbeddings || m.DType != "float64" || m.Own["kv_heads"] != 2 || m.Own["intermediate"] != 24 ||
		m.Own["rope_theta"] != 500000.0 || m.Own["rms_norm_eps"] != 1e-5 {
		t.Errorf("llama: model section %+v", m)
	}
	var p Problems
	c.validateModelKeysOnly(&p)
	if len(p.Items) > 0 {
		t.Errorf("llama: %v", p.Items)
	}
	c, err = loadFrom(t, strings.Replace(hfGPT2, "%s", `, "tie_word_embeddings": false`, 1), "{from: ck, name: gpt, tie_embeddings: false}")
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Model; m.Name != "gpt" || m.Width != 16 || m.Layers != 2 || m.Heads != 2 || m.Context != 8 || m.TieEmbeddings || m.DType != "float32" {
		t.Errorf("gpt2: model section %+v", m)
	}
}

// validateModelKeysOnly reports the unknown keys LoadUnchecked found.
func (c *Config) validateModelKeysOnly(p *Problems) { p.Items = append(p.Items, c.keyProblems...) }

// TestModelFromHFRefuses names each key the model cannot honour.
func TestModelFromHFRefuses(t *testing.T) {
	for _, c := range []struct {
		config, model, want string
	}{
		{strings.Replace(hfLlama, "%s", `, "rope_scaling": {"type": "linear", "factor": 2.0}`, 1), "{from: ck}", "rope_scaling: map[factor:2 type:linear] is not supported"},
		{strings.Replace(hfLlama, "%s", `, "attention_bias": true`, 1), "{from: ck}", "attention_bias: true is not supported"},
		{strings.Replace(hfLlama, "%s", `, "mlp_bias": true`, 1), "{from: ck}", "mlp_bias: true is not supported"},
		{strings.Replace(strings.Replace(hfLlama, `"silu"`, `"gelu"`, 1), "%s", "", 1), "{from: ck}", "hidden_act: gelu is not supported"},
		{strings.Replace(hfLlama, "%s", `, "sliding_window": 4096`, 1), "{from: ck}", "sliding_window not read by pipetrain's llama"},
		{strings.Replace(hfLlama, "%s", "", 1), "{from: ck, width: 32}", "model.width: 32 disagrees with"},
		{strings.Replace(hfLlama, "%s", "", 1), "{from: ck, context: 128}", "model.context: 128 must be a whole number from 1 to"},
		{strings.Replace(hfLlama, "%s", "", 1), "{from: ck, name: gpt}", "model.name: gpt disagrees with"},
		{strings.Replace(hfGPT2, "%s", "", 1), "{from: ck, context: 4}", "model.context: 4 disagrees with"},
		{strings.Replace(strings.Replace(hfGPT2, "1e-05", "1e-06", 1), "%s", "", 1), "{from: ck}", "layer_norm_epsilon: 1e-06 is not supported"},
		{strings.Replace(hfGPT2, "%s", `, "activation_function": "relu"`, 1), "{from: ck}", "activation_function: relu is not supported"},
		{strings.Replace(hfGPT2, "%s", `, "n_inner": 32`, 1), "{from: ck}", "n_inner: 32 is not supported"},
		{strings.Replace(strings.Replace(hfGPT2, "gpt2", "bert", 1), "%s", "", 1), "{from: ck}", `model_type: "bert" is not read`},
	} {
		_, err := loadFrom(t, c.config, c.model)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "config.json") {
			t.Errorf("%s: %v, want an error naming config.json and %q", c.model, err, c.want)
		}
	}
}
