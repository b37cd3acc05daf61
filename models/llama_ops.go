package models

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// The Llama family's fused ops: RMSNorm, rotary position embedding and the
// SwiGLU gate, each with a hand-written backward (checked against central
// differences in llama_test.go and against Hugging Face's formulas written
// in PyTorch); grouped-query attention is causalAttention's op with fewer
// key and value heads (attention.kvHeads). Like the GPT's ops they hold no
// per-run state: the backward recomputes a row's scale, a rotation's angles
// or a gate's sigmoid from the forward's inputs.

// ---- RMSNorm ----

// rmsNorm scales each row of x (n, d) by 1/sqrt(mean(x²) + eps) and
// multiplies by the learned per-feature gain (d): Llama's RMSNorm, without
// a mean or a bias.
func (o *ops) rmsNorm(x, gain *G.Node, eps float64) *G.Node {
	return o.fused(rmsNormOp[float32](eps), rmsNormOp[float64](eps), x, gain)
}

// rmsRow is 1/sqrt(mean(x²) + eps) of row x.
func rmsRow[T float32 | float64](x []T, eps T) T {
	return 1 / T(math.Sqrt(float64(dot(x, x)/T(len(x))+eps)))
}

func rmsNormOp[T float32 | float64](eps float64) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("RMSNorm{%g}", eps), inDims: []int{2, 1}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, _, err := rowsOf("rms norm", in)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, gain, d := in[0], in[1], s[0][1]
			for r := 0; r < len(x); r += d {
				xr, or := x[r:r+d], out[r:r+d]
				rmsScaleRow(or, xr, gain, rmsRow(xr, T(eps)))
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			x, gain := in[0], in[1]
			return G.Nodes{
				o.fused(rmsNormInputGradOp[float32](eps), rmsNormInputGradOp[float64](eps), x, gain, grad),
				o.fused(rmsNormGainGradOp[float32](eps), rmsNormGainGradOp[float64](eps), x, grad),
			}
		},
	}
}

// rmsScaleRow sets out[j] = x[j]·rstd·gain[j], a row of RMSNorm's output;
// the float32 vector kernel computes the same bits.
func rmsScaleRow[T float32 | float64](out, x, gain []T, rstd T) {
	switch out := any(out).(type) {
	case []float32:
		rmsScaleRow32(out, any(x).([]float32), any(gain).([]float32), float32(rstd))
	default:
		rmsScaleRowGo(out.([]float64), any(x).([]float64), any(gain).([]float64), float64(rstd))
	}
}

func rmsScaleRowGo[T float32 | float64](out, x, gain []T, rstd T) {
	x, gain = x[:len(out)], gain[:len(out)]
	for j, v := range x {
		out[j] = v * rstd * gain[j]
	}
}

// rmsInputGradRow sets out[j] = rstd·(dy[j]·gain[j] − x[j]·rstd·mgx), a
// row of RMSNorm's input gradient given mean(g·x̂) mgx.
func rmsInputGradRow[T float32 | float64](out, x, dy, gain []T, rstd, mgx T) {
	switch out := any(out).(type) {
	case []float32:
		rmsInputGradRow32(out, any(x).([]float32), any(dy).([]float32), any(gain).([]float32), float32(rstd), float32(mgx))
	default:
		rmsInputGradRowGo(out.([]float64), any(x).([]float64), any(dy).([]float64), any(gain).([]float64), float64(rstd), float64(mgx))
	}
}

func rmsInputGradRowGo[T float32 | float64](out, x, dy, gain []T, rstd, mgx T) {
	x, dy, gain = x[:len(out)], dy[:len(out)], gain[:len(out)]
	for j, v := range x {
		out[j] = rstd * (dy[j]*gain[j] - v*rstd*mgx)
	}
}

