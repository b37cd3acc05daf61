package configs

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// withTrain is the base config with its train section replaced.
func withTrain(train string) string {
	return strings.Replace(good, "train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}", train, 1)
}

// TestOptimizerAndScheduleKeysLoad: adamw, weight decay, decay_exclude (a
// list, or a comma-separated string) and a schedule are read into the
// optimizer's and the schedule's own specs.
func TestOptimizerAndScheduleKeysLoad(t *testing.T) {
	cleanEnv(t)
	c, err := Load(writeConfig(t, withTrain(`
train:
  steps: 50
  optimizer: {name: adamw, lr: 0.003, weight_decay: 0.1, decay_exclude: ["*.bias", "embed.*"]}
  lr_schedule: {kind: cosine, warmup_steps: 5, min_lr: 0.0003}`)))
	if err != nil {
		t.Fatal(err)
	}
	o, s := c.Train.Optimizer, c.Train.LRSchedule
	if o.Name != "adamw" || o.WeightDecay != 0.1 || !slices.Equal(o.DecayExclude, []string{"*.bias", "embed.*"}) || o.Beta2 != 0.999 {
		t.Errorf("optimizer %+v", o)
	}
	if s.Kind != "cosine" || s.WarmupSteps != 5 || s.MinLR != 0.0003 || s.Resolve(c.Train.Steps).DecaySteps != 50 {
		t.Errorf("lr_schedule %+v", s)
	}
	t.Setenv("PIPETRAIN_TRAIN_OPTIMIZER_DECAY_EXCLUDE", "*.bias,*.gain")
	c, err = Load(writeConfig(t, withTrain(`train: {steps: 5, optimizer: {name: sgd, lr: 0.1, weight_decay: 0.01}}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Train.Optimizer.DecayExclude; !slices.Equal(got, []string{"*.bias", "*.gain"}) {
		t.Errorf("decay_exclude from a comma-separated variable: %q", got)
	}
	c, err = Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Train.LRSchedule; s.Kind != "constant" || !s.Constant() {
		t.Errorf("a config without lr_schedule: %+v, want a constant rate", s)
	}
}

// TestOptimizerAndScheduleKeysRefused: each bad weight decay, pattern or
// schedule setting is refused under its own key.
func TestOptimizerAndScheduleKeysRefused(t *testing.T) {
	cleanEnv(t)
	base := withTrain(`train: {steps: 5, optimizer: {name: adamw, lr: 0.1, beta1: 0.9, weight_decay: 0.1}, lr_schedule: {kind: cosine, warmup_steps: 2}}`)
	refusesEdits(t, base, []edit{
		{"weight_decay: 0.1", "weight_decay: -0.1", "train.optimizer.weight_decay: must be 0 (no decay) or more, got -0.1"},
		{"weight_decay: 0.1", `weight_decay: 0.1, decay_exclude: ["*.bias", "[x"]`, `train.optimizer.decay_exclude: decay_exclude[1] "[x": syntax error in pattern`},
		{"beta1: 0.9", "beta1: 1.5", "train.optimizer.beta1: must be in [0, 1), got 1.5"},
		{"kind: cosine", "kind: exponential", `train.lr_schedule.kind: unknown learning-rate schedule "exponential" (known: constant, cosine, linear, step)`},
		{"warmup_steps: 2", "warmup_steps: 2, min_lr: 0.5", "train.lr_schedule.min_lr: must be in [0, train.optimizer.lr = 0.1], got 0.5"},
		{"warmup_steps: 2", "warmup_steps: 5", "train.lr_schedule.decay_steps: 5 (decay_steps, or train.steps when 0) must be above warmup_steps 5"},
		{"warmup_steps: 2", "warmup_steps: -1", "train.lr_schedule.warmup_steps: must be 0 or more, got -1"},
		{"kind: cosine", "kind: step", "train.lr_schedule.step_size: must be 1 or more, got 0"},
		{"warmup_steps: 2", "warmup_steps: 2, gamma: 0.5", "train.lr_schedule.gamma: kind cosine does not read it"},
		{"warmup_steps: 2", "warmup: 2", "train.lr_schedule.warmup: unknown key"},
		{"weight_decay: 0.1", "wd: 0.1", "train.optimizer.wd: unknown key"},
	})
}

// TestTiedWeightsDecayAlike: a decay_exclude that would decay one copy of
// a tied weight and not the other is refused, naming both.
func TestTiedWeightsDecayAlike(t *testing.T) {
	cleanEnv(t)
	tied := strings.Replace(gptGood, "vocab: 256}", "vocab: 256, tie_embeddings: true}", 1) + "train: {steps: 5, optimizer: {name: adamw, lr: 0.01, weight_decay: 0.1}}\n"
	if _, err := Load(writeConfig(t, tied)); err != nil {
		t.Fatalf("the default choice (neither copy decays): %v", err)
	}
	refusesEdits(t, tied, []edit{
		{"weight_decay: 0.1", `weight_decay: 0.1, decay_exclude: ["embed.*", "*.bias"]`, "train.optimizer.decay_exclude: decays head.tok but not embed.tok, which is the same weight held twice (tied): exclude both or neither"},
	})
	both := strings.Replace(tied, "weight_decay: 0.1", `weight_decay: 0.1, decay_exclude: ["*.tok", "*.bias"]`, 1)
	if _, err := Load(writeConfig(t, both)); err != nil {
		t.Errorf("both copies excluded: %v", err)
	}
}

// TestDigestOfOptimizerAndSchedule: configs without the new keys keep the
// digest they had (no weight_decay or lr_schedule among their settings),
// and each new setting that changes the updates changes the digest, named.
// A schedule whose decay_steps defaults to the run's steps makes the steps
// a training setting.
func TestDigestOfOptimizerAndSchedule(t *testing.T) {
	cleanEnv(t)
	base, err := Load("fmnist-mlp-4stage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for k := range base.TrainingSettings() {
		if strings.Contains(k, "weight_decay") || strings.Contains(k, "decay_exclude") || strings.Contains(k, "lr_schedule") {
			t.Errorf("a config without weight decay or a schedule has %s in its training settings", k)
		}
	}
	constant := clone(base)
	constant.Train.LRSchedule.Kind = "constant"
	if constant.TrainingDigest() != base.TrainingDigest() {
		t.Error("kind: constant without warmup changed the digest")
	}
	cosine := clone(base)
	cosine.Train.LRSchedule.Kind, cosine.Train.LRSchedule.WarmupSteps = "cosine", 10
	for key, change := range map[string]func(c *Config){
		"train.optimizer.weight_decay":     func(c *Config) { c.Train.Optimizer.WeightDecay = 0.1 },
		"train.optimizer.decay_exclude[0]": func(c *Config) { c.Train.Optimizer.DecayExclude = []string{"*.bias"} },
		"train.lr_schedule.warmup_steps":   func(c *Config) { c.Train.LRSchedule.WarmupSteps = 20 },
		"train.lr_schedule.min_lr":         func(c *Config) { c.Train.LRSchedule.MinLR = 1e-5 },
		"train.lr_schedule.decay_steps":    func(c *Config) { c.Train.Steps++ },
		"train.lr_schedule.kind":           func(c *Config) { c.Train.LRSchedule.Kind = "linear" },
	} {
		c := clone(cosine)
		change(c)
		if d := DiffSettings(cosine.TrainingSettings(), c.TrainingSettings()); len(d) != 1 || d[0].Key != key {
			t.Errorf("changing %s: DiffSettings gave %v", key, d)
		}
	}
}

// TestLearningRateResolvesDecaySteps: with decay_steps left 0 the rate
// decays over train.steps (halfway down at the middle step of a cosine),
// and without a schedule it is train.optimizer.lr at every step.
func TestLearningRateResolvesDecaySteps(t *testing.T) {
	cleanEnv(t)
	c, err := Load(writeConfig(t, withTrain(`train: {steps: 21, optimizer: {name: sgd, lr: 0.5}, lr_schedule: {kind: cosine, warmup_steps: 1, min_lr: 0.1}}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.LearningRate(0); got != 0.25 {
		t.Errorf("warmup step 0: %v, want 0.25", got)
	}
	if got := c.LearningRate(11); math.Abs(got-0.3) > 1e-15 {
		t.Errorf("step 11, halfway from the warmup to train.steps 21: %v, want 0.3", got)
	}
	c, err = Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{0, 3, 1000} {
		if got := c.LearningRate(step); got != 0.1 {
			t.Errorf("no schedule, step %d: %v, want train.optimizer.lr 0.1", step, got)
		}
	}
}
