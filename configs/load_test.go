package configs

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// TestUnknownKeysRefused: a misspelled key anywhere in the file is an error
// naming its full path and the key it was probably meant to be, and the
// settings it should have changed keep their defaults only in a config that
// does not load.
func TestUnknownKeysRefused(t *testing.T) {
	text := strings.NewReplacer(
		"classes: 3}", "classes: 3, bogus_key: 1}",
		"micro_batches: 4", "micro_batches: 4, micro_batch: 2",
		"train: {", "trian: {steps: 9}\ntrain: {",
		`address: 127.0.0.1:7002}`, `address: 127.0.0.1:7002, metrics_adress: "127.0.0.1:9101"}`,
	).Replace(good)
	p := writeConfig(t, text)
	wantProblems(t, p,
		"model.bogus_key: unknown key",
		"data.micro_batch: unknown key (did you mean micro_batches?)",
		"trian: unknown key (did you mean train?)",
		"stages[1].metrics_adress: unknown key (did you mean metrics_address?)")
	if _, err := Load(p); err == nil || !strings.HasPrefix(err.Error(), p+": 4 problems:") {
		t.Errorf("error %v, want the file and 4 problems", err)
	}

	// A key in the wrong section points at the right one; keys whose case
	// differs and dotted keys are read as viper reads them.
	wantProblems(t, writeConfig(t, good+"steps: 3\nlr: 0.5\n"),
		"steps: unknown key (did you mean train.steps?)",
		"lr: unknown key (did you mean train.optimizer.lr?)")
	c, err := Load(writeConfig(t, strings.Replace(good, "train: {steps: 5,", "Train: {Steps: 7,", 1)+"data.micro_batches: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Train.Steps != 7 || c.Data.MicroBatches != 2 {
		t.Errorf("steps %d, micro-batches %d; want 7 and 2", c.Train.Steps, c.Data.MicroBatches)
	}
	wantProblems(t, writeConfig(t, good+"data.micro_batchs: 2\n"),
		"data.micro_batchs: unknown key (did you mean micro_batches?)")
}

// TestUnknownEnvironmentVariablesRefused: a PIPETRAIN_* variable that sets no
// key is an error naming it (never its value: it may hold a secret) and the
// variable it was probably meant to be.
func TestUnknownEnvironmentVariablesRefused(t *testing.T) {
	p := writeConfig(t, good)
	t.Setenv("PIPETRAIN_TRIAN_STEPS", "4")
	t.Setenv("PIPETRAIN_TRANSPORT_TOKN", "s3cret")
	t.Setenv("PIPETRAIN_STAGES_0_ADDRESS", "127.0.0.1:7005")
	wantProblems(t, p,
		"PIPETRAIN_TRIAN_STEPS: no config key is set by this variable (did you mean PIPETRAIN_TRAIN_STEPS?)",
		"PIPETRAIN_TRANSPORT_TOKN: no config key is set by this variable (did you mean PIPETRAIN_TRANSPORT_TOKEN?)",
		"PIPETRAIN_STAGES_0_ADDRESS: stages can only be set in the config file")
	if _, err := Load(p); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v: want a refusal that does not show the value", err)
	}
}

// TestOtherPipetrainVariablesAccepted: the PIPETRAIN_* variables that
// pipetrain or its tests read for other purposes than config keys are no
// unknown settings, or every run in CI (which sets the tests' variable)
// would be refused.
func TestOtherPipetrainVariablesAccepted(t *testing.T) {
	t.Setenv(blas.Env, "gonum")
	t.Setenv(testenv.RequireAllEnv, "1")
	if _, err := Load(writeConfig(t, good)); err != nil {
		t.Errorf("with %s and %s set: %v", blas.Env, testenv.RequireAllEnv, err)
	}
}

