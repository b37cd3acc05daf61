package models

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// The sequential stack's fused ops that no other family has: SiLU alone
// (the Llama has it only inside SwiGLU) and average pooling. Like the other
// fused ops they keep no per-run state.

// ---- SiLU ----

// silu is x·sigmoid(x) element-wise on rows (n, d).
func (o *ops) silu(x *G.Node) *G.Node {
	return o.fused(siluOp[float32](), siluOp[float64](), x)
}

func siluOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "SiLU", inDims: []int{2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			x := in[0]
			expNeg(out, x)
			for i, e := range out {
				out[i] = x[i] / (1 + e)
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(siluGradOp[float32](), siluGradOp[float64](), in[0], grad)}
		},
	}
}

// siluGradOp is dx from (x, dy): with s = sigmoid(x), dy·s·(1 + x·(1 − s)),
// SwiGLU's gate gradient with the up projection 1.
func siluGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "SiLUGrad", inDims: []int{2, 2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			x, dy := in[0], in[1]
			expNeg(out, x)
			for i, e := range out {
				s := 1 / (1 + e)
				out[i] = dy[i] * s * (1 + x[i]*(1-s))
			}
		},
	}
}

// ---- average pooling ----

// avgPooled is the shape (B, C, H/k, W/k) of pooling x (B, C, H, W).
func avgPooled(what string, k int, in tensor.Shape) (tensor.Shape, error) {
	if in[2] < k || in[3] < k {
		return nil, fmt.Errorf("%s: a %dx%d image is too small for a %dx%d window", what, in[2], in[3], k, k)
	}
	return tensor.Shape{in[0], in[1], in[2] / k, in[3] / k}, nil
}

// avgPoolOp averages k x k windows with stride k, dropping the rows and
// columns past the last whole window, as nn.AvgPool2d(k) does: the window's
// sum, row by row, divided by k².
func avgPoolOp[T float32 | float64](k int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("AvgPool{%d}", k), inDims: []int{4}, outDims: 4,
		shape: func(in []tensor.Shape) (tensor.Shape, error) { return avgPooled("average pool", k, in[0]) },
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, h, w := in[0], s[0][2], s[0][3]
			oh, ow, n := h/k, w/k, T(k*k)
			o := 0
			for p := 0; p < len(x); p += h * w {
				for r := range oh {
					for c := range ow {
						var sum T
						for u := range k {
							for _, v := range x[p+(r*k+u)*w+c*k:][:k] {
								sum += v
							}
						}
						out[o] = sum / n
						o++
					}
				}
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(avgPoolGradOp[float32](k), avgPoolGradOp[float64](k), in[0], grad)}
		},
	}
}

// avgPoolGradOp is dx from (x, dy): each window's gradient divided by k²
// spread over its inputs, zero past the last whole window; x gives the
// shape only.
func avgPoolGradOp[T float32 | float64](k int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("AvgPoolGrad{%d}", k), inDims: []int{4, 4}, outDims: 4,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			want, err := avgPooled("average pool gradient", k, in[0])
			if err == nil && !in[1].Eq(want) {
				err = fmt.Errorf("average pool gradient: output gradient %v, want %v for input %v", in[1], want, in[0])
			}
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			dy, h, w := in[1], s[0][2], s[0][3]
			oh, ow, n := h/k, w/k, T(k*k)
			clear(out)
			o := 0
			for p := 0; p < len(out); p += h * w {
				for r := range oh {
					for c := range ow {
						g := dy[o] / n
						o++
						for u := range k {
							row := out[p+(r*k+u)*w+c*k:][:k]
							for j := range row {
								row[j] = g
							}
						}
					}
				}
			}
		},
	}
}
