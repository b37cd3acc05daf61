package configs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/models"
)

// model.from names a Hugging Face checkpoint directory whose config.json
// sets the model section; it is resolved as the config is loaded, so every
// stage, the reference and export see the same sizes.

// modelName is the family the model section's keys are checked against:
// model.from's model_type when it is set and readable (a bad one is
// reported when the config resolves it).
func modelName(v *viper.Viper, path string) string {
	from := v.GetString("model.from")
	if from == "" {
		return v.GetString("model.name")
	}
	if !filepath.IsAbs(from) {
		from = filepath.Join(filepath.Dir(path), from)
	}
	var head struct {
		ModelType string `json:"model_type"`
	}
	if b, err := os.ReadFile(filepath.Join(from, checkpoint.HFConfigName)); err == nil && json.Unmarshal(b, &head) == nil {
		if name, ok := models.HFModelTypes[head.ModelType]; ok {
			return name
		}
	}
	return v.GetString("model.name")
}

// HFConfigPath is model.from's config.json, resolved against the config's
// folder ("" without model.from).
func (c *Config) HFConfigPath() string {
	if c.Model.From == "" {
		return ""
	}
	return filepath.Join(c.resolve(c.Model.From), checkpoint.HFConfigName)
}

// resolveModelFrom replaces the model section by the one model.from's
// config.json describes, holding the keys the file gives beside from to
// it (models.SpecFromHF).
func (c *Config) resolveModelFrom() error {
	if c.Model.From == "" {
		return nil
	}
	path := c.HFConfigPath()
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("model.from: %w", err)
	}
	spec, err := models.SpecFromHF(path, raw, c.givenModelKeys())
	if err != nil {
		return fmt.Errorf("model.from: %w", err)
	}
	// The image classifiers' sizes keep their defaults, as in any
	// transformer's section.
	spec.Input, spec.Hidden, spec.Classes, spec.Activation = c.Model.Input, c.Model.Hidden, c.Model.Classes, c.Model.Activation
	spec.From = c.Model.From
	c.Model = spec
	return nil
}

// givenModelKeys are the keys the config file's model section sets
// besides from, in lower case.
func (c *Config) givenModelKeys() map[string]any {
	out := map[string]any{}
	b, err := os.ReadFile(c.Path)
	if err != nil {
		return out
	}
	var doc map[string]any
	if yaml.Unmarshal(b, &doc) != nil {
		return out
	}
	model, _ := doc["model"].(map[string]any)
	for k, v := range model {
		if k = strings.ToLower(k); k != "from" {
			out[k] = v
		}
	}
	return out
}