// TestEveryKeyHasAVariable: each key outside stages is set by the variable
// EnvName gives it, keys with underscores inside included, and no two keys
// share one.
func TestEveryKeyHasAVariable(t *testing.T) {
	for name, key := range map[string]string{
		"PIPETRAIN_TRAIN_LOG_EVERY":            "train.log_every",
		"PIPETRAIN_DATA_MICRO_BATCHES":         "data.micro_batches",
		"PIPETRAIN_TRANSPORT_TLS_CA":           "transport.tls.ca",
		"PIPETRAIN_MODEL_HIDDEN":               "model.hidden",
		"PIPETRAIN_MODEL_TIE_EMBEDDINGS":       "model.tie_embeddings",
		"PIPETRAIN_RECOVERY_MAX_RESTARTS":      "recovery.max_restarts",
		"PIPETRAIN_TRANSPORT_CONNECT_TIMEOUT":  "transport.connect_timeout",
		"PIPETRAIN_SCHEDULE_FILE":              "schedule_file",
		"PIPETRAIN_TRAIN_OPTIMIZER_LR":         "train.optimizer.lr",
		"PIPETRAIN_COMPUTE_BLAS_THREADS":       "compute.blas_threads",
		"PIPETRAIN_TRANSPORT_TOKEN_FILE":       "transport.token_file",
		"PIPETRAIN_TRANSPORT_COMPRESSION":      "transport.compression",
		"PIPETRAIN_CHECKPOINT_EVERY":           "checkpoint.every",
		"PIPETRAIN_TRAIN_EVALUATE":             "train.evaluate",
		"PIPETRAIN_VIRTUAL_STAGES":             "virtual_stages",
		"PIPETRAIN_NAME":                       "name",
		"PIPETRAIN_DATA_VAL_FRACTION":          "data.val_fraction",
		"PIPETRAIN_TRANSPORT_RECV_TIMEOUT":     "transport.recv_timeout",
		"PIPETRAIN_TRANSPORT_PEER_TIMEOUT":     "transport.peer_timeout",
		"PIPETRAIN_TRAIN_OPTIMIZER_MOMENTUM":   "train.optimizer.momentum",
		"PIPETRAIN_MODEL_CHANNELS":             "model.channels",
		"PIPETRAIN_TRANSPORT_TLS_CERT":         "transport.tls.cert",
		"PIPETRAIN_DATA_MAX_BYTES":             "data.max_bytes",
		"PIPETRAIN_TRAIN_EVAL_EVERY":           "train.eval_every",
		"PIPETRAIN_TRAIN_CLIP_GRAD_NORM":       "train.clip_grad_norm",
		"PIPETRAIN_TRANSPORT_HEARTBEAT":        "transport.heartbeat",
		"PIPETRAIN_TRANSPORT_QUEUE_DEPTH":      "transport.queue_depth",
		"PIPETRAIN_CHECKPOINT_KEEP":            "checkpoint.keep",
		"PIPETRAIN_CHECKPOINT_KEEP_BEST":       "checkpoint.keep_best",
		"PIPETRAIN_TRAIN_EARLY_STOP_METRIC":    "train.early_stop.metric",
		"PIPETRAIN_TRAIN_EARLY_STOP_PATIENCE":  "train.early_stop.patience",
		"PIPETRAIN_TRAIN_EARLY_STOP_MIN_DELTA": "train.early_stop.min_delta",
		"PIPETRAIN_MODEL_DTYPE":                "model.dtype",
		"PIPETRAIN_TRAIN_OPTIMIZER_BETA2":      "train.optimizer.beta2",
		"PIPETRAIN_DATA_TOKENIZER":             "data.tokenizer",
		"PIPETRAIN_SCHEDULE":                   "schedule",
		"PIPETRAIN_TRANSPORT_TOKEN":            "transport.token",
		"PIPETRAIN_TRAIN_SEED":                 "train.seed",
		"PIPETRAIN_MODEL_VOCAB":                "model.vocab",
		"PIPETRAIN_DATA_CORPUS":                "data.corpus",
		"PIPETRAIN_TRAIN_STEPS":                "train.steps",
		"PIPETRAIN_MODEL_ACTIVATION":           "model.activation",
		"PIPETRAIN_TRAIN_OPTIMIZER_NAME":       "train.optimizer.name",
		"PIPETRAIN_DATA_DATASET":               "data.dataset",
		"PIPETRAIN_MODEL_NAME":                 "model.name",
		"PIPETRAIN_TRANSPORT_TLS_KEY":          "transport.tls.key",
		"PIPETRAIN_TRAIN_OPTIMIZER_EPS":        "train.optimizer.eps",
		"PIPETRAIN_MODEL_HEADS":                "model.heads",
		"PIPETRAIN_DATA_BATCH_SIZE":            "data.batch_size",
		"PIPETRAIN_TRAIN_OPTIMIZER_BETA1":      "train.optimizer.beta1",
		"PIPETRAIN_MODEL_CONTEXT":              "model.context",
		"PIPETRAIN_DATA_DIR":                   "data.dir",
		"PIPETRAIN_MODEL_INPUT":                "model.input",
		"PIPETRAIN_MODEL_CLASSES":              "model.classes",
		"PIPETRAIN_MODEL_LAYERS":               "model.layers",
		"PIPETRAIN_MODEL_WIDTH":                "model.width",
		"PIPETRAIN_DATA_GLOB":                  "data.glob",
	} {
		if got := envSettings[name]; got != key {
			t.Errorf("%s sets %q, want %q", name, got, key)
		}
	}
	if len(envSettings) != len(settings) {
		t.Errorf("%d variables for %d keys: two keys share a variable", len(envSettings), len(settings))
	}
	for _, k := range settings {
		if strings.HasPrefix(k, "stages") {
			t.Errorf("%s is in a list; no variable can set it", k)
		}
	}
}

