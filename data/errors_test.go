package data

import (
	"errors"
	"testing"
)

// TestModelMismatchIsBadData: data unfit for the model is ErrBadData (a
// restart would read it again), with the check's own text.
func TestModelMismatchIsBadData(t *testing.T) {
	d := &Dataset{Name: "fashion-mnist/train", Dim: 784, Labels: []uint8{1, 7}, LabelsFile: "train-labels-idx1-ubyte.gz"}
	for _, tc := range []struct {
		features, classes int
		want              string
	}{
		{784, 5, "data: train-labels-idx1-ubyte.gz: label 7 of example 1 is not below model.classes 5"},
		{100, 10, "data: fashion-mnist/train: examples have 784 features; model.input is 100"},
	} {
		err := d.CheckModel(tc.features, tc.classes)
		if !errors.Is(err, ErrBadData) || err.Error() != tc.want {
			t.Errorf("CheckModel(%d, %d) = %v (bad data: %v), want %q", tc.features, tc.classes, err, errors.Is(err, ErrBadData), tc.want)
		}
	}
	if err := d.CheckModel(784, 10); err != nil {
		t.Errorf("fitting data refused: %v", err)
	}
}
