package checkpoint

import (
	"fmt"
	"math"
	"slices"
)

// Diff reports where two sets of weights first differ, comparing every value's
// bits (so -0 differs from 0 and equal NaNs match), or nil when both hold the
// same tensors with identical values: the check that a pipelined run equals its
// one-process reference, and a resumed run an uninterrupted one.
func Diff(a, b map[string]Tensor) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d tensors against %d", len(a), len(b))
	}
	names := make([]string, 0, len(a))
	for name := range a {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		y, ok := b[name]
		if !ok {
			return fmt.Errorf("%s: missing from the second set", name)
		}
		if err := DiffTensor(a[name], y); err != nil {
			return fmt.Errorf("%s%w", name, err)
		}
	}
	return nil
}

// DiffTensor is Diff for two tensors; its error starts with the index, as in
// "[3]: 0.25 against 0.5", or with ": " for a dtype or shape mismatch.
func DiffTensor(a, b Tensor) error {
	if a.dtype() != b.dtype() || !slices.Equal(a.Shape, b.Shape) || len(a.F32) != len(b.F32) || len(a.F64) != len(b.F64) {
		return fmt.Errorf(": %s %v against %s %v", a.dtype(), a.Shape, b.dtype(), b.Shape)
	}
	for i := range a.F32 {
		if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
			return fmt.Errorf("[%d]: %v against %v", i, a.F32[i], b.F32[i])
		}
	}
	for i := range a.F64 {
		if math.Float64bits(a.F64[i]) != math.Float64bits(b.F64[i]) {
			return fmt.Errorf("[%d]: %v against %v", i, a.F64[i], b.F64[i])
		}
	}
	return nil
}