// TestVariablesSetKeysTheFileOmits: every key can be set from the
// environment, not only those with a default.
func TestVariablesSetKeysTheFileOmits(t *testing.T) {
	p := writeConfig(t, strings.Replace(good, "hidden: [6, 5], ", "", 1))
	t.Setenv("PIPETRAIN_MODEL_HIDDEN", "6,5")
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Model.Hidden) != 2 || c.Model.Hidden[0] != 6 || c.Model.Hidden[1] != 5 {
		t.Errorf("model.hidden = %v, want [6 5] from PIPETRAIN_MODEL_HIDDEN", c.Model.Hidden)
	}
}

// TestProblemsFromVariablesNameThem: a bad value from the environment is
// reported under the variable that set it, not the file.
func TestProblemsFromVariablesNameThem(t *testing.T) {
	p := writeConfig(t, good)
	t.Setenv("PIPETRAIN_SCHEDULE", "bogus")
	_, err := Load(p)
	want := `PIPETRAIN_SCHEDULE=bogus: schedule: unknown schedule "bogus" (known: gpipe, 1f1b, interleaved, zb-h1, zb-v, interleaved-zb, dualpipev, custom)`
	if err == nil || err.Error() != want {
		t.Errorf("error\n%v\nwant\n%s", err, want)
	}

	// With problems of the file too, the file heads the list and each
	// problem names its source; an index names the list's variable.
	t.Setenv("PIPETRAIN_MODEL_HIDDEN", "6,0")
	_, err = Load(writeConfig(t, strings.Replace(good, "steps: 5", "steps: 0", 1)))
	var problems *Problems
	if !errors.As(err, &problems) {
		t.Fatalf("error %v, want problems", err)
	}
	msg := err.Error()
	for _, w := range []string{
		problems.Path + ": 3 problems:",
		"\n  PIPETRAIN_MODEL_HIDDEN=6,0: model.hidden[1]: must be at least 1, got 0",
		"\n  train.steps: must be at least 1, got 0",
		"\n  PIPETRAIN_SCHEDULE=bogus: schedule: unknown schedule",
	} {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q:\n%s", w, msg)
		}
	}

	// Values that cannot be decoded are named as well, with every other one.
	t.Setenv("PIPETRAIN_SCHEDULE", "")
	t.Setenv("PIPETRAIN_MODEL_HIDDEN", "")
	t.Setenv("PIPETRAIN_DATA_BATCH_SIZE", "twelve")
	_, err = Load(writeConfig(t, strings.Replace(good, "schedule: gpipe", "schedule: gpipe\ntransport: {recv_timeout: soon}", 1)))
	if !errors.As(err, &problems) || len(problems.Items) != 2 ||
		!strings.HasPrefix(problems.Items[0], "PIPETRAIN_DATA_BATCH_SIZE=twelve: data.batch_size: ") ||
		!strings.HasPrefix(problems.Items[1], "transport.recv_timeout: ") {
		t.Errorf("error %v, want data.batch_size from its variable and transport.recv_timeout", err)
	}
}

