package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// labelsConfig writes 2×2 images with labels 0, 1, 2 (twelve of them) into
// a folder idx beside a config of an MLP with the given classes, and
// returns the config and the labels file.
func labelsConfig(t *testing.T, classes string) (config, labels string) {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "idx")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, dims []uint32, payload []byte) {
		b := []byte{0, 0, 8, byte(len(dims))}
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(b, payload...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lbl := make([]byte, 12)
	for i := range lbl {
		lbl[i] = byte(i % 3)
	}
	write("train-images-idx3-ubyte", []uint32{12, 2, 2}, make([]byte, 48))
	write("train-labels-idx1-ubyte", []uint32{12}, lbl)
	config = filepath.Join(root, "run.yaml")
	text := `
model: {name: mlp, input: 4, hidden: [6], classes: ` + classes + `}
data: {dir: idx, batch_size: 4, micro_batches: 2}
train: {steps: 3, evaluate: false, optimizer: {name: sgd, lr: 0.1}}
schedule: gpipe
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "1", address: 127.0.0.1:7002}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return config, filepath.Join(dir, "train-labels-idx1-ubyte")
}

// TestLabelsBeyondClassesRefusedBeforeAnyStage: with model.classes 2 and a
// label 2 in the data, which once validated and then crashed a stage or
// trained on corrupted targets, validate, launch and reference all refuse
// the config with one error naming the labels file and the first bad
// example, and launch starts no stage (its run directory is never made).
func TestLabelsBeyondClassesRefusedBeforeAnyStage(t *testing.T) {
	config, labels := labelsConfig(t, "2")
	want := config + ": data: " + labels + ": label 2 of example 2 is not below model.classes 2"

	cmd := validateCmd()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if out, err := runCommand(t, cmd, "--config", config); err == nil || err.Error() != want {
		t.Errorf("validate: err = %v\nwant %s\noutput:\n%s", err, want, out)
	}

	runDir := filepath.Join(t.TempDir(), "run")
	for name, cmd := range map[string]func() *cobra.Command{"launch": launchCmd, "reference": referenceCmd} {
		c := cmd()
		c.SilenceUsage, c.SilenceErrors = true, true
		if _, err := runCommand(t, c, "--config", config, "--run-dir", runDir); err == nil || err.Error() != want {
			t.Errorf("%s: err = %v\nwant %s", name, err, want)
		}
		if _, err := os.Stat(runDir); !os.IsNotExist(err) {
			t.Errorf("%s made its run directory before refusing the data (%v)", name, err)
		}
	}

	// With enough classes the same data validates.
	config, _ = labelsConfig(t, "3")
	cmd = validateCmd()
	if out, err := runCommand(t, cmd, "--config", config); err != nil || !strings.Contains(out, ": ok\n") {
		t.Errorf("classes 3: err = %v, output:\n%s", err, out)
	}
}

// TestValidateRefusesWhatLaunchRefuses: a char vocabulary unlike
// model.vocab, once a warning under "ok" that launch then refused, is an
// error; data missing from this machine is a note, since the config may be
// meant for hosts that have it.
func TestValidateRefusesWhatLaunchRefuses(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "corpus.txt"), []byte(strings.Repeat("abcab ", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(root, "gpt.yaml")
	text := `
model: {name: gpt, vocab: 5, context: 4, width: 8, heads: 2, layers: 2}
data: {dataset: text, corpus: corpus.txt, tokenizer: char, batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	want := config + ": model.vocab is 5; the char tokenizer finds 4 symbols in " + filepath.Join(root, "corpus.txt")
	for name, args := range map[string][]string{"validate": nil, "launch": {"--run-dir", filepath.Join(root, "run")}} {
		c := map[string]func() *cobra.Command{"validate": validateCmd, "launch": launchCmd}[name]()
		c.SilenceUsage, c.SilenceErrors = true, true
		if out, err := runCommand(t, c, append([]string{"--config", config}, args...)...); err == nil || err.Error() != want {
			t.Errorf("%s: err = %v\nwant %s\noutput:\n%s", name, err, want, out)
		}
	}

	t.Setenv("PIPETRAIN_DATA_CORPUS", "elsewhere.txt")
	c := validateCmd()
	out, err := runCommand(t, c, "--config", config)
	if err != nil || !strings.Contains(out, ": ok\n") || !strings.Contains(out, "  note: data not checked against the model: ") || !strings.Contains(out, "elsewhere.txt") {
		t.Errorf("missing corpus: err = %v, output:\n%s", err, out)
	}
}
