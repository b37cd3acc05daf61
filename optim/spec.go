package optim

// Spec configures an optimizer; it is the train.optimizer section of a run
// config, which embeds it as it embeds models.Spec, so that this package
// owns what it is configured with and depends on no config loader.
type Spec struct {
	Name     string  `mapstructure:"name" json:"name"` // sgd or adam
	LR       float64 `mapstructure:"lr" json:"lr"`
	Momentum float64 `mapstructure:"momentum" json:"momentum"` // sgd
	Beta1    float64 `mapstructure:"beta1" json:"beta1"`       // adam
	Beta2    float64 `mapstructure:"beta2" json:"beta2"`
	Eps      float64 `mapstructure:"eps" json:"eps"`
}

// Names lists the optimizers a Spec may name.
func Names() []string { return []string{"sgd", "adam"} }