// TestReadEnvKeepsSecretsOut: the token's variable is named without its value.
func TestReadEnvKeepsSecretsOut(t *testing.T) {
	set, problems := readEnv([]string{"PIPETRAIN_TRANSPORT_TOKEN=s3cret", "PIPETRAIN_SCHEDULE=gpipe", "PIPETRAIN_TRAIN_STEPS=", "HOME=/root", "PIPETRAIN_DATA_DIR=/my data"})
	if len(problems) != 0 {
		t.Errorf("problems %q", problems)
	}
	want := map[string]string{
		"transport.token": "PIPETRAIN_TRANSPORT_TOKEN",
		"schedule":        "PIPETRAIN_SCHEDULE=gpipe",
		"data.dir":        `PIPETRAIN_DATA_DIR="/my data"`,
	}
	if len(set) != len(want) {
		t.Errorf("set %q, want %q", set, want)
	}
	for k, w := range want {
		if set[k] != w {
			t.Errorf("%s: %q, want %q", k, set[k], w)
		}
	}
}

// TestEnvironmentTokenBeatsTokenFile: the environment overrides the file's
// token setting whichever of token and token_file each uses.
func TestEnvironmentTokenBeatsTokenFile(t *testing.T) {
	dir := t.TempDir()
	// The file names a token file that does not exist: the variable wins, so
	// the file is never read.
	p := authConfig(t, dir, "  token_file: secrets/missing\n", "0.0.0.0:7001", "127.0.0.1:7002")
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN", "from-env")
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := c.AuthToken(); err != nil || tok != "from-env" || c.Transport.TokenFile != "" {
		t.Errorf("AuthToken = %q, %v (token_file %q); want the variable's token", tok, err, c.Transport.TokenFile)
	}

	// A token file from the environment beats the file's token.
	writeFiles(t, dir, map[string]string{"env.token": "file-from-env\n"})
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN", "")
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN_FILE", filepath.Join(dir, "env.token"))
	c, err = Load(authConfig(t, dir, "  token: in-file\n", "0.0.0.0:7001", "127.0.0.1:7002"))
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := c.AuthToken(); err != nil || tok != "file-from-env" {
		t.Errorf("AuthToken = %q, %v; want the token of PIPETRAIN_TRANSPORT_TOKEN_FILE", tok, err)
	}

	// Both from the environment contradict each other.
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN", "from-env")
	wantProblems(t, authConfig(t, dir, "", "127.0.0.1:7001", "127.0.0.1:7002"),
		"PIPETRAIN_TRANSPORT_TOKEN_FILE="+filepath.Join(dir, "env.token")+": transport.token_file: set either transport.token or transport.token_file, not both")
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"trian", "train", 1}, {"micro_batch", "micro_batches", 2}, {"", "abc", 3}, {"abc", "abc", 0}, {"adress", "address", 1}, {"ca", "abc", 3}} {
		if d := editDistance(c.a, c.b); d != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, d, c.d)
		}
	}
	if got := nearest("bogus_key", []string{"name", "dtype", "input", "hidden", "classes"}); got != "" {
		t.Errorf("nearest(bogus_key) = %q, want none", got)
	}
}
