package optim

import (
	"fmt"
	"path"
	"strings"
)

// Spec configures an optimizer; it is the train.optimizer section of a run
// config, which embeds it as it embeds models.Spec, so that this package
// owns what it is configured with and depends on no config loader.
//
// The fields added after the first release are omitted from JSON when zero,
// so a config that does not set them keeps the training digest its
// checkpoints were written with.
type Spec struct {
	Name     string  `mapstructure:"name" json:"name"` // sgd, adam or adamw
	LR       float64 `mapstructure:"lr" json:"lr"`
	Momentum float64 `mapstructure:"momentum" json:"momentum"` // sgd
	Beta1    float64 `mapstructure:"beta1" json:"beta1"`       // adam, adamw
	Beta2    float64 `mapstructure:"beta2" json:"beta2"`
	Eps      float64 `mapstructure:"eps" json:"eps"`
	// WeightDecay is sgd's and adam's L2 term (wd·p added to the gradient)
	// and adamw's decoupled decay (p scaled by 1 − lr·wd before the update),
	// as in torch.optim; it applies to the parameters Decays selects.
	WeightDecay float64 `mapstructure:"weight_decay" json:"weight_decay,omitempty"`
	// DecayExclude, when not empty, replaces the default choice of the
	// parameters left undecayed: those whose name matches one of these
	// patterns (path.Match syntax) are, every other is decayed.
	DecayExclude []string `mapstructure:"decay_exclude" json:"decay_exclude,omitempty"`
}

// Names lists the optimizers a Spec may name.
func Names() []string { return []string{"sgd", "adam", "adamw"} }

// usesAdam says whether the spec's optimizer keeps Adam's moments.
func (s Spec) usesAdam() bool { return s.Name == "adam" || s.Name == "adamw" }

// Decays says whether weight decay applies to the parameter called name,
// of dims dimensions. By default only the weights of linear and convolution
// layers decay: parameters named "weight" or "*.weight" of two dimensions
// or more; biases, norm gains and biases, and embeddings (embed.tok,
// embed.pos, and head.tok, the tied copy of embed.tok) do not, as in
// minGPT's configure_optimizers. A non-empty DecayExclude replaces that
// rule. It assumes CheckPatterns accepted the patterns; a malformed one
// matches nothing.
func (s Spec) Decays(name string, dims int) bool {
	if len(s.DecayExclude) == 0 {
		return dims >= 2 && (name == "weight" || strings.HasSuffix(name, ".weight"))
	}
	for _, p := range s.DecayExclude {
		if ok, _ := path.Match(p, name); ok {
			return false
		}
	}
	return true
}

// CheckPatterns reports the first of DecayExclude that path.Match cannot
// parse, by its index.
func (s Spec) CheckPatterns() error {
	for i, p := range s.DecayExclude {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("decay_exclude[%d] %q: %w", i, p, err)
		}
	}
	return nil
}
