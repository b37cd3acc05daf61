package e2e

import (
	endian "encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// npy is a .npy file (format version 1) of dtype descr and shape holding
// payload, as np.save writes it.
func npy(descr string, shape []int, payload []byte) []byte {
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
	b := endian.LittleEndian.AppendUint16([]byte("\x93NUMPY\x01\x00"), uint16(len(head)))
	return append(append(b, head...), payload...)
}

// writeArrays writes a dataset of n training and m test examples of
// 28×28 uint8 pixels and 10 classes into dir: the training split as .npy
// files (int64 labels), the test split as tensors of a safetensors file
// (int32 labels), each class's pixels brighter in a band of its own so
// that a model can learn them.
func writeArrays(t *testing.T, dir string, n, m int) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 0))
	split := func(k int) (pixels []byte, labels []int) {
		for range k {
			c := r.IntN(10)
			labels = append(labels, c)
			for p := range 784 {
				v := r.IntN(96)
				if p/78 == c {
					v += 150
				}
				pixels = append(pixels, byte(v))
			}
		}
		return pixels, labels
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	x, y := split(n)
	var y64 []byte
	for _, l := range y {
		y64 = endian.LittleEndian.AppendUint64(y64, uint64(l))
	}
	write("x_train.npy", npy("|u1", []int{n, 28, 28}, x))
	write("y_train.npy", npy("<i8", []int{n}, y64))

	xt, yt := split(m)
	var y32 []byte
	for _, l := range yt {
		y32 = endian.LittleEndian.AppendUint32(y32, uint32(l))
	}
	header, err := json.Marshal(map[string]any{
		"images": map[string]any{"dtype": "U8", "shape": []int{m, 784}, "data_offsets": []int{0, len(xt)}},
		"labels": map[string]any{"dtype": "I32", "shape": []int{m}, "data_offsets": []int{len(xt), len(xt) + len(y32)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st := endian.LittleEndian.AppendUint64(nil, uint64(len(header)))
	write("test.safetensors", append(append(append(st, header...), xt...), y32...))
}

// TestArraysEqualReference: an MLP trained from dataset arrays (.npy files
// and safetensors tensors, each process mapping them itself) on a grid of
// 2 stages × 2 replicas equals the one-process reference bit for bit, every
// step's loss, the evaluations and the final weights. A label beyond the
// model's classes is refused by key and file before any stage starts.
func TestArraysEqualReference(t *testing.T) {
	dir := t.TempDir()
	writeArrays(t, dir, 640, 200)
	arrays := fmt.Sprintf(`data: {dataset: arrays, train_features: %q, train_labels: %q, test_features: %q, test_labels: %q, batch_size: 128, micro_batches: 4}`,
		filepath.Join(dir, "x_train.npy"), filepath.Join(dir, "y_train.npy"), filepath.Join(dir, "test.safetensors:images"), filepath.Join(dir, "test.safetensors:labels"))
	body := strings.Replace(gridMLP, "data: {batch_size: 128, micro_batches: 4}", arrays, 1)
	body = strings.Replace(body, "train: {steps: 30, evaluate: false,", "train: {steps: 12, seed: 7, evaluate: true, eval_every: 6,", 1)
	cfg := gridConfig(t, body+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	refDir, gridDir := t.TempDir(), t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
	if res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	got := sameRun(t, refDir, gridDir, 12)
	sameEval(t, refDir, gridDir)
	if got[5].Eval == nil || !(got[11].Loss < got[0].Loss) {
		t.Errorf("no evaluation at step 6, or the loss did not fall: %v -> %v", got[0].Loss, got[11].Loss)
	}

	// Labels of 11 classes for a model of 10.
	labels := filepath.Join(dir, "y_train.npy")
	b, err := os.ReadFile(labels)
	if err != nil {
		t.Fatal(err)
	}
	endian.LittleEndian.PutUint64(b[len(b)-8*3:], 10)
	if err := os.WriteFile(labels, b, 0o644); err != nil {
		t.Fatal(err)
	}
	res = run(t, time.Minute, nil, "launch", "--config", cfg, "--run-dir", t.TempDir())
	want := "data.train_labels: data: " + labels + ": label 10 of example 637 is not below model.classes 10"
	if res.err == nil || !strings.Contains(res.out, want) || strings.Contains(res.out, "[stage 0") {
		t.Errorf("launch with label 10: %v, want %q before any stage starts\n%s", res.err, want, res.out)
	}
}
