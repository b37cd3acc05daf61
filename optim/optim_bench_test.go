package optim

import (
	"fmt"
	"testing"

	"gorgonia.org/tensor"
)

// BenchmarkAdam3M is one Adam step over 3.2 million float32 parameters (a
// 3136x1024 layer), the size of the largest stage in docs/profiling.md.
func BenchmarkAdam3M(b *testing.B) {
	for _, w := range []int{1, 2} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			shape := tensor.Shape{3136, 1024}
			o, err := New(Spec{Name: "adam", LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, tensor.Float32, []tensor.Shape{shape})
			if err != nil {
				b.Fatal(err)
			}
			o.SetWorkers(w)
			p := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shape...))
			g := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shape...))
			b.ReportAllocs()
			for b.Loop() {
				if err := o.Step([]*tensor.Dense{p}, []*tensor.Dense{g}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
