package configs

import "testing"

// TestEarlyStopKeysRefused: early stopping and keep_best need the
// evaluations they judge, and each bad value is refused by its key.
func TestEarlyStopKeysRefused(t *testing.T) {
	cleanEnv(t)
	base := withTrain("train: {steps: 20, eval_every: 5, early_stop: {patience: 2, min_delta: 0.01}}\ncheckpoint: {every: 10, keep: 1, keep_best: 2}")
	if _, err := Load(writeConfig(t, base)); err != nil {
		t.Fatalf("a valid config refused: %v", err)
	}
	refusesEdits(t, base, []edit{
		{"patience: 2", "patience: -1", "train.early_stop.patience: must be 0 (never stop early) or a number of evaluations, got -1"},
		{"min_delta: 0.01", "min_delta: -0.01", "train.early_stop.min_delta: must be 0 or a positive finite number, got -0.01"},
		{"patience: 2", "patience: 2, metric: val_accuracy", `train.early_stop.metric: unknown metric "val_accuracy" (known: val_loss)`},
		{"eval_every: 5, ", "", "train.early_stop.patience: early stopping watches the evaluations train.eval_every runs, which is 0"},
		{"every: 10, keep: 1", "every: 0, keep: 1", "checkpoint.keep_best: keeps checkpoints, but checkpoint.every is 0"},
		{"every: 10, keep: 1", "every: 12, keep: 1", "checkpoint.keep_best: ranks checkpoints by the evaluation of their step: checkpoint.every 12 must be a multiple of train.eval_every 5"},
		{"keep_best: 2", "keep_best: -1", "checkpoint.keep_best: must be 0 or a number of checkpoints, got -1"},
		{"patience: 2", "patients: 2", "train.early_stop.patients: unknown key"},
	})
}
