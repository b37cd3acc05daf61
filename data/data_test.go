package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// idxFile builds an IDX file with the given header fields and payload.
func idxFile(typ byte, dims []uint32, payload []byte) []byte {
	b := []byte{0, 0, typ, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, payload...)
}

func TestReadIDX(t *testing.T) {
	dims, data, err := ReadIDX(bytes.NewReader(idxFile(8, []uint32{2, 3}, []byte{1, 2, 3, 4, 5, 6})))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dims, []int{2, 3}) || !bytes.Equal(data, []byte{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("got dims %v data %v", dims, data)
	}
}

func TestReadIDXErrors(t *testing.T) {
	good := idxFile(8, []uint32{2, 3}, []byte{1, 2, 3, 4, 5, 6})
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"short magic", []byte{0, 0}, "truncated"},
		{"bad magic", append([]byte{1, 2}, good[2:]...), "bad magic"},
		{"float type", idxFile(0x0D, []uint32{2}, make([]byte, 8)), "not supported"},
		{"zero dims", idxFile(8, nil, nil), "zero dimensions"},
		{"short dims", good[:9], "truncated"},
		{"short data", good[:len(good)-1], "truncated"},
		{"dims too large for data", idxFile(8, []uint32{60000, 28, 28}, make([]byte, 10)), "truncated"},
		{"dims overflow", idxFile(8, []uint32{1 << 31, 1 << 31, 1 << 31}, nil), "too large"},
		{"trailing bytes", append(good, 7), "trailing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ReadIDX(bytes.NewReader(c.file))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}

// writeFashion writes a tiny fake split into dir, gzipped or not.
func writeFashion(t *testing.T, dir, prefix string, gz bool, imgs, lbls []byte, n uint32) {
	t.Helper()
	write := func(name string, b []byte) {
		if gz {
			var buf bytes.Buffer
			w := gzip.NewWriter(&buf)
			w.Write(b)
			w.Close()
			b, name = buf.Bytes(), name+".gz"
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(prefix+"-images-idx3-ubyte", idxFile(8, []uint32{n, 2, 2}, imgs))
	write(prefix+"-labels-idx1-ubyte", idxFile(8, []uint32{uint32(len(lbls))}, lbls))
}

func TestLoadSmall(t *testing.T) {
	for _, gz := range []bool{true, false} {
		dir := t.TempDir()
		writeFashion(t, dir, "t10k", gz, []byte{0, 255, 51, 0, 102, 0, 0, 255}, []byte{3, 9}, 2)
		d, err := LoadFashionMNIST(dir, "test", true, true)
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		if d.N != 2 || d.Dim != 4 || d.Classes != 10 {
			t.Fatalf("gz=%v: N=%d Dim=%d Classes=%d", gz, d.N, d.Dim, d.Classes)
		}
		if want := []float32{0, 1, 0.2, 0, 0.4, 0, 0, 1}; !slices.Equal(d.Images, want) {
			t.Errorf("images %v, want %v", d.Images, want)
		}
		if !slices.Equal(d.Labels, []uint8{3, 9}) {
			t.Errorf("labels %v", d.Labels)
		}

		x := make([]float64, 4)
		GatherImages(d, []int{1}, x)
		if !slices.Equal(x, []float64{float64(float32(0.4)), 0, 0, 1}) {
			t.Errorf("gathered %v", x)
		}
		x32 := make([]float32, 8)
		GatherImages(d, []int{1, 0}, x32)
		if want := []float32{0.4, 0, 0, 1, 0, 1, 0.2, 0}; !slices.Equal(x32, want) {
			t.Errorf("gathered float32 %v, want %v", x32, want)
		}
		y := make([]int, 3)
		GatherLabels(d, []int{1, 0, 1}, y)
		if !slices.Equal(y, []int{9, 3, 9}) {
			t.Errorf("gathered labels %v", y)
		}

		// Only labels: images stay nil but N and Dim still come from the header.
		d, err = LoadFashionMNIST(dir, "test", false, true)
		if err != nil || d.Images != nil || d.Labels == nil || d.N != 2 || d.Dim != 4 {
			t.Fatalf("labels only: %+v, %v", d, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	_, err := LoadFashionMNIST(missing, "train", true, false)
	want := "data: " + filepath.Join(missing, "train-images-idx3-ubyte.gz") + ": no such file (install Debian package dataset-fashion-mnist)"
	if err == nil || err.Error() != want {
		t.Errorf("missing dir: err = %v\nwant %s", err, want)
	}

	if _, err := LoadFashionMNIST(missing, "validation", true, true); err == nil || !strings.Contains(err.Error(), "split") {
		t.Errorf("bad split: err = %v", err)
	}

	dir := t.TempDir()
	writeFashion(t, dir, "train", true, make([]byte, 12), []byte{1, 2}, 3)
	if _, err := LoadFashionMNIST(dir, "train", false, false); err == nil || !strings.Contains(err.Error(), "3 images but 2 labels") {
		t.Errorf("N mismatch: err = %v", err)
	}

	dir = t.TempDir()
	writeFashion(t, dir, "train", false, make([]byte, 3), []byte{1}, 1)
	_, err = LoadFashionMNIST(dir, "train", true, true)
	if err == nil || !strings.Contains(err.Error(), "train-images-idx3-ubyte: idx: truncated") {
		t.Errorf("truncated images: err = %v", err)
	}
}

func TestLoadFashionMNIST(t *testing.T) {
	if _, err := os.Stat(DefaultDir); os.IsNotExist(err) {
		testenv.RequireOrSkip(t, "Debian package dataset-fashion-mnist (installed by make deps)", err.Error())
	}
	for split, n := range map[string]int{"train": 60000, "test": 10000} {
		d, err := LoadFashionMNIST(DefaultDir, split, true, true)
		if err != nil {
			t.Fatal(err)
		}
		if d.N != n || d.Dim != 784 || d.Classes != 10 || len(d.Images) != n*784 || len(d.Labels) != n {
			t.Fatalf("%s: N=%d Dim=%d Classes=%d len(Images)=%d len(Labels)=%d", split, d.N, d.Dim, d.Classes, len(d.Images), len(d.Labels))
		}
		var count [10]int
		for _, l := range d.Labels {
			count[l]++ // panics if a label is >= 10
		}
		for c, k := range count {
			if k != n/10 { // Fashion-MNIST is exactly balanced
				t.Errorf("%s: class %d has %d examples, want %d", split, c, k, n/10)
			}
		}
		lo, hi := d.Images[0], d.Images[0]
		for _, p := range d.Images {
			lo, hi = min(lo, p), max(hi, p)
		}
		if lo != 0 || hi != 1 {
			t.Errorf("%s: pixels in [%v,%v], want [0,1]", split, lo, hi)
		}
	}
}

func TestSamplerArgs(t *testing.T) {
	for _, b := range []int{0, -1, 11} {
		if _, err := NewSampler(1, 10, b); err == nil {
			t.Errorf("batch %d of 10: no error", b)
		}
	}
}

func TestSampler(t *testing.T) {
	const n, batch = 103, 10 // 10 steps per epoch, 3 examples dropped each epoch
	a, _ := NewSampler(42, n, batch)
	b, _ := NewSampler(42, n, batch)
	other, _ := NewSampler(43, n, batch)

	epochs := make([][]int, 3)
	for step := range 30 {
		got := a.Indices(step)
		if len(got) != batch {
			t.Fatalf("step %d: %d indices", step, len(got))
		}
		e := step / 10
		epochs[e] = append(epochs[e], got...)
	}
	// A fresh sampler, visiting steps out of order, agrees on every step.
	for _, step := range []int{25, 3, 17, 0, 29, 10} {
		if got, want := b.Indices(step), epochs[step/10][step%10*batch:][:batch]; !slices.Equal(got, want) {
			t.Errorf("step %d: second sampler %v, first %v", step, got, want)
		}
	}
	for e, idx := range epochs {
		seen := map[int]bool{}
		for _, i := range idx {
			if i < 0 || i >= n || seen[i] {
				t.Fatalf("epoch %d: index %d repeated or out of range", e, i)
			}
			seen[i] = true
		}
	}
	if slices.Equal(epochs[0], epochs[1]) {
		t.Error("epochs 0 and 1 have the same order")
	}
	if slices.Equal(other.Indices(0), a.Indices(0)) {
		t.Error("seeds 42 and 43 give the same first batch")
	}

	// When batch divides n, an epoch is exactly a permutation of all examples.
	full, _ := NewSampler(7, 20, 5)
	var all []int
	for step := 4; step < 8; step++ {
		all = append(all, full.Indices(step)...)
	}
	slices.Sort(all)
	for i, v := range all {
		if v != i {
			t.Fatalf("epoch 1 does not cover 0..19 exactly once: %v", all)
		}
	}
}
