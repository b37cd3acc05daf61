package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runValidate(t *testing.T, config string) (string, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(p, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := validateCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return runCommand(t, cmd, "--config", p)
}

const validateConfig = `
model: {name: mlp, input: 784, hidden: [6, 5], classes: 10}
data: {batch_size: 12, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: gpipe
transport: {token: s3cret}
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1-2", address: "192.0.2.1:7002", cpus: "0-1"}
`

// TestValidateRefusesMisspelledKeys: a config with misspelled keys, which
// once validated and trained with 8 micro-batches instead of 2, is refused
// with every misspelling named.
func TestValidateRefusesMisspelledKeys(t *testing.T) {
	t.Setenv("PIPETRAIN_TRIAN_STEPS", "3")
	bad := strings.NewReplacer(
		"classes: 10}", "classes: 10, bogus_key: 1}",
		"micro_batches: 4", "micro_batch: 2",
		"train: {", "trian: {steps: 9}\ntrain: {",
		`cpus: "0-1"}`, `metrics_adress: "127.0.0.1:9101"}`,
	).Replace(validateConfig)
	out, err := runValidate(t, bad)
	if err == nil {
		t.Fatalf("validated:\n%s", out)
	}
	for _, w := range []string{
		"trian: unknown key (did you mean train?)",
		"model.bogus_key: unknown key",
		"data.micro_batch: unknown key (did you mean micro_batches?)",
		"stages[1].metrics_adress: unknown key (did you mean metrics_address?)",
		"PIPETRAIN_TRIAN_STEPS: no config key is set by this variable (did you mean PIPETRAIN_TRAIN_STEPS?)",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestValidateShowsOverridesAndUncheckedCPUs: validate says which settings
// came from the environment (a secret by name only) and which cpus it could
// not check because their stage runs on another host.
func TestValidateShowsOverridesAndUncheckedCPUs(t *testing.T) {
	t.Setenv("PIPETRAIN_TRAIN_STEPS", "7")
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN", "env-secret")
	out, err := runValidate(t, validateConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		": ok\n",
		"  from the environment: PIPETRAIN_TRAIN_STEPS=7, PIPETRAIN_TRANSPORT_TOKEN\n",
		`  note: stages[1].cpus "0-1" not checked: 192.0.2.1:7002 is not this machine; the stage checks them when it starts`,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "env-secret") {
		t.Errorf("output shows the token:\n%s", out)
	}
}

// TestValidateShowsRecomputation: a stage that recomputes says how, the
// others say nothing.
func TestValidateShowsRecomputation(t *testing.T) {
	out, err := runValidate(t, strings.Replace(validateConfig, `{layers: "0",`, `{recompute: full, layers: "0",`, 1))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out, "\n")
	var stage0, stage1 string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "stage 0 "):
			stage0 = l
		case strings.HasPrefix(strings.TrimSpace(l), "stage 1 "):
			stage1 = l
		}
	}
	if !strings.HasSuffix(stage0, ", recompute full") || strings.Contains(stage1, "recompute") {
		t.Errorf("stage lines:\n%s\n%s", stage0, stage1)
	}
}
