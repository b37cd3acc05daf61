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

// ---- convolution ----

// convGeom is one convolution's sizes: input channels, height and width,
// output channels, kernel side, stride and padding, and the output's height
// and width.
type convGeom struct{ c, h, w, o, k, stride, pad, oh, ow int }

// geomOf reads the sizes from x (N, C, H, W) and the filters (O, C, k, k).
func geomOf(x, f tensor.Shape, stride, pad int) (convGeom, error) {
	g := convGeom{c: x[1], h: x[2], w: x[3], o: f[0], k: f[2], stride: stride, pad: pad}
	if f[1] != g.c || f[3] != g.k {
		return g, fmt.Errorf("conv2d: filters %v for an input of %v", f, x)
	}
	if g.h+2*pad < g.k || g.w+2*pad < g.k {
		return g, fmt.Errorf("conv2d: a %dx%d kernel does not fit a %dx%d image padded by %d", g.k, g.k, g.h, g.w, pad)
	}
	g.oh, g.ow = (g.h+2*pad-g.k)/stride+1, (g.w+2*pad-g.k)/stride+1
	return g, nil
}

// cols is the row count of an image's column matrix, C·k·k; its columns
// are the OH·OW output positions.
func (g convGeom) cols() int { return g.c * g.k * g.k }

// im2col writes image x (C, H, W) as the column matrix col (C·k·k, OH·OW):
// column p holds the window that output position p sees, zeros where it
// hangs over the padding.
func im2col[T float32 | float64](g convGeom, x, col []T) {
	n := g.oh * g.ow
	for ci := range g.c {
		for u := range g.k {
			for v := range g.k {
				row := col[((ci*g.k+u)*g.k+v)*n:][:n]
				for oy := range g.oh {
					y := oy*g.stride - g.pad + u
					out := row[oy*g.ow:][:g.ow]
					if y < 0 || y >= g.h {
						clear(out)
						continue
					}
					in := x[(ci*g.h+y)*g.w:][:g.w]
					for ox := range g.ow {
						if xx := ox*g.stride - g.pad + v; xx >= 0 && xx < g.w {
							out[ox] = in[xx]
						} else {
							out[ox] = 0
						}
					}
				}
			}
		}
	}
}

// col2im adds the column matrix col back into image dx (C, H, W), each
// entry into the pixel im2col read it from: im2col's transpose.
func col2im[T float32 | float64](g convGeom, col, dx []T) {
	n := g.oh * g.ow
	for ci := range g.c {
		for u := range g.k {
			for v := range g.k {
				row := col[((ci*g.k+u)*g.k+v)*n:][:n]
				for oy := range g.oh {
					y := oy*g.stride - g.pad + u
					if y < 0 || y >= g.h {
						continue
					}
					out := dx[(ci*g.h+y)*g.w:][:g.w]
					for ox, d := range row[oy*g.ow:][:g.ow] {
						if xx := ox*g.stride - g.pad + v; xx >= 0 && xx < g.w {
							out[xx] += d
						}
					}
				}
			}
		}
	}
}

// conv2d is nn.Conv2d: x (N, C, H, W) convolved with filters f (O, C, k,
// k), plus bias b (O), with the given stride and zero padding. Each image
// is one product of the filters with its column matrix. It is one op,
// where gorgonia's Conv2d is several whose reshapes change a kept tensor's
// shape in place, so a program with it can keep its tensors between runs.
func (o *ops) conv2d(x, f, b *G.Node, stride, pad int) *G.Node {
	return o.fused(convOp[float32](stride, pad), convOp[float64](stride, pad), x, f, b)
}

