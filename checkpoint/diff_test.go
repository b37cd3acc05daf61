package checkpoint

import (
	"math"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	base := func() map[string]Tensor {
		return map[string]Tensor{
			"fc0.w": {Name: "fc0.w", Shape: []int{2, 2}, F32: []float32{1, 2, float32(math.NaN()), 4}},
			"fc0.b": {Name: "fc0.b", Shape: []int{2}, F64: []float64{0, -1}},
		}
	}
	if err := Diff(base(), base()); err != nil {
		t.Fatalf("identical sets: %v", err)
	}
	for _, c := range []struct {
		name   string
		change func(map[string]Tensor)
		want   string
	}{
		{"value", func(w map[string]Tensor) { w["fc0.b"].F64[1] = -1.5 }, "fc0.b[1]: -1 against -1.5"},
		{"negative zero", func(w map[string]Tensor) { w["fc0.b"].F64[0] = math.Copysign(0, -1) }, "fc0.b[0]: 0 against -0"},
		{"shape", func(w map[string]Tensor) { x := w["fc0.w"]; x.Shape = []int{4}; w["fc0.w"] = x }, "fc0.w: F32 [2 2] against F32 [4]"},
		{"dtype", func(w map[string]Tensor) { w["fc0.b"] = Tensor{Shape: []int{2}, F32: []float32{0, -1}} }, "fc0.b: F64"},
		{"missing", func(w map[string]Tensor) { delete(w, "fc0.b"); w["fc1.b"] = Tensor{} }, "fc0.b: missing"},
		{"count", func(w map[string]Tensor) { delete(w, "fc0.b") }, "2 tensors against 1"},
	} {
		b := base()
		c.change(b)
		if err := Diff(base(), b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to mention %q", c.name, err, c.want)
		}
	}
}