// rmsGainGradRow adds dy[j]·x[j]·rstd to out[j], a row's term of the gain's
// gradient.
func rmsGainGradRow[T float32 | float64](out, x, dy []T, rstd T) {
	switch out := any(out).(type) {
	case []float32:
		rmsGainGradRow32(out, any(x).([]float32), any(dy).([]float32), float32(rstd))
	default:
		rmsGainGradRowGo(out.([]float64), any(x).([]float64), any(dy).([]float64), float64(rstd))
	}
}

func rmsGainGradRowGo[T float32 | float64](out, x, dy []T, rstd T) {
	x, dy = x[:len(out)], dy[:len(out)]
	for j, v := range x {
		out[j] += dy[j] * v * rstd
	}
}

// rmsNormInputGradOp is dx from (x, gain, dy): with x̂ = x·rstd the
// normalised row and g = dy·gain, dx = rstd·(g − x̂·mean(g·x̂)).
func rmsNormInputGradOp[T float32 | float64](eps float64) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("RMSNormInputGrad{%g}", eps), inDims: []int{2, 1, 2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, _, err := rowsOf("rms norm input gradient", in)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, gain, dy, d := in[0], in[1], in[2], s[0][1]
			for r := 0; r < len(x); r += d {
				xr, dyr, or := x[r:r+d], dy[r:r+d], out[r:r+d]
				rstd := rmsRow(xr, T(eps))
				var sgx T
				for j, v := range xr {
					sgx += dyr[j] * gain[j] * v * rstd
				}
				rmsInputGradRow(or, xr, dyr, gain, rstd, sgx/T(d))
			}
		},
	}
}

// rmsNormGainGradOp is the gain's gradient from (x, dy): the sum over rows
// of dy·x̂.
func rmsNormGainGradOp[T float32 | float64](eps float64) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("RMSNormGainGrad{%g}", eps), inDims: []int{2, 2}, outDims: 1,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, d, err := rowsOf("rms norm gain gradient", in)
			return tensor.Shape{d}, err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, dy, d := in[0], in[1], s[0][1]
			clear(out)
			for r := 0; r < len(x); r += d {
				xr, dyr := x[r:r+d], dy[r:r+d]
				rmsGainGradRow(out, xr, dyr, rmsRow(xr, T(eps)))
			}
		},
	}
}

// ---- rotary position embedding ----

// rotary is the shape of a rotary embedding: tokens per sequence, the
// width of one head and the base of the frequencies.
type rotary struct {
	context, headDim int
	theta            float64
}

func (r rotary) String() string {
	return fmt.Sprintf("{context %d, head dim %d, theta %g}", r.context, r.headDim, r.theta)
}

// tables are cos and sin of position t times frequency i, at t·(headDim/2)+i,
// with frequency i = theta^(−2i/headDim) as Hugging Face's inv_freq. They are
// computed in float64 and rounded once to T.
func (r rotary) tables() (cos, sin []float64) {
	half := r.headDim / 2
	cos, sin = make([]float64, r.context*half), make([]float64, r.context*half)
	for i := range half {
		f := 1 / math.Pow(r.theta, float64(2*i)/float64(r.headDim))
		for t := range r.context {
			cos[t*half+i], sin[t*half+i] = math.Cos(float64(t)*f), math.Sin(float64(t)*f)
		}
	}
	return cos, sin
}

// rope rotates every head of x (batch*context, heads*headDim), row
// b·context+t at position t, as Hugging Face's apply_rotary_pos_emb does:
// x·cos + rotate_half(x)·sin, where rotate_half(x) = (−x₂, x₁) for the two
// halves of a head. Dimensions j and j+headDim/2 of a head turn together by
// angle t·freq(j), so checkpoints in Hugging Face's layout load as they are.
func (o *ops) rope(x *G.Node, r rotary) *G.Node {
	return o.fused(ropeOp[float32](r, false), ropeOp[float64](r, false), x)
}

