package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/certs"
)

const certsConfig = `
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 12, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: gpipe
stages:
  - {layers: "0", address: "0.0.0.0:7001"}
  - {layers: "1-2", address: "10.0.0.2:7002"}
`

// TestCertsCommand: certs works on a config that cannot pass validation yet
// (it listens beyond loopback with no authentication), and the printed
// settings, pasted into the config, make it valid.
func TestCertsCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(cfg, []byte(certsConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := configs.Load(cfg); err == nil {
		t.Fatal("the config validates without authentication")
	}
	out, err := runCommand(t, certsCmd(), "--config", cfg, "--out", filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	snippet := "transport:\n  tls:\n    ca: \"pki/ca.pem\"\n    cert: \"pki/stage-{stage}.pem\"\n    key: \"pki/stage-{stage}-key.pem\"\n"
	if !strings.Contains(out, snippet) {
		t.Fatalf("output lacks the settings %q:\n%s", snippet, out)
	}
	for _, name := range []string{"ca.pem", "ca-key.pem", "stage-0.pem", "stage-0-key.pem", "stage-1.pem", "stage-1-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, "pki", name)); err != nil {
			t.Error(err)
		}
	}
	if err := os.WriteFile(cfg, []byte(certsConfig+snippet), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := configs.Load(cfg)
	if err != nil {
		t.Fatalf("config with the printed settings: %v", err)
	}
	if _, cert, _ := c.TLSFiles(1); cert != filepath.Join(dir, "pki", "stage-1.pem") {
		t.Errorf("stage 1 certificate resolves to %s", cert)
	}

	// Existing files are kept unless --force.
	if _, err := runCommand(t, certsCmd(), "--config", cfg, "--out", filepath.Join(dir, "pki")); !errors.Is(err, certs.ErrExists) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("second run: %v", err)
	}
	if _, err := runCommand(t, certsCmd(), "--config", cfg, "--out", filepath.Join(dir, "pki"), "--force"); err != nil {
		t.Errorf("--force: %v", err)
	}
}

func TestCertsBadAddress(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(certsConfig, "10.0.0.2:7002", "10.0.0.2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := runCommand(t, certsCmd(), "--config", cfg, "--out", t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), cfg+": stages[1].address:") {
		t.Errorf("got %v", err)
	}
}

func TestConfigRelative(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "configs", "run.yaml")
	for out, want := range map[string]string{
		filepath.Join(dir, "configs"):        ".",
		filepath.Join(dir, "configs", "pki"): "pki",
		filepath.Join(dir, "pki"):            filepath.Join(dir, "pki"),
	} {
		if got := configRelative(cfg, out); got != want {
			t.Errorf("configRelative(%s) = %s, want %s", out, got, want)
		}
	}
}
