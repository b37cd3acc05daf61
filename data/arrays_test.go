package data

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// npyBytes is a .npy file (format version 1) of dtype descr and shape,
// holding payload, as np.save writes it.
func npyBytes(descr string, shape []int, payload []byte) []byte {
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
	return append(append(b, head...), payload...)
}

// safetensorsBytes is a safetensors file of the named tensors, each given
// as its dtype, shape and raw bytes, written in the order given.
func safetensorsBytes(tensors ...struct {
	name, dtype string
	shape       []int
	data        []byte
}) []byte {
	header := map[string]any{}
	var body []byte
	for _, t := range tensors {
		header[t.name] = map[string]any{"dtype": t.dtype, "shape": t.shape, "data_offsets": []int{len(body), len(body) + len(t.data)}}
		body = append(body, t.data...)
	}
	h, _ := json.Marshal(header)
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(b, h...), body...)
}

// tensorBytes is one tensor for safetensorsBytes.
func tensorBytes(name, dtype string, shape []int, data []byte) struct {
	name, dtype string
	shape       []int
	data        []byte
} {
	return struct {
		name, dtype string
		shape       []int
		data        []byte
	}{name, dtype, shape, data}
}

// pixels are n examples of dim uint8 values, varied.
func pixels(n, dim int) []byte {
	b := make([]byte, n*dim)
	for i := range b {
		b[i] = byte(i*37 + i/dim)
	}
	return b
}

// classesOf are n labels below classes, varied.
func classesOf(n, classes int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i*5+i/3) % int64(classes)
	}
	return out
}