// ropeOp turns each pair by its angle, or back by it when inverse: the
// rotation's transpose, which is its gradient (and the inverse's gradient
// is the rotation).
func ropeOp[T float32 | float64](r rotary, inverse bool) *fusedOp[T] {
	cos64, sin64 := r.tables()
	cos, sin := make([]T, len(cos64)), make([]T, len(sin64))
	for i := range cos64 {
		cos[i], sin[i] = T(cos64[i]), T(sin64[i])
		if inverse {
			sin[i] = -sin[i]
		}
	}
	name := "RoPE"
	if inverse {
		name = "RoPEInverse"
	}
	half := r.headDim / 2
	return &fusedOp[T]{name: name + r.String(), inDims: []int{2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if in[0][0]%r.context != 0 || in[0][1]%r.headDim != 0 {
				return nil, fmt.Errorf("rotary embedding: %v is not sequences of %d tokens in heads of %d", in[0], r.context, r.headDim)
			}
			return in[0].Clone(), nil
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, w := in[0], s[0][1]
			for row := range s[0][0] {
				c, sn := cos[row%r.context*half:][:half], sin[row%r.context*half:][:half]
				for h := row * w; h < (row+1)*w; h += r.headDim {
					x1, x2 := x[h:h+half], x[h+half:h+r.headDim]
					ropeRow(out[h:h+half], out[h+half:h+r.headDim], x1, x2, c, sn)
				}
			}
		},
		grad: func(o *ops, _ G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(ropeOp[float32](r, !inverse), ropeOp[float64](r, !inverse), grad)}
		},
	}
}

// ropeRow turns the pairs (x1[i], x2[i]) by the angles of cos c and sin
// sn into (o1[i], o2[i]).
func ropeRow[T float32 | float64](o1, o2, x1, x2, c, sn []T) {
	switch o1 := any(o1).(type) {
	case []float32:
		ropeRow32(o1, any(o2).([]float32), any(x1).([]float32), any(x2).([]float32), any(c).([]float32), any(sn).([]float32))
	default:
		ropeRowGo(o1.([]float64), any(o2).([]float64), any(x1).([]float64), any(x2).([]float64), any(c).([]float64), any(sn).([]float64))
	}
}

func ropeRowGo[T float32 | float64](o1, o2, x1, x2, c, sn []T) {
	n := len(o1)
	o2, x1, x2, c, sn = o2[:n], x1[:n], x2[:n], c[:n], sn[:n]
	for i := range n {
		o1[i] = x1[i]*c[i] - x2[i]*sn[i]
		o2[i] = x2[i]*c[i] + x1[i]*sn[i]
	}
}

// ---- SwiGLU ----

// swiglu is silu(gate)·up element-wise, silu(x) = x·sigmoid(x): the gated
// unit of Llama's MLP, between its gate and up projections and its down
// projection.
func (o *ops) swiglu(gate, up *G.Node) *G.Node {
	return o.fused(swigluOp[float32](), swigluOp[float64](), gate, up)
}

// expNeg sets out[i] = exp(−x[i]), with the vector exp for float32.
func expNeg[T float32 | float64](out, x []T) {
	for i, v := range x[:len(out)] {
		out[i] = -v
	}
	expInPlace(out)
}

func swigluOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "SwiGLU", inDims: []int{2, 2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if !in[0].Eq(in[1]) {
				return nil, fmt.Errorf("swiglu: gate %v and up %v differ", in[0], in[1])
			}
			return in[0].Clone(), nil
		},
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				swiglu32(out, any(in[0]).([]float32), any(in[1]).([]float32))
			default:
				swigluGo(out.([]float64), any(in[0]).([]float64), any(in[1]).([]float64))
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{
				o.fused(swigluGateGradOp[float32](), swigluGateGradOp[float64](), in[0], in[1], grad),
				o.fused(swigluUpGradOp[float32](), swigluUpGradOp[float64](), in[0], grad),
			}
		},
	}
}

