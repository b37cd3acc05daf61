package stages

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/data"
)

// writeArrays writes the runtime tests' synthetic splits as dataset arrays
// into dir: the training features as a float32 .npy, its labels as an int64
// .npy, the test split as tensors of a safetensors file (features written
// by checkpoint.Write, labels as uint8 .npy); it returns the data section's
// own keys naming them.
func writeArrays(t *testing.T, dir string, train, test *data.Dataset) map[string]any {
	t.Helper()
	npy := func(name, descr string, shape []int, payload []byte) {
		dims := make([]string, len(shape))
		for i, d := range shape {
			dims[i] = fmt.Sprint(d)
		}
		tuple := strings.Join(dims, ", ")
		if len(shape) == 1 {
			tuple += ","
		}
		head := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, tuple)
		head += strings.Repeat(" ", 64-(10+len(head)+1)%64) + "\n"
		b := binary.LittleEndian.AppendUint16([]byte("\x93NUMPY\x01\x00"), uint16(len(head)))
		if err := os.WriteFile(filepath.Join(dir, name), append(append(b, head...), payload...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var x, y []byte
	for _, v := range train.Images {
		x = binary.LittleEndian.AppendUint32(x, math.Float32bits(v))
	}
	for _, l := range train.Labels {
		y = binary.LittleEndian.AppendUint64(y, uint64(l))
	}
	npy("x.npy", "<f4", []int{train.N, train.Dim}, x)
	npy("y.npy", "<i8", []int{train.N}, y)
	npy("test_y.npy", "|u1", []int{test.N}, test.Labels)
	err := checkpoint.Write(filepath.Join(dir, "test.safetensors"), []checkpoint.Tensor{{Name: "images", Shape: []int{test.N, test.Dim}, F32: test.Images}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"train_features": "x.npy", "train_labels": "y.npy", "test_features": "test.safetensors:images", "test_labels": "test_y.npy"}
}

// TestArraysTrainLikeReference: an MLP fed from dataset arrays (NumPy files
// and a safetensors tensor, mapped and read in place) trains pipelined bit
// for bit as its one-process reference, evaluation included; and as the
// same examples held in memory and served as Fashion-MNIST's are, since
// both kinds draw their batches alike.
func TestArraysTrainLikeReference(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float64", "adam")
	held := runInProcess(t, cfg, true) // fashion-mnist, the synthetic splits handed in

	dir := t.TempDir()
	cfg.Data.Dataset = "arrays"
	cfg.Data.Own = writeArrays(t, dir, synthetic(96, 8, 3, 1), synthetic(30, 8, 3, 2))
	for k, v := range cfg.Data.Own {
		cfg.Data.Own[k] = filepath.Join(dir, v.(string))
	}
	if err := cfg.CheckData(); err != nil {
		t.Fatalf("CheckData: %v", err)
	}
	ref := runInProcess(t, cfg, true)
	pipe := runInProcess(t, cfg, false)
	sameMLPRun(t, cfg, ref, pipe)
	sameMLPRun(t, cfg, held, ref)
}
