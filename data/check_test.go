package data

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckModelNamesFileAndExample: the loader reads labels it cannot judge
// (it does not know the model's classes, and once refused everything at or
// beyond a hard-coded 10); CheckModel refuses the first label at or beyond
// the model's classes, and features unlike its input, naming the file and
// the example.
func TestCheckModelNamesFileAndExample(t *testing.T) {
	dir := t.TempDir()
	writeFashion(t, dir, "train", false, make([]byte, 5*4), []byte{0, 1, 2, 1, 2}, 5)
	d, err := LoadFashionMNIST(dir, "train", false, true)
	if err != nil {
		t.Fatal(err)
	}
	labels := filepath.Join(dir, "train-labels-idx1-ubyte")
	if d.Classes != 3 || d.LabelsFile != labels {
		t.Fatalf("Classes %d, LabelsFile %q; want 3 and %s", d.Classes, d.LabelsFile, labels)
	}
	if err := d.CheckModel(4, 3); err != nil {
		t.Errorf("labels below 3 classes refused: %v", err)
	}
	want := "data: " + labels + ": label 2 of example 2 is not below model.classes 2"
	if err := d.CheckModel(4, 2); err == nil || err.Error() != want {
		t.Errorf("classes 2: err = %v\nwant %s", err, want)
	}
	want = "data: " + filepath.Join(dir, "train-images-idx3-ubyte") + ": examples have 4 features; model.input is 784"
	if err := d.CheckModel(784, 3); err == nil || err.Error() != want {
		t.Errorf("input 784: err = %v\nwant %s", err, want)
	}

	// Labels a byte can hold but Fashion-MNIST's 10 classes cannot: the
	// loader takes them, a model with enough classes too.
	dir = t.TempDir()
	writeFashion(t, dir, "train", true, make([]byte, 4), []byte{10}, 1)
	if d, err = LoadFashionMNIST(dir, "train", false, true); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckModel(4, 11); err != nil {
		t.Errorf("label 10 of 11 classes refused: %v", err)
	}
	if err := d.CheckModel(4, 10); err == nil || !strings.Contains(err.Error(), "train-labels-idx1-ubyte.gz: label 10 of example 0 is not below model.classes 10") {
		t.Errorf("label 10 of 10 classes: err = %v", err)
	}

	// Images alone: the header still gives the features; no labels to judge.
	if d, err = LoadFashionMNIST(dir, "train", true, false); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckModel(4, 2); err != nil {
		t.Errorf("images without labels refused: %v", err)
	}
}

// TestMissingDataIsNotExist: a missing file can be told from a bad one.
func TestMissingDataIsNotExist(t *testing.T) {
	_, err := LoadFashionMNIST(t.TempDir(), "train", true, true)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("err = %v, want one wrapping fs.ErrNotExist", err)
	}
}

// TestCharTokenizerRefusesByCharacter: a prompt character outside the
// vocabulary is named as the character, at its position in characters, not
// as the first of its UTF-8 bytes ('Ã' for "é").
func TestCharTokenizerRefusesByCharacter(t *testing.T) {
	tok, err := NewCharTokenizer([]byte("abc d"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ text, want string }{
		{"ab é", `data: character 'é' at position 3 is not in the character vocabulary`},
		{"€€x", `data: character '€' at position 0 is not in the character vocabulary`},
		{"ab\xffc", `data: byte 0xff at position 2 (not UTF-8) is not in the character vocabulary`},
		{"aé\xff", `data: character 'é' at position 1 is not in the character vocabulary`},
	} {
		_, err := tok.Encode([]byte(c.text))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: err = %v\nwant %s", c.text, err, c.want)
		}
	}

	// A corpus with "é" has both its bytes: a prompt with it encodes.
	tok, err = NewCharTokenizer([]byte("café au lait"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode([]byte("é a"))
	if err != nil {
		t.Fatal(err)
	}
	if back, err := tok.Decode(ids); err != nil || string(back) != "é a" {
		t.Errorf("decoded %q, %v", back, err)
	}
}