// swigluGo sets out[i] = silu(gate[i])·up[i]; the float32 vector kernel
// computes the same bits (simd_amd64.s).
func swigluGo[T float32 | float64](out, gate, up []T) {
	gate, up = gate[:len(out)], up[:len(out)]
	expNeg(out, gate)
	for i, e := range out {
		out[i] = gate[i] / (1 + e) * up[i]
	}
}

// swigluGateGradOp is dgate from (gate, up, dy): with s = sigmoid(gate),
// dy·up·s·(1 + gate·(1 − s)).
func swigluGateGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "SwiGLUGateGrad", inDims: []int{2, 2, 2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				swigluGateGrad32(out, any(in[0]).([]float32), any(in[1]).([]float32), any(in[2]).([]float32))
			default:
				swigluGateGradGo(out.([]float64), any(in[0]).([]float64), any(in[1]).([]float64), any(in[2]).([]float64))
			}
		},
	}
}

func swigluGateGradGo[T float32 | float64](out, gate, up, dy []T) {
	gate, up, dy = gate[:len(out)], up[:len(out)], dy[:len(out)]
	expNeg(out, gate)
	for i, e := range out {
		s := 1 / (1 + e)
		out[i] = dy[i] * up[i] * s * (1 + gate[i]*(1-s))
	}
}

// swigluUpGradOp is dup from (gate, dy): dy·silu(gate).
func swigluUpGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "SwiGLUUpGrad", inDims: []int{2, 2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				swigluUpGrad32(out, any(in[0]).([]float32), any(in[1]).([]float32))
			default:
				swigluUpGradGo(out.([]float64), any(in[0]).([]float64), any(in[1]).([]float64))
			}
		},
	}
}

func swigluUpGradGo[T float32 | float64](out, gate, dy []T) {
	gate, dy = gate[:len(out)], dy[:len(out)]
	expNeg(out, gate)
	for i, e := range out {
		out[i] = dy[i] * gate[i] / (1 + e)
	}
}

// ---- grouped-query attention ----

// groupedAttention is causalAttention with k and v holding kvHeads heads of
// q's width/heads, each shared by heads/kvHeads consecutive query heads, as
// Hugging Face's repeat_kv shares them; kvHeads == heads is causalAttention.
func (o *ops) groupedAttention(q, k, v *G.Node, batch, context, heads, kvHeads int, keep bool) *G.Node {
	if o.err != nil {
		return nil
	}
	w := q.Shape()[1]
	if kvHeads < 1 || heads%kvHeads != 0 || w%heads != 0 || q.Shape()[0] != batch*context {
		o.err = fmt.Errorf("attention: q %v does not hold %d sequences of %d tokens in %d heads sharing %d key and value heads",
			q.Shape(), batch, context, heads, kvHeads)
		return nil
	}
	return o.attend(q, k, v, attention{context: context, heads: heads, kvHeads: kvHeads, keep: keep})
}

// ---- token lookup ----

// lookup is the Llama's input layer on token ids (batch, context), stored
// as floats: row r of the result is row ids[r] of the token table tok
// (vocab, width). Its backward is the GPT embedding's token gradient, which
// adds each row of the output's gradient into its token's row, in row order.
func (o *ops) lookup(ids, tok *G.Node) *G.Node {
	return o.fused(lookupOp[float32](), lookupOp[float64](), ids, tok)
}

func lookupOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "Lookup", inDims: []int{2, 2}, outDims: 2, data: []bool{true},
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			return tensor.Shape{in[0][0] * in[0][1], in[1][1]}, nil
		},
		check: func(in [][]T, s []tensor.Shape) error { return checkIDs(in[0], s[1][0]) },
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			ids, tok, w := in[0], in[1], s[1][1]
			for r, id := range ids {
				copy(out[r*w:][:w], tok[int(id)*w:][:w])
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			vocab := in[1].Shape()[0]
			return G.Nodes{nil, o.fused(tokenGradOp[float32](vocab), tokenGradOp[float64](vocab), in[0], grad)}
		},
	}
}
