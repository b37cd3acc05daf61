package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSplitReusesStashes: once a micro-batch's weight pass is done, the
// next micro-batches' Reads copy into its stash instead of allocating, and
// nothing changes: input gradients and summed weight gradients equal a
// fused engine's bit for bit, over two steps of F I W per micro-batch, with
// activations kept or recomputed.
func TestSplitReusesStashes(t *testing.T) {
	m := smallMLP(t, "float64")
	r := rand.New(rand.NewPCG(3, 9))
	xs, ys := randInputs(r, 4, 4, 6)
	for _, recompute := range []bool{false, true} {
		fused, err := NewEngine(m, 0, len(m.Layers), 4, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		split, err := NewEngine(m, 0, len(m.Layers), 4, 1, Options{Split: true, Recompute: recompute})
		if err != nil {
			t.Fatal(err)
		}
		var reused, stashed int
		for step := range 2 {
			for k := range xs {
				key := step*len(xs) + k
				if _, err := fused.Forward(key, xs[k], ys[k]); err != nil {
					t.Fatal(err)
				}
				if _, err := fused.Backward(key, fused.LossScale(len(xs))); err != nil {
					t.Fatal(err)
				}
				if _, err := split.Forward(key, xs[k], ys[k]); err != nil {
					t.Fatal(err)
				}
				if recompute {
					if err := split.Recomputation(key); err != nil {
						t.Fatal(err)
					}
				}
				spare := slices.Concat(split.spare...)
				if _, err := split.Input(key, split.LossScale(len(xs))); err != nil {
					t.Fatal(err)
				}
				for _, v := range split.flights[key].stash {
					stashed++
					if slices.Contains(spare, v) {
						reused++
					}
				}
				if err := split.Weight(key); err != nil {
					t.Fatal(err)
				}
			}
		}
		// Every stash but the first micro-batch's is a reused one.
		if perMicro := stashed / (2 * len(xs)); reused != stashed-perMicro {
			t.Errorf("recompute %v: %d of %d stashed values reused, want %d", recompute, reused, stashed, stashed-perMicro)
		}
		if names := differingGradients(t, split, fused); len(names) > 0 {
			t.Errorf("recompute %v: gradients of %v differ from the fused engine's", recompute, names)
		}
	}
}
