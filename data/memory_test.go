package data

import (
	"compress/gzip"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// liveHeap is the bytes of live heap objects after a collection.
func liveHeap() int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// drawFashion opens dataset fashion-mnist in dir as the demo's first stage
// does (inputs, and the test split to evaluate), draws steps steps of 8
// micro-batches of 32 and one evaluation pass, and returns how much the live
// heap grew with the source open.
func drawFashion(t *testing.T, dir string, steps int, o OpenOptions) int64 {
	t.Helper()
	s := &Section{Config: "run.yaml", Dataset: "fashion-mnist", Dir: dir, BatchSize: 256, MicroBatch: 32, Seed: 1, Evaluate: true}
	m := &Model{Name: "mlp", Example: []int{784}, Classes: 10, Targets: 1}
	x := make([]float32, 32*784)
	before := liveHeap()
	o.Inputs, o.Targets = true, true
	src, err := Open(s, m, o)
	if err != nil {
		t.Fatal(err)
	}
	for step := range steps {
		for mb := range 8 {
			src.Train(step, mb, Inputs{F32: x}, true)
		}
	}
	for k := range src.EvalBatches() {
		src.Eval(k, Inputs{F32: x}, true)
	}
	grew := liveHeap() - before
	runtime.KeepAlive(src)
	return grew
}

// TestFashionReadInPlace: the first stage of the demo held all of
// Fashion-MNIST in its heap as float32 (70000 images, 219 MB); it now reads
// the images in place, so its heap grows by less than a MiB, with
// uncompressed IDX files (mapped) and with Debian's gzipped ones
// (decompressed into an unlinked temporary file, mapped).
func TestFashionReadInPlace(t *testing.T) {
	if _, err := os.Stat(DefaultDir); err != nil {
		testenv.RequireOrSkip(t, "Debian package dataset-fashion-mnist (installed by make deps)", err.Error())
	}
	raw := t.TempDir()
	for _, name := range []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"} {
		gunzip(t, filepath.Join(DefaultDir, name+".gz"), filepath.Join(raw, name))
	}
	const stored = 70000 * (784 + 1) // bytes of the images and labels
	mapped := drawFashion(t, raw, 50, OpenOptions{})
	gz := drawFashion(t, DefaultDir, 50, OpenOptions{})
	// The loader of old, which scaled every pixel into the heap up front.
	before := liveHeap()
	train, err := LoadFashionMNIST(DefaultDir, "train", true, true)
	if err != nil {
		t.Fatal(err)
	}
	test, err := LoadFashionMNIST(DefaultDir, "test", true, true)
	if err != nil {
		t.Fatal(err)
	}
	whole := liveHeap() - before
	runtime.KeepAlive(train)
	runtime.KeepAlive(test)
	t.Logf("live heap growth with the source open: %d bytes mapped, %d bytes gzipped; %d bytes for the dataset loaded whole as float32", mapped, gz, whole)
	for what, grew := range map[string]int64{"uncompressed": mapped, "gzipped": gz} {
		if grew > 1<<20 {
			t.Errorf("reading %s IDX files grew the heap by %d bytes", what, grew)
		}
	}
	if whole < stored {
		t.Errorf("the dataset loaded whole took %d bytes, less than the %d it stores", whole, stored)
	}
}

// gunzip writes the decompressed bytes of gzipped file from to to.
func gunzip(t *testing.T, from, to string) {
	t.Helper()
	f, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// vmRSS is the process's resident set (VmRSS of /proc/self/status), in
// bytes; the test skips where the system has no such file.
func vmRSS(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status to read the resident set from: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("/proc/self/status has no VmRSS")
	return 0
}

// TestTokenFileTrainsInBoundedRSS: training from a 1 GiB token file (its
// tokens written, not a sparse file) grows the process's resident set by
// less than 50 MB over a few hundred steps, since the windows are read in
// place from the mapping.
func TestTokenFileTrainsInBoundedRSS(t *testing.T) {
	const n = 1 << 29 // uint16 tokens: 1 GiB
	dir := t.TempDir()
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		t.Skipf("cannot tell the free space of %s: %v", dir, err)
	}
	if free := int64(fs.Bavail) * int64(fs.Bsize); free < 1200<<20 {
		t.Skipf("needs 1.2 GB free in the temporary directory %s for a 1 GiB token file; it has %d MB", dir, free>>20)
	}
	path := filepath.Join(dir, "big.bin")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(llmcBytes(20240520, 1, n, nil, 2)); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<21)
	for i := 0; i < n; i += len(chunk) / 2 {
		for j := range len(chunk) / 2 {
			binary.LittleEndian.PutUint16(chunk[2*j:], uint16((i+j)*7919%50257))
		}
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s := &Section{Config: "run.yaml", Dataset: "tokens", BatchSize: 32, MicroBatch: 8, Seed: 1,
		Resolve: func(p string) string { return filepath.Join(dir, p) }, Own: map[string]any{"train_shards": "big.bin"}}
	m := &Model{Name: "gpt", Example: []int{256}, Classes: 50257, Vocab: 50257, Targets: 256}
	x := make([]float32, 8*256)
	// Freed heap handed back to the system, so that what earlier tests
	// freed does not shrink the resident set while this one measures it.
	debug.FreeOSMemory()
	before := vmRSS(t)
	src, err := Open(s, m, OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	for step := range 300 {
		for mb := range 4 {
			src.Train(step, mb, Inputs{F32: x}, true)
		}
	}
	debug.FreeOSMemory()
	grew := vmRSS(t) - before
	t.Logf("resident set grew by %d bytes (%.1f MB) drawing 1200 micro-batches from a 1 GiB token file", grew, float64(grew)/1e6)
	if grew >= 50e6 {
		t.Errorf("the resident set grew by %d bytes reading a 1 GiB token file, not under 50 MB", grew)
	}
	runtime.KeepAlive(src)
}
