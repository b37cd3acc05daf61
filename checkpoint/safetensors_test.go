package checkpoint

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/runlog"
)

func TestRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.safetensors")
	in := []Tensor{
		{Name: "fc1.weight", Shape: []int{2, 3}, F32: []float32{1, -2, 3.5, 4, 5, 6}},
		{Name: "fc0.bias", Shape: []int{2}, F64: []float64{0.25, -1e-300}},
		{Name: "empty", Shape: []int{0}, F32: []float32{}},
	}
	if err := Write(p, in, map[string]string{"step": "7"}); err != nil {
		t.Fatal(err)
	}
	out, meta, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if meta["step"] != "7" || len(out) != 3 {
		t.Fatalf("meta %v, %d tensors", meta, len(out))
	}
	if out[0].Name != "empty" || !reflect.DeepEqual(out[1].F64, in[1].F64) || !reflect.DeepEqual(out[2].F32, in[0].F32) {
		t.Errorf("round trip changed tensors: %+v", out)
	}
	b, _ := os.ReadFile(p)
	if hl := int(b[0]) | int(b[1])<<8; (8+hl)%8 != 0 {
		t.Errorf("data not 8-byte aligned: header %d", hl)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".*tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

func TestWriteRejectsBadTensors(t *testing.T) {
	p := filepath.Join(t.TempDir(), "w.safetensors")
	if err := Write(p, []Tensor{{Name: "a", Shape: []int{3}, F32: []float32{1}}}, nil); err == nil {
		t.Error("shape mismatch accepted")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Error("a failed write left a file behind")
	}
}

func TestReadRejectsCorruptFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := Write(good, []Tensor{{Name: "a", Shape: []int{4}, F32: []float32{1, 2, 3, 4}}}, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	cases := map[string][]byte{
		"empty":          {},
		"huge header":    append([]byte{255, 255, 255, 255, 0, 0, 0, 0}, b[8:]...),
		"truncated data": b[:len(b)-3],
		"bad json":       append(append([]byte{}, b[:8]...), []byte(strings.Repeat("x", len(b)-8))...),
	}
	for name, data := range cases {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o644)
		if _, _, err := Read(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error %v does not name the file", name, err)
		}
	}
}

func TestReadAllMergesStages(t *testing.T) {
	dir := t.TempDir()
	a := Tensor{Name: "fc0.weight", Shape: []int{1}, F32: []float32{1}}
	b := Tensor{Name: "fc1.weight", Shape: []int{1}, F32: []float32{2}}
	Write(filepath.Join(dir, "stage-0.safetensors"), []Tensor{a}, nil)
	Write(filepath.Join(dir, "stage-1.safetensors"), []Tensor{b}, nil)
	all, err := ReadAll(dir)
	if err != nil || len(all) != 2 || all["fc1.weight"].F32[0] != 2 {
		t.Fatalf("ReadAll = %v, %v", all, err)
	}
	Write(filepath.Join(dir, "stage-2.safetensors"), []Tensor{a}, nil)
	if _, err := ReadAll(dir); err == nil || !strings.Contains(err.Error(), "fc0.weight is in both") {
		t.Errorf("duplicate tensor across files: %v", err)
	}
	if _, err := ReadAll(t.TempDir()); err == nil {
		t.Error("empty directory accepted")
	}
}

// TestWriteAtomicTakesTheRunDirMode: what a run writes (weights,
// checkpoints, launch.json) is its owner's alone unless the run directory
// is shared, and a failed write leaves nothing behind.
func TestWriteAtomicTakesTheRunDirMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.svg")
	write := func() {
		t.Helper()
		if err := WriteAtomic(path, func(w io.Writer) error { _, err := w.Write([]byte("<svg/>")); return err }); err != nil {
			t.Fatal(err)
		}
	}
	write()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", st.Mode().Perm(), err)
	}
	runlog.ShareRunDirs(true)
	defer runlog.ShareRunDirs(false)
	write()
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("shared: mode %v, %v; want 0644", st.Mode().Perm(), err)
	}
	failed := filepath.Join(dir, "failed.svg")
	if err := WriteAtomic(failed, func(io.Writer) error { return io.ErrUnexpectedEOF }); err == nil {
		t.Fatal("a failing fill was not reported")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*failed*")); len(left) != 0 {
		t.Errorf("a failed write left %v", left)
	}
}

func TestCopyInto(t *testing.T) {
	byName := map[string]Tensor{"w": {Name: "w", Shape: []int{2, 2}, F32: []float32{1, 2, 3, 4}}}
	dst := make([]float32, 4)
	if err := CopyInto(byName, "w", []int{2, 2}, dst); err != nil || dst[3] != 4 {
		t.Fatalf("copy: %v %v", err, dst)
	}
	for _, tc := range []struct {
		name  string
		shape []int
		data  any
		want  string
	}{
		{"v", []int{2, 2}, dst, "no tensor v"},
		{"w", []int{4}, dst, "has shape [2 2], the model [4]"},
		{"w", []int{2, 2}, make([]float64, 4), "is not float64"},
	} {
		if err := CopyInto(byName, tc.name, tc.shape, tc.data); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v %T: got %v, want %q", tc.name, tc.shape, tc.data, err, tc.want)
		}
	}
}
