package stages

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/transport"
)

// TestStageRefusesLabelsBeyondClasses: a stage started without the
// launcher's check (stage, or data handed in by Options) refuses a label at
// or beyond model.classes with the error CheckData gives, rather than
// indexing past a one-hot row.
func TestStageRefusesLabelsBeyondClasses(t *testing.T) {
	c := testConfig("gpipe", plain("0-1", "2-3"), 2, "float32", "sgd") // input 8, classes 3
	dir := t.TempDir()
	write := func(name string, dims []uint32, payload []byte) {
		b := []byte{0, 0, 8, byte(len(dims))}
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(b, payload...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, prefix := range []string{"train", "t10k"} {
		write(prefix+"-images-idx3-ubyte", []uint32{16, 2, 4}, make([]byte, 16*8))
		labels := make([]byte, 16)
		labels[5] = 3
		write(prefix+"-labels-idx1-ubyte", []uint32{16}, labels)
	}
	c.Data.Dir = dir
	c.Path = filepath.Join(t.TempDir(), "run.yaml")
	want := c.CheckData()
	if want == nil || !strings.HasSuffix(want.Error(), "train-labels-idx1-ubyte: label 3 of example 5 is not below model.classes 3") {
		t.Fatalf("CheckData: %v", want)
	}
	_, down, err := Hellos(c, 0)
	if err != nil {
		t.Fatal(err)
	}
	up, _, err := Hellos(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, link := transport.Pipe(down, up, 2)
	_, err = New(Options{Config: c, Stage: 1, RunDir: t.TempDir(), Prev: link})
	if err == nil || err.Error() != want.Error() {
		t.Errorf("stage 1 from the files: err = %v\nwant %v", err, want)
	}

	// Data handed in, as reference runs and tests do: the test split too.
	test := synthetic(30, 8, 3, 2)
	test.Labels[7] = 3
	_, err = New(Options{Config: c, Reference: true, RunDir: t.TempDir(), Train: synthetic(96, 8, 3, 1), Test: test})
	if err == nil || !strings.HasSuffix(err.Error(), "data: synthetic: label 3 of example 7 is not below model.classes 3") {
		t.Errorf("reference with a bad test split: err = %v", err)
	}
}