func convOp[T float32 | float64](stride, pad int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("Conv2d{stride %d, pad %d}", stride, pad), inDims: []int{4, 4, 1}, outDims: 4,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			g, err := geomOf(in[0], in[1], stride, pad)
			if err == nil && in[2][0] != g.o {
				err = fmt.Errorf("conv2d: bias %v for %d filters", in[2], g.o)
			}
			return tensor.Shape{in[0][0], g.o, g.oh, g.ow}, err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, f, b := in[0], in[1], in[2]
			g, _ := geomOf(s[0], s[1], stride, pad)
			n, kk := g.oh*g.ow, g.cols()
			col := make([]T, kk*n)
			for i := range s[0][0] {
				im2col(g, x[i*g.c*g.h*g.w:], col)
				y := out[i*g.o*n:][:g.o*n]
				for oc := range g.o {
					row := y[oc*n:][:n]
					for j := range row {
						row[j] = b[oc]
					}
				}
				gemm(false, false, g.o, n, kk, 1, f, kk, col, n, 1, y, n)
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{
				o.fused(convInputGradOp[float32](stride, pad), convInputGradOp[float64](stride, pad), in[0], in[1], grad),
				o.fused(convFilterGradOp[float32](stride, pad), convFilterGradOp[float64](stride, pad), in[0], in[1], grad),
				o.fused(convBiasGradOp[float32](), convBiasGradOp[float64](), grad),
			}
		},
	}
}

// convInputGradOp is dx from (x, f, dy): each image's column gradient
// fᵀ·dy folded back by col2im; x gives the shape only.
func convInputGradOp[T float32 | float64](stride, pad int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("Conv2dInputGrad{stride %d, pad %d}", stride, pad), inDims: []int{4, 4, 4}, outDims: 4,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, err := geomOf(in[0], in[1], stride, pad)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			f, dy := in[1], in[2]
			g, _ := geomOf(s[0], s[1], stride, pad)
			n, kk, img := g.oh*g.ow, g.cols(), g.c*g.h*g.w
			col := make([]T, kk*n)
			clear(out)
			for i := range s[0][0] {
				gemm(true, false, kk, n, g.o, 1, f, kk, dy[i*g.o*n:], n, 0, col, n)
				col2im(g, col, out[i*img:][:img])
			}
		},
	}
}

// convFilterGradOp is the filters' gradient from (x, f, dy): the sum over
// images of dy·colᵀ, image after image; f gives the shape only.
func convFilterGradOp[T float32 | float64](stride, pad int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("Conv2dFilterGrad{stride %d, pad %d}", stride, pad), inDims: []int{4, 4, 4}, outDims: 4,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, err := geomOf(in[0], in[1], stride, pad)
			return in[1].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, dy := in[0], in[2]
			g, _ := geomOf(s[0], s[1], stride, pad)
			n, kk := g.oh*g.ow, g.cols()
			col := make([]T, kk*n)
			clear(out)
			for i := range s[0][0] {
				im2col(g, x[i*g.c*g.h*g.w:], col)
				gemm(false, true, g.o, kk, n, 1, dy[i*g.o*n:], n, col, n, 1, out, kk)
			}
		},
	}
}

// convBiasGradOp is the bias's gradient from dy (N, O, OH, OW): each
// channel's sum, image after image.
func convBiasGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "Conv2dBiasGrad", inDims: []int{4}, outDims: 1,
		shape: func(in []tensor.Shape) (tensor.Shape, error) { return tensor.Shape{in[0][1]}, nil },
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			dy, o, n := in[0], s[0][1], s[0][2]*s[0][3]
			clear(out)
			for i := range s[0][0] {
				for oc := range o {
					out[oc] += sum(dy[(i*o+oc)*n:][:n])
				}
			}
		},
	}
}

// ---- reshape ----

// reshapeCopy is x (any shape) laid out in shape to, copied: gorgonia's
// Reshape changes its input's shape in place, which a program that keeps
// its tensors between runs cannot have.
func (o *ops) reshapeCopy(x *G.Node, to ...int) *G.Node {
	from := []int(x.Shape().Clone())
	return o.fused(reshapeOp[float32](from, to), reshapeOp[float64](from, to), x)
}

func reshapeOp[T float32 | float64](from, to []int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("ReshapeCopy{%v -> %v}", from, to), inDims: []int{len(from)}, outDims: len(to),
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if in[0].TotalSize() != tensor.Shape(to).TotalSize() {
				return nil, fmt.Errorf("reshape: %v cannot be laid out as %v", in[0], to)
			}
			return tensor.Shape(to).Clone(), nil
		},
		kernel: func(out []T, in [][]T, _ []tensor.Shape) { copy(out, in[0]) },
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(reshapeOp[float32](to, from), reshapeOp[float64](to, from), grad)}
		},
	}
}