// f32Bytes and f16Bytes are values as little-endian float32 and float16.
func f32Bytes(v []float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// arraysConfig is a Section of dataset arrays in dir with the given specs.
func arraysConfig(dir string, evaluate bool, batch, micro int, specs ...string) *Section {
	own := map[string]any{}
	for i, k := range []string{"train_features", "train_labels", "test_features", "test_labels"} {
		if i < len(specs) {
			own[k] = specs[i]
		}
	}
	return &Section{Config: "run.yaml", Dataset: "arrays", BatchSize: batch, MicroBatch: micro, Seed: 3, Evaluate: evaluate,
		Resolve: func(p string) string { return filepath.Join(dir, p) }, Own: own}
}

// batches draws every micro-batch of steps training steps and every
// evaluation batch from src, into float32 and float64 inputs, as strings
// that compare bit for bit.
func batches(t *testing.T, src Source, steps, micro, rows, dim int) []string {
	t.Helper()
	var out []string
	x32, x64 := make([]float32, rows*dim), make([]float64, rows*dim)
	for step := range steps {
		for mb := range micro {
			y := src.Train(step, mb, Inputs{F32: x32}, true)
			src.Train(step, mb, Inputs{F64: x64}, false)
			out = append(out, fmt.Sprintf("train %d/%d: %v %v %v", step, mb, bits32(x32), bits64(x64), y))
		}
	}
	for k := range src.EvalBatches() {
		y, n := src.Eval(k, Inputs{F32: x32}, true)
		src.Eval(k, Inputs{F64: x64}, false)
		out = append(out, fmt.Sprintf("eval %d: %v %v %v %d", k, bits32(x32), bits64(x64), y, n))
	}
	return out
}

func bits32(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

func bits64(v []float64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = math.Float64bits(x)
	}
	return out
}

// TestArraysServeFashionBatches: the same images and labels served by
// fashion-mnist (IDX files, uncompressed and gzipped), by arrays from .npy
// files and from safetensors tensors, and as a Dataset held in memory (the
// loader of old, which scaled every pixel up front) give the same training
// and evaluation batches, bit for bit, in float32 and float64.
func TestArraysServeFashionBatches(t *testing.T) {
	const n, nTest, dim, classes = 40, 13, 4, 3
	imgs, test := pixels(n, dim), pixels(nTest, dim)
	labels, testLabels := classesOf(n, classes), classesOf(nTest, classes)
	u8 := func(v []int64) []byte {
		b := make([]byte, len(v))
		for i, x := range v {
			b[i] = byte(x)
		}
		return b
	}
	raw, gz := t.TempDir(), t.TempDir()
	for _, dir := range []string{raw, gz} {
		writeFashion(t, dir, "train", dir == gz, imgs, u8(labels), n)
		writeFashion(t, dir, "t10k", dir == gz, test, u8(testLabels), nTest)
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "x.npy"), npyBytes("|u1", []int{n, 2, 2}, imgs))
	writeFile(t, filepath.Join(dir, "y.npy"), npyBytes("<i8", []int{n}, appendInts(nil, labels, 8)))
	writeFile(t, filepath.Join(dir, "xt.npy"), npyBytes("|u1", []int{nTest, dim}, test))
	writeFile(t, filepath.Join(dir, "yt.npy"), npyBytes("|u1", []int{nTest}, u8(testLabels)))
	writeFile(t, filepath.Join(dir, "d.safetensors"), safetensorsBytes(
		tensorBytes("test.labels", "I32", []int{nTest}, appendInts(nil, testLabels, 4)),
		tensorBytes("train.images", "U8", []int{n, dim}, imgs),
		tensorBytes("train.labels", "I64", []int{n}, appendInts(nil, labels, 8)),
		tensorBytes("test.images", "U8", []int{nTest, 2, 2}, test)))

	m := &Model{Name: "mlp", Example: []int{dim}, Classes: classes, Targets: 1}
	fashion := func(d string) *Section {
		return &Section{Config: "run.yaml", Dataset: "fashion-mnist", Dir: d, BatchSize: 8, MicroBatch: 4, Seed: 3, Evaluate: true}
	}
	open := func(s *Section, o OpenOptions) Source {
		t.Helper()
		src, err := Open(s, m, o)
		if err != nil {
			t.Fatalf("%s %s: %v", s.Dataset, s.Dir, err)
		}
		return src
	}
	all := OpenOptions{Inputs: true, Targets: true}
	trainSet, err := LoadFashionMNIST(raw, "train", true, true)
	if err != nil {
		t.Fatal(err)
	}
	testSet, err := LoadFashionMNIST(raw, "test", true, true)
	if err != nil {
		t.Fatal(err)
	}
	const steps = 12 // two epochs and a half of 5 steps
	want := batches(t, open(fashion(raw), OpenOptions{Inputs: true, Targets: true, Train: trainSet, Test: testSet}), steps, 2, 4, dim)
	// Where no temporary file can be made, gzipped files are read into the
	// heap.
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	heap := open(fashion(gz), all)
	if a := heap.(*classSource).trainSet.(*arraySplit).features; a.mapped != nil || len(a.data) != n*dim {
		t.Errorf("gzipped images without a temporary directory: mapped %d bytes, %d bytes of data", len(a.mapped), len(a.data))
	}
	os.Unsetenv("TMPDIR")
	for name, src := range map[string]Source{
		"fashion-mnist, gzipped, in the heap": heap,
		"fashion-mnist, IDX files":            open(fashion(raw), all),
		"fashion-mnist, gzipped IDX files":    open(fashion(gz), all),
		"arrays, .npy files":                  open(arraysConfig(dir, true, 8, 4, "x.npy", "y.npy", "xt.npy", "yt.npy"), all),
		"arrays, safetensors tensors":         open(arraysConfig(dir, true, 8, 4, "d.safetensors:train.images", "d.safetensors:train.labels", "d.safetensors:test.images", "d.safetensors:test.labels"), all),
		"arrays, IDX files":                   open(arraysConfig(raw, true, 8, 4, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"), all),
	} {
		got := batches(t, src, steps, 2, 4, dim)
		if len(got) != len(want) {
			t.Fatalf("%s: %d batches, want %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: batch %d differs:\n got %s\nwant %s", name, i, got[i], want[i])
				break
			}
		}
	}
}

// TestArraysOfFloats: float32 features written by checkpoint.Write and
// float16 features read as the values they hold, labels of int32.
func TestArraysOfFloats(t *testing.T) {
	const n, dim = 6, 3
	vals := make([]float32, n*dim)
	for i := range vals {
		vals[i] = float32(i)/7 - 1
	}
	dir := t.TempDir()
	if err := checkpoint.Write(filepath.Join(dir, "x.safetensors"), []checkpoint.Tensor{{Name: "features", Shape: []int{n, dim}, F32: vals}}, nil); err != nil {
		t.Fatal(err)
	}
	// float16 of i/8 - 1 is exact.
	var half []byte
	halves := make([]float32, n*dim)
	for i := range halves {
		halves[i] = float32(i)/8 - 1
		half = binary.LittleEndian.AppendUint16(half, toHalf(halves[i]))
	}
	writeFile(t, filepath.Join(dir, "h.npy"), npyBytes("<f2", []int{n, dim}, half))
	writeFile(t, filepath.Join(dir, "y.npy"), npyBytes("<i4", []int{n}, appendInts(nil, classesOf(n, 2), 4)))
	m := &Model{Name: "mlp", Example: []int{dim}, Classes: 2, Targets: 1}
	for _, c := range []struct {
		features string
		want     []float32
	}{{"x.safetensors:features", vals}, {"h.npy", halves}} {
		src, err := Open(arraysConfig(dir, false, n, n, c.features, "y.npy"), m, OpenOptions{Inputs: true, Targets: true})
		if err != nil {
			t.Fatalf("%s: %v", c.features, err)
		}
		x := make([]float32, n*dim)
		y := src.Train(0, 0, Inputs{F32: x}, true)
		sampler, err := NewSampler(3, n, n)
		if err != nil {
			t.Fatal(err)
		}
		rows := sampler.Indices(0)
		for i, r := range rows {
			if !slices.Equal(x[i*dim:(i+1)*dim], c.want[r*dim:(r+1)*dim]) || int64(y[i]) != classesOf(n, 2)[r] {
				t.Errorf("%s: row %d is example %d's? features %v label %d, want %v %d", c.features, i, r, x[i*dim:(i+1)*dim], y[i], c.want[r*dim:(r+1)*dim], classesOf(n, 2)[r])
			}
		}
	}
}

// toHalf is v as float16, for values that are exact in it.
func toHalf(v float32) uint16 {
	if v == 0 {
		return 0
	}
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

// TestArraysWrittenByNumPy: features and labels saved by np.save in each
// dtype the kind takes read back as NumPy wrote them.
func TestArraysWrittenByNumPy(t *testing.T) {
	testenv.NeedPython(t, "numpy", "python3-numpy")
	python := testenv.Python
	dir := t.TempDir()
	script := `
import sys
import numpy as np
d = sys.argv[1]
i = np.arange(5 * 6).reshape(5, 2, 3)
np.save(d + "/u8.npy", (i * 37 % 256).astype(np.uint8))
np.save(d + "/f32.npy", (i / 7 - 1).astype(np.float32))
np.save(d + "/f16.npy", (i / 8 - 1).astype(np.float16))
for t in ("int64", "int32", "uint8"):
    np.save(d + "/y_" + t + ".npy", (np.arange(5) * 3 % 4).astype(t))
`
	if out, err := exec.Command(python, "-c", script, dir).CombinedOutput(); err != nil {
		t.Fatalf("writing arrays with NumPy: %v\n%s", err, out)
	}
	for _, c := range []struct {
		file, dtype string
		value       func(i int) float32
	}{
		{"u8.npy", "uint8", func(i int) float32 { return float32(i*37%256) / 255 }},
		{"f32.npy", "float32", func(i int) float32 { return float32(float64(i)/7 - 1) }},
		{"f16.npy", "float16", func(i int) float32 { return float32(i)/8 - 1 }},
	} {
		a, err := OpenArray(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatal(err)
		}
		if a.DType != c.dtype || !slices.Equal(a.Shape, []int64{5, 2, 3}) || a.RowLen() != 6 {
			t.Errorf("%s: %s %v, want %s [5 2 3]", c.file, a.DType, a.Shape, c.dtype)
		}
		x := make([]float32, 30)
		gatherRows(a, []int{0, 1, 2, 3, 4}, x)
		for i, v := range x {
			if v != c.value(i) {
				t.Errorf("%s: value %d is %v, want %v", c.file, i, v, c.value(i))
				break
			}
		}
		a.Close()
	}
	for _, typ := range []string{"int64", "int32", "uint8"} {
		a, err := OpenArray(filepath.Join(dir, "y_"+typ+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if got := a.Label(i); a.DType != typ || got != int64(i*3%4) {
				t.Errorf("%s: label %d is %d (%s), want %d", typ, i, got, a.DType, i*3%4)
			}
		}
		a.Close()
	}
}

// TestArraysRefused: Validate names the keys a config lacks; Check refuses,
// by config key and file, arrays unfit for the model before any stage
// starts.
func TestArraysRefused(t *testing.T) {
	k, ok := Lookup("arrays")
	if !ok {
		t.Fatal("dataset kind arrays is not registered")
	}
	var problems []string
	problem := func(key, format string, args ...any) {
		problems = append(problems, key+": "+fmt.Sprintf(format, args...))
	}
	k.Validate(&Section{Evaluate: true, Own: map[string]any{"train_features": "x.safetensors", "test_labels": 3}}, &Model{Name: "gpt", Targets: 8}, problem)
	for _, want := range []string{
		"data.test_labels: is a number, want a string",
		"data.train_labels: missing",
		"data.test_features: missing; the run evaluates",
		"data.train_features: x.safetensors: name the tensor, as x.safetensors:NAME",
		"data.dataset: arrays holds labelled examples; model gpt predicts tokens",
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, want) }) {
			t.Errorf("problems %q lack %q", problems, want)
		}
	}

	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	writeFile(t, path("x.npy"), npyBytes("|u1", []int{6, 4}, pixels(6, 4)))
	writeFile(t, path("x3.npy"), npyBytes("|u1", []int{6, 3}, pixels(6, 3)))
	writeFile(t, path("xi.npy"), npyBytes("<i4", []int{6, 4}, make([]byte, 6*4*4)))
	writeFile(t, path("y.npy"), npyBytes("<i8", []int{6}, appendInts(nil, []int64{0, 1, 2, 1, 0, 2}, 8)))
	writeFile(t, path("yneg.npy"), npyBytes("<i8", []int{6}, appendInts(nil, []int64{0, 1, -1, 1, 0, 2}, 8)))
	writeFile(t, path("y5.npy"), npyBytes("<i8", []int{5}, appendInts(nil, []int64{0, 1, 2, 1, 0}, 8)))
	writeFile(t, path("y2d.npy"), npyBytes("<i8", []int{6, 1}, appendInts(nil, []int64{0, 1, 2, 1, 0, 2}, 8)))
	writeFile(t, path("yf.npy"), npyBytes("<f4", []int{6}, f32Bytes(make([]float32, 6))))
	writeFile(t, path("short.npy"), npyBytes("|u1", []int{6, 4}, pixels(5, 4)))
	writeFile(t, path("fortran.npy"), []byte(strings.Replace(string(npyBytes("|u1", []int{6, 4}, pixels(6, 4))), "False", "True ", 1)))
	writeFile(t, path("bool.npy"), npyBytes("|b1", []int{6, 4}, make([]byte, 24)))
	writeFile(t, path("d.safetensors"), safetensorsBytes(tensorBytes("x", "F32", []int{6, 4}, f32Bytes(make([]float32, 24))), tensorBytes("cut", "F32", []int{6, 4}, nil)))
	m := &Model{Name: "mlp", Example: []int{4}, Classes: 3, Targets: 1}
	if err := k.Check(arraysConfig(dir, false, 2, 1, "x.npy", "y.npy"), m); err != nil {
		t.Fatalf("good arrays refused: %v", err)
	}
	for _, c := range []struct {
		features, labels string
		classes          int
		want             string
		notExist         bool
	}{
		{"x.npy", "y.npy", 2, "run.yaml: data.train_labels: data: " + path("y.npy") + ": label 2 of example 2 is not below model.classes 2", false},
		{"x.npy", "yneg.npy", 3, "run.yaml: data.train_labels: data: " + path("yneg.npy") + ": label -1 of example 2 is negative", false},
		{"x3.npy", "y.npy", 3, "run.yaml: data.train_features: data: " + path("x3.npy") + ": examples have 3 features; model.input is 4", false},
		{"x.npy", "y5.npy", 3, "run.yaml: data.train_labels: data: " + path("y5.npy") + ": 5 labels, but " + path("x.npy") + " holds 6 examples", false},
		{"x.npy", "y2d.npy", 3, "run.yaml: data.train_labels: data: " + path("y2d.npy") + ": labels of shape [6 1]: want one label per example, [examples]", false},
		{"x.npy", "yf.npy", 3, "run.yaml: data.train_labels: data: " + path("yf.npy") + ": labels of dtype float32: want int64, int32 or uint8", false},
		{"xi.npy", "y.npy", 3, "run.yaml: data.train_features: data: " + path("xi.npy") + ": features of dtype int32: want uint8, float16 or float32", false},
		{"short.npy", "y.npy", 3, "run.yaml: data.train_features: data: " + path("short.npy") + ": the NumPy header gives shape [6 4] of uint8 (24 bytes after offset 128), the file holds 20 bytes there", false},
		{"fortran.npy", "y.npy", 3, "run.yaml: data.train_features: data: " + path("fortran.npy") + ": NumPy array in Fortran order", false},
		{"bool.npy", "y.npy", 3, "run.yaml: data.train_features: data: " + path("bool.npy") + ": NumPy dtype |b1", false},
		{"d.safetensors:y", "y.npy", 3, "run.yaml: data.train_features: data: " + path("d.safetensors") + `: no tensor "y" (it holds cut, x)`, false},
		{"d.safetensors:cut", "y.npy", 3, "run.yaml: data.train_features: data: " + path("d.safetensors") + ": tensor cut: the header gives shape [6 4] of float32 (96 bytes after offset 96), the file holds 0 bytes there", false},
		{"gone.npy", "y.npy", 3, "run.yaml: data.train_features: data: open " + path("gone.npy"), true},
	} {
		mm := *m
		mm.Classes = c.classes
		err := k.Check(arraysConfig(dir, false, 2, 1, c.features, c.labels), &mm)
		switch {
		case err == nil || !strings.HasPrefix(err.Error(), c.want):
			t.Errorf("%s, %s: err = %v\nwant %s", c.features, c.labels, err, c.want)
		case c.notExist && !errors.Is(err, fs.ErrNotExist):
			t.Errorf("%s: err = %v, want one wrapping fs.ErrNotExist", c.features, err)
		case !c.notExist && !errors.Is(err, ErrBadData):
			t.Errorf("%s, %s: err = %v, want one wrapping ErrBadData", c.features, c.labels, err)
		}
	}
	// A run that evaluates reads the test split too; one that does not,
	// not.
	if err := k.Check(arraysConfig(dir, true, 2, 1, "x.npy", "y.npy", "x.npy", "yneg.npy"), m); err == nil || !strings.HasPrefix(err.Error(), "run.yaml: data.test_labels: data: "+path("yneg.npy")) {
		t.Errorf("bad test labels: err = %v", err)
	}
	if err := k.Check(arraysConfig(dir, false, 2, 1, "x.npy", "y.npy", "x.npy", "yneg.npy"), m); err != nil {
		t.Errorf("a run that does not evaluate reads no test split: %v", err)
	}
}

// TestGzipIDXCutShort: a gzipped IDX file holding fewer bytes than its
// header says is refused as bad data naming the file, when a stage that
// reads its images decompresses it.
func TestGzipIDXCutShort(t *testing.T) {
	dir := t.TempDir()
	writeFashion(t, dir, "train", true, pixels(4, 4), []byte{0, 1, 2, 1, 0}, 5)
	s := &Section{Config: "run.yaml", Dataset: "fashion-mnist", Dir: dir, BatchSize: 2, MicroBatch: 1}
	_, err := Open(s, &Model{Name: "mlp", Example: []int{4}, Classes: 3, Targets: 1}, OpenOptions{Inputs: true})
	want := "data: " + filepath.Join(dir, "train-images-idx3-ubyte.gz") + ": idx: truncated: dimensions need 20 bytes of data, file has 16"
	if err == nil || !errors.Is(err, ErrBadData) || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}
