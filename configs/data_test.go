package configs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// writeIDX writes an uncompressed IDX file of unsigned bytes.
func writeIDX(t *testing.T, path string, dims []uint32, payload []byte) {
	t.Helper()
	b := []byte{0, 0, 8, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	if err := os.WriteFile(path, append(b, payload...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// imageData writes a train and a test split of 2×2 images with the given
// labels into a folder "idx" beside a config, which names it relatively.
func imageData(t *testing.T, train, test []byte) (config, dir string) {
	t.Helper()
	root := t.TempDir()
	dir = filepath.Join(root, "idx")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for prefix, labels := range map[string][]byte{"train": train, "t10k": test} {
		n := uint32(len(labels))
		writeIDX(t, filepath.Join(dir, prefix+"-images-idx3-ubyte"), []uint32{n, 2, 2}, make([]byte, 4*n))
		writeIDX(t, filepath.Join(dir, prefix+"-labels-idx1-ubyte"), []uint32{n}, labels)
	}
	config = filepath.Join(root, "run.yaml")
	text := strings.NewReplacer("input: 8", "input: 4", "batch_size: 12", "dir: idx, batch_size: 12").Replace(good)
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return config, dir
}

// TestCheckDataLabelsAgainstClasses: a label at or beyond model.classes, in
// the training or the test split, is refused before the run, naming the file
// and the example; data.dir is found beside the config, not in the working
// directory.
func TestCheckDataLabelsAgainstClasses(t *testing.T) {
	labels := make([]byte, 12)
	for i := range labels {
		labels[i] = byte(i % 3)
	}
	config, dir := imageData(t, labels, []byte{0, 1, 2, 1})
	c, err := Load(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); err != nil {
		t.Fatalf("labels 0-2 of 3 classes: %v", err)
	}

	t.Setenv("PIPETRAIN_MODEL_CLASSES", "2")
	if c, err = Load(config); err != nil {
		t.Fatal(err)
	}
	want := config + ": data: " + filepath.Join(dir, "train-labels-idx1-ubyte") + ": label 2 of example 2 is not below model.classes 2"
	if err := c.CheckData(); err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}

	// The test split is read when the run evaluates, and only then.
	t.Setenv("PIPETRAIN_MODEL_CLASSES", "3")
	if err := os.WriteFile(filepath.Join(dir, "t10k-labels-idx1-ubyte"), append([]byte{0, 0, 8, 1, 0, 0, 0, 4}, 0, 1, 3, 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err = Load(config); err != nil {
		t.Fatal(err)
	}
	want = filepath.Join(dir, "t10k-labels-idx1-ubyte") + ": label 3 of example 2 is not below model.classes 3"
	if err := c.CheckData(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("test split: err = %v\nwant one containing %s", err, want)
	}
	t.Setenv("PIPETRAIN_TRAIN_EVALUATE", "false")
	if c, err = Load(config); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); err != nil {
		t.Errorf("a run that does not evaluate refused for its test split: %v", err)
	}
}

// TestCheckDataFeaturesAgainstInput: images of another size than
// model.input are refused before the run, naming the file.
func TestCheckDataFeaturesAgainstInput(t *testing.T) {
	config, dir := imageData(t, make([]byte, 12), make([]byte, 4))
	t.Setenv("PIPETRAIN_MODEL_INPUT", "784")
	c, err := Load(config)
	if err != nil {
		t.Fatal(err)
	}
	want := config + ": data: " + filepath.Join(dir, "train-images-idx3-ubyte") + ": examples have 4 features; model.input is 784"
	if err := c.CheckData(); err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

// TestCheckDataMissingIsNotExist: data absent from this machine is told
// apart from data that contradicts the model.
func TestCheckDataMissingIsNotExist(t *testing.T) {
	t.Setenv("PIPETRAIN_DATA_DIR", filepath.Join(t.TempDir(), "nowhere"))
	c, err := Load(writeConfig(t, good))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "data.dir: ") {
		t.Errorf("err = %v, want a data.dir error wrapping fs.ErrNotExist", err)
	}
}

// TestCheckDataVocabulary: the char tokenizer's symbol count must be
// model.vocab; the corpus is found beside the config.
func TestCheckDataVocabulary(t *testing.T) {
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
	c, err := Load(config)
	if err != nil {
		t.Fatal(err)
	}
	want := config + ": model.vocab is 5; the char tokenizer finds 4 symbols in " + filepath.Join(root, "corpus.txt")
	if err := c.CheckData(); err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
	t.Setenv("PIPETRAIN_MODEL_VOCAB", "4")
	if c, err = Load(config); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckData(); err != nil {
		t.Errorf("vocab 4: %v", err)
	}
}

// TestCheckDataReadsNoWholeCorpus: validating a text config finds the corpus
// and its vocabulary without loading it: a 64 MiB corpus costs the check
// less than a MiB of memory, with either tokenizer, and a wrong vocabulary
// is still found by the char tokenizer's one streaming pass.
func TestCheckDataReadsNoWholeCorpus(t *testing.T) {
	root := t.TempDir()
	corpus := filepath.Join(root, "corpus.txt")
	f, err := os.Create(corpus)
	if err != nil {
		t.Fatal(err)
	}
	// "ab" then zero bytes (a sparse file): three symbols.
	if _, err := f.WriteString("ab"); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	config := filepath.Join(root, "gpt.yaml")
	for _, tc := range []struct {
		tokenizer string
		vocab     int
		want      string
	}{
		{"byte", 256, ""},
		{"char", 3, ""},
		{"char", 4, config + ": model.vocab is 4; the char tokenizer finds 3 symbols in " + corpus},
	} {
		text := fmt.Sprintf(`
model: {name: gpt, vocab: %d, context: 4, width: 8, heads: 2, layers: 2}
data: {dataset: text, corpus: corpus.txt, tokenizer: %s, batch_size: 8, micro_batches: 4}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2-3", address: 127.0.0.1:7002}
`, tc.vocab, tc.tokenizer)
		if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(config)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err = c.CheckData()
		runtime.ReadMemStats(&after)
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && got != tc.want {
			t.Errorf("%s tokenizer, vocab %d: err = %v, want %q", tc.tokenizer, tc.vocab, err, tc.want)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Errorf("%s tokenizer: checking a 64 MiB corpus allocated %d bytes", tc.tokenizer, alloc)
		}
	}
}
