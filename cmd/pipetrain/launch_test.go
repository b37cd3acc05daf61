package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/launcher"
)

// autoConfig writes a 2-stage config whose addresses are auto, with extra
// YAML appended, and loads it.
func autoConfig(t *testing.T, extra string) *configs.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auto.yaml")
	body := "model: {name: mlp, dtype: float32, input: 784, hidden: [64], classes: 10}\n" +
		"data: {batch_size: 32, micro_batches: 2}\n" +
		"stages:\n  - {layers: \"0\", address: auto}\n  - {layers: \"1\", address: auto}\n" + extra
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// envValue is the value of name in env, the last one set as exec does.
func envValue(env []string, name string) (string, bool) {
	value, found := "", false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			value, found = v, true
		}
	}
	return value, found
}

var hexToken = regexp.MustCompile(`^[0-9a-f]{64}$`)

// TestLocalRendezvousMakesAToken: a launch whose processes meet at a
// rendezvous and whose config sets no token or TLS gives its stages a
// fresh random token, a new one each launch, beside the rendezvous's
// address; a token the config or the environment sets is used instead, and
// a launch without a rendezvous adds nothing.
func TestLocalRendezvousMakesAToken(t *testing.T) {
	t.Setenv("MASTER_ADDR", "")
	cfg := autoConfig(t, "")
	first, err := localRendezvous(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token, ok := envValue(first, configs.TokenVariable)
	if !ok || !hexToken.MatchString(token) {
		t.Fatalf("environment %q: want %s of 32 random bytes in hex", first, configs.TokenVariable)
	}
	if addr, _ := envValue(first, "MASTER_ADDR"); addr != "127.0.0.1" {
		t.Errorf("MASTER_ADDR is %q, want 127.0.0.1", addr)
	}
	if port, _ := envValue(first, "MASTER_PORT"); port == "" {
		t.Errorf("no MASTER_PORT in %q", first)
	}
	second, err := localRendezvous(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := envValue(second, configs.TokenVariable); again == token || !hexToken.MatchString(again) {
		t.Errorf("two launches got tokens %q and %q; want two fresh ones", token, again)
	}

	// A rendezvous named elsewhere is guarded the same way.
	t.Setenv("MASTER_ADDR", "127.0.0.1")
	t.Setenv("MASTER_PORT", "29400")
	env, err := localRendezvous(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := envValue(env, configs.TokenVariable); !ok || len(env) != 1 {
		t.Errorf("with MASTER_ADDR set: environment %q, want only a token", env)
	}
	t.Setenv("MASTER_ADDR", "")

	for name, extra := range map[string]string{
		"token in the file":  "transport: {token: chosen-by-the-user}\n",
		"token file":         "transport: {token_file: " + writeTokenFile(t) + "}\n",
		"no rendezvous":      "", // fixedConfig below
		"token from the env": "",
	} {
		t.Run(name, func(t *testing.T) {
			var c *configs.Config
			switch name {
			case "no rendezvous":
				c = fixedConfig(t)
			case "token from the env":
				t.Setenv(configs.TokenVariable, "from-the-scheduler")
				c = autoConfig(t, "")
			default:
				c = autoConfig(t, extra)
			}
			env, err := localRendezvous(c)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := envValue(env, configs.TokenVariable); ok {
				t.Errorf("environment sets %s=%q over the config's own authentication or for no rendezvous", configs.TokenVariable, v)
			}
		})
	}
}

// writeTokenFile writes a token file and returns its path.
func writeTokenFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "run.token")
	if err := os.WriteFile(p, []byte("from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fixedConfig loads a 2-stage config of fixed loopback addresses.
func fixedConfig(t *testing.T) *configs.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fixed.yaml")
	body := "model: {name: mlp, dtype: float32, input: 784, hidden: [64], classes: 10}\n" +
		"data: {batch_size: 32, micro_batches: 2}\n" +
		"stages:\n  - {layers: \"0\", address: 127.0.0.1:7101}\n  - {layers: \"1\", address: 127.0.0.1:7102}\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.UsesRendezvous() {
		t.Fatal("a config of fixed addresses uses a rendezvous")
	}
	return cfg
}

// TestLaunchTokenReachesStagesOnly runs a launch of an auto config as
// launch's RunE does (launch.json written, localRendezvous's environment,
// superviseRun) with a stage program that records its command line and its
// token, and fails its first attempt so that the job is restarted: every
// start of every stage holds the launch's token in its environment and not
// on its command line, and no file of the run directory holds it.
func TestLaunchTokenReachesStagesOnly(t *testing.T) {
	t.Setenv("MASTER_ADDR", "")
	cfg := autoConfig(t, "")
	seen := filepath.Join(t.TempDir(), "seen") // outside the run directory
	bin := fakeJob(t, `echo "argv $*" >> `+seen+`
echo "token $`+configs.TokenVariable+`" >> `+seen+`
case " $* " in *" --resume "*) exit 0;; esac
echo '{"step":5,"loss":1}' > "$dir/metrics.jsonl"
[ "$stage" = 1 ] && { echo "pipetrain: stage 1, step 6: 1F0: waiting for stage 0: peer closed the link: EOF"; exit 1; }
sleep 5
`)
	runDir := t.TempDir()
	info, err := newLaunchInfo(runFlags{config: cfg.Path}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeLaunchInfo(runDir, info); err != nil {
		t.Fatal(err)
	}
	opts := launcher.Options{Binary: bin, ConfigPath: cfg.Path, Stages: 2, RunDir: runDir, Out: &bytes.Buffer{}}
	if opts.Env, err = localRendezvous(cfg); err != nil {
		t.Fatal(err)
	}
	token, _ := envValue(opts.Env, configs.TokenVariable)
	if !hexToken.MatchString(token) {
		t.Fatalf("launch made no token: %q", opts.Env)
	}
	if err := superviseRun(context.Background(), &configs.Config{Recovery: configs.Recovery{MaxRestarts: 1}}, opts); err != nil {
		t.Fatalf("%v\n%s", err, opts.Out)
	}
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	var argv, tokens int
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		switch {
		case kind == "argv" && strings.Contains(rest, token):
			t.Errorf("a stage's command line holds the token: %s", rest)
		case kind == "argv":
			argv++
		case kind == "token" && rest != token:
			t.Errorf("a stage started with token %q, want the launch's", rest)
		case kind == "token":
			tokens++
		}
	}
	if argv != 4 || tokens != 4 {
		t.Errorf("recorded %d command lines and %d tokens, want 4 of each (2 stages, started twice):\n%s", argv, tokens, b)
	}
	files := 0
	err = filepath.WalkDir(runDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		b, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(b), token) {
			t.Errorf("%s holds the launch's token", path)
		}
		return err
	})
	if err != nil || files < 2 {
		t.Fatalf("reading the run directory: %v (%d files)", err, files)
	}
}

// TestRejoinStepIsTheLastWholeLine: a worker rejoins at the last step
// replica 0 wrote whole to metrics.jsonl, read while it writes (a line
// cut short is not counted), and not once replica 0 has logged every step.
func TestRejoinStepIsTheLastWholeLine(t *testing.T) {
	cfg := autoConfig(t, "train: {steps: 8}\n")
	dir := t.TempDir()
	if step, err := rejoinStep(cfg, dir); err != nil || step != 0 {
		t.Errorf("no metrics yet: %v, %v; want 0", step, err)
	}
	metrics := filepath.Join(dir, "metrics.jsonl")
	if err := os.WriteFile(metrics, []byte("{\"step\":1,\"loss\":2.3}\n{\"step\":2,\"loss\":2.1}\n{\"step\":3,\"lo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if step, err := rejoinStep(cfg, dir); err != nil || step != 2 {
		t.Errorf("two whole lines and a cut one: %v, %v; want 2", step, err)
	}
	if err := os.WriteFile(metrics, []byte("{\"step\":8,\"loss\":1.1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := rejoinStep(cfg, dir); err == nil || !strings.Contains(err.Error(), "all 8 steps") {
		t.Errorf("every step logged: %v, want a refusal", err)
	}
}
