package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/models"
)

// FuzzConfigLoad feeds arbitrary bytes to Load as a YAML config file. Load must
// never panic or hang; it either fails with an error that names the file, or
// returns a config that is valid again, has a stable digest and places every
// layer of the model on exactly one model stage, in order.
//
// Seeds: testdata/fuzz/FuzzConfigLoad holds the example configs of this folder
// and broken variants of them.
func FuzzConfigLoad(f *testing.F) {
	// PIPETRAIN_* variables override the file; the fuzzer must see only the file.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PIPETRAIN_") {
			f.Setenv(k, "") // restored when the test ends
			os.Unsetenv(k)
		}
	}
	f.Add([]byte(""))
	// One file per process, rewritten for every input: inputs run one at a
	// time in a process, and a directory per input would cost more than Load.
	path := filepath.Join(f.TempDir(), "run.yaml")
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path)
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error does not name the file %s: %v", path, err)
			}
			return
		}
		if c.Path != path {
			t.Fatalf("Path = %q, want %q", c.Path, path)
		}
		digest := c.Digest()
		if err := c.Validate(); err != nil {
			t.Fatalf("a loaded config fails Validate again: %v", err)
		}
		if d := c.Digest(); d != digest {
			t.Fatalf("digest changed by validating again: %s, then %s", digest, d)
		}
		again, err := Load(path)
		if err != nil {
			t.Fatalf("loaded once, then failed: %v", err)
		}
		if d := again.Digest(); d != digest {
			t.Fatalf("digest differs between two loads of the same file: %s, then %s", digest, d)
		}

		if c.Data.MicroBatches < 1 || c.MicroBatchSize()*c.Data.MicroBatches != c.Data.BatchSize {
			t.Fatalf("batch size %d does not split into %d micro-batches", c.Data.BatchSize, c.Data.MicroBatches)
		}
		model, err := models.Build(c.Model)
		if err != nil {
			t.Fatalf("valid config, but its model does not build: %v", err)
		}
		if c.VirtualStages < 1 || len(c.Stages) == 0 {
			t.Fatalf("valid config with %d stages and virtual_stages %d", len(c.Stages), c.VirtualStages)
		}
		// Model stage k (chunk k/p of stage k%p) starts where model stage k-1
		// ended, is not empty, and the last one ends at the model's last layer.
		next := 0
		for k := range c.ModelStages() {
			stage, chunk := c.Place(k)
			first, last := c.ChunkLayers(stage, chunk)
			if first != next || last <= first || last > len(model.Layers) {
				t.Fatalf("model stage %d (stages[%d] chunk %d) holds layers [%d, %d); want it to start at %d and end by %d",
					k, stage, chunk, first, last, next, len(model.Layers))
			}
			next = last
		}
		if next != len(model.Layers) {
			t.Fatalf("the stages place layers [0, %d) of a %d-layer model", next, len(model.Layers))
		}
		if _, err := c.BuildSchedule(); err != nil {
			t.Fatalf("valid config, but its schedule does not build: %v", err)
		}
	})
}
