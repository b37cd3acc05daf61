package data

import (
	"bufio"
	"cmp"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDir is where Debian's dataset-fashion-mnist package installs the files.
const DefaultDir = "/usr/share/datasets/fashion-mnist"

// installHint is appended to "file not found" errors, since the usual cause
// is a machine without the package.
const installHint = "install Debian package dataset-fashion-mnist"

// Dataset is one split of an image classification data set, held in memory.
type Dataset struct {
	Name   string
	N, Dim int // examples, features per example (784)
	// Classes is one more than the largest label (10 for Fashion-MNIST), 0
	// when the labels are not loaded. The data do not say how many classes
	// the model has: CheckModel compares the labels with that.
	Classes int
	Images  []float32 // N*Dim, pixel/255, nil when not loaded
	Labels  []uint8   // N, nil when not loaded
	// ImagesFile and LabelsFile are the files read, for errors to name.
	ImagesFile, LabelsFile string
}

// LoadFashionMNIST loads split "train" or "test" of Fashion-MNIST from dir
// (gzipped or uncompressed IDX files). Only the parts asked for are read,
// since the first pipeline stage needs only images and the last only labels;
// the header of the other file is still read so that N and Dim are always
// set and the two files are checked to agree on N.
func LoadFashionMNIST(dir, split string, images, labels bool) (*Dataset, error) {
	var prefix string
	switch split {
	case "train":
		prefix = "train"
	case "test":
		prefix = "t10k"
	default:
		return nil, fmt.Errorf("data: unknown Fashion-MNIST split %q: want \"train\" or \"test\"", split)
	}
	d := &Dataset{Name: "fashion-mnist/" + split}

	imgDims, img, err := loadIDX(dir, prefix+"-images-idx3-ubyte", images, &d.ImagesFile)
	if err != nil {
		return nil, err
	}
	if len(imgDims) != 3 {
		return nil, fmt.Errorf("data: %s images: dimensions %v, want [N rows cols]", d.Name, imgDims)
	}
	lblDims, lbl, err := loadIDX(dir, prefix+"-labels-idx1-ubyte", labels, &d.LabelsFile)
	if err != nil {
		return nil, err
	}
	if len(lblDims) != 1 {
		return nil, fmt.Errorf("data: %s labels: dimensions %v, want [N]", d.Name, lblDims)
	}
	if imgDims[0] != lblDims[0] {
		return nil, fmt.Errorf("data: %s: %d images but %d labels", d.Name, imgDims[0], lblDims[0])
	}
	d.N, d.Dim = imgDims[0], imgDims[1]*imgDims[2]

	if images {
		// A table avoids a division per pixel over 47M pixels.
		var scale [256]float32
		for i := range scale {
			scale[i] = float32(i) / 255
		}
		d.Images = make([]float32, len(img))
		for i, p := range img {
			d.Images[i] = scale[p]
		}
	}
	if labels {
		for _, l := range lbl {
			d.Classes = max(d.Classes, int(l)+1)
		}
		d.Labels = lbl
	}
	return d, nil
}

// CheckModel checks the dataset against a model whose examples have features
// values and whose labels are below classes: a label at or beyond classes
// would index past its one-hot row, into the next example's. The features are
// checked always (the header gives them), the labels when they are loaded.
// Errors name the file, and the first bad example by its index in the file.
func (d *Dataset) CheckModel(features, classes int) error {
	if d.Dim != features {
		return BadData(fmt.Errorf("data: %s: examples have %d features; model.input is %d", cmp.Or(d.ImagesFile, d.Name), d.Dim, features))
	}
	for i, l := range d.Labels { // none when not loaded
		if int(l) >= classes {
			return BadData(fmt.Errorf("data: %s: label %d of example %d is not below model.classes %d", cmp.Or(d.LabelsFile, d.Name), l, i, classes))
		}
	}
	return nil
}

// missingFileError is a data file not found. It unwraps to fs.ErrNotExist,
// so that a caller can tell data that is absent from data that is wrong.
type missingFileError struct{ path string }

func (e missingFileError) Error() string {
	return fmt.Sprintf("data: %s: no such file (%s)", e.path, installHint)
}

func (missingFileError) Unwrap() error { return fs.ErrNotExist }

// loadIDX opens dir/name.gz, or dir/name when that is absent, and reads its
// dimensions, and its data too when withData is set. It sets *opened to the
// path it read. Errors name the file.
func loadIDX(dir, name string, withData bool, opened *string) (dims []int, data []byte, err error) {
	path := filepath.Join(dir, name+".gz")
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if g, err2 := os.Open(filepath.Join(dir, name)); err2 == nil {
			path, f, err = filepath.Join(dir, name), g, nil
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, missingFileError{path}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	*opened = path

	var r io.Reader = bufio.NewReaderSize(f, 1<<20)
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("data: %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	if withData {
		dims, data, err = ReadIDX(r)
	} else {
		dims, _, err = readIDXHeader(r)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("data: %s: %w", path, err)
	}
	return dims, data, nil
}

// GatherImages copies the images of examples idx into dst, which must hold
// len(idx)*d.Dim values. It is generic so the model's dtype decides the copy
// target without an intermediate float32 batch.
func GatherImages[T float32 | float64](d *Dataset, idx []int, dst []T) {
	if d.Images == nil {
		panic("data: GatherImages on a dataset loaded without images")
	}
	if len(dst) != len(idx)*d.Dim {
		panic(fmt.Sprintf("data: GatherImages: dst has %d values, want %d", len(dst), len(idx)*d.Dim))
	}
	if f32, ok := any(dst).([]float32); ok {
		// The images are float32 already: a row is one copy, about five
		// times faster than converting value by value.
		for i, k := range idx {
			copy(f32[i*d.Dim:(i+1)*d.Dim], d.Images[k*d.Dim:(k+1)*d.Dim])
		}
		return
	}
	for i, k := range idx {
		src := d.Images[k*d.Dim : (k+1)*d.Dim]
		out := dst[i*d.Dim : (i+1)*d.Dim]
		for j, v := range src {
			out[j] = T(v)
		}
	}
}

// GatherLabels copies the labels of examples idx into dst (len(idx) values).
func GatherLabels(d *Dataset, idx []int, dst []int) {
	if d.Labels == nil {
		panic("data: GatherLabels on a dataset loaded without labels")
	}
	if len(dst) != len(idx) {
		panic(fmt.Sprintf("data: GatherLabels: dst has %d values, want %d", len(dst), len(idx)))
	}
	for i, k := range idx {
		dst[i] = int(d.Labels[k])
	}
}
