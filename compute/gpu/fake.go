package gpu

import (
	"fmt"
	"math"
	"sync/atomic"
)

// Fake is a Backend in host memory, in plain Go, float32 throughout: the
// device the stage's host side is tested against where no GPU is. Its
// kernels compute what the CUDA kernels compute (kernels/kernels.cu), in
// the same float32 formulas, one element at a time.
// Several stages may share one (stages on one device index), each from
// its own goroutine; only the count of buffers is shared between them.
type Fake struct {
	// Live counts the buffers allocated and not freed.
	Live atomic.Int64
}

// fakeBuf is a pointer, as device memory is: the stage tells buffers apart
// by identity.
type fakeBuf struct{ v []float32 }

func (b *fakeBuf) Len() int { return len(b.v) }

// f32 is a Fake buffer's values; a buffer of another backend is a bug of
// the caller's.
func f32(b Buffer) []float32 { return b.(*fakeBuf).v }

func (*Fake) Name() string { return "fake" }

// LiveBuffers is Live's count: what the checks read to find a leak.
func (f *Fake) LiveBuffers() int64 { return f.Live.Load() }

func (f *Fake) Alloc(n int) (Buffer, error) {
	f.Live.Add(1)
	return &fakeBuf{make([]float32, n)}, nil
}

func (f *Fake) Free(Buffer) { f.Live.Add(-1) }

func (*Fake) Upload(dst Buffer, src []float32) error {
	if len(src) != dst.Len() {
		return fmt.Errorf("upload of %d values into a buffer of %d", len(src), dst.Len())
	}
	copy(f32(dst), src)
	return nil
}

func (*Fake) Download(dst []float32, src Buffer) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("download of a buffer of %d values into %d", src.Len(), len(dst))
	}
	copy(dst, f32(src))
	return nil
}

func (*Fake) Copy(dst, src Buffer) error {
	if dst.Len() != src.Len() {
		return fmt.Errorf("copy of %d values into a buffer of %d", src.Len(), dst.Len())
	}
	copy(f32(dst), f32(src))
	return nil
}

func (*Fake) Fill(dst Buffer, v float32) error {
	d := f32(dst)
	for i := range d {
		d[i] = v
	}
	return nil
}

// Gemm sums each product in float32 over k in order, as a naive kernel
// would; cuBLAS sums in another order, which is why the GPU's results are
// compared within a tolerance.
func (*Fake) Gemm(transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer) error {
	A, B, C := f32(a), f32(b), f32(c)
	if len(A) < m*k || len(B) < k*n || len(C) < m*n {
		return fmt.Errorf("gemm %dx%dx%d on buffers of %d, %d and %d", m, n, k, len(A), len(B), len(C))
	}
	at := func(i, p int) float32 {
		if transA {
			return A[p*m+i]
		}
		return A[i*k+p]
	}
	bt := func(p, j int) float32 {
		if transB {
			return B[j*k+p]
		}
		return B[p*n+j]
	}
	row := make([]float32, n)
	for i := 0; i < m; i++ {
		clear(row)
		for p := 0; p < k; p++ {
			aip := at(i, p)
			for j := range row {
				row[j] += aip * bt(p, j)
			}
		}
		for j, s := range row {
			if beta == 0 {
				C[i*n+j] = alpha * s
			} else {
				C[i*n+j] = alpha*s + beta*C[i*n+j]
			}
		}
	}
	return nil
}

func (*Fake) AddBias(y, bias Buffer, rows, cols int) error {
	Y, b := f32(y), f32(bias)
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			Y[i*cols+j] += b[j]
		}
	}
	return nil
}

func (*Fake) SumRows(dst, src Buffer, rows, cols int, beta float32) error {
	D, S := f32(dst), f32(src)
	for j := 0; j < cols; j++ {
		var s float32
		for i := 0; i < rows; i++ {
			s += S[i*cols+j]
		}
		D[j] = beta*D[j] + s
	}
	return nil
}

func (*Fake) Activate(f Act, y, x Buffer) error {
	Y, X := f32(y), f32(x)
	for i, v := range X {
		out, _, err := activation(f, v, 0)
		if err != nil {
			return err
		}
		Y[i] = out
	}
	return nil
}

func (*Fake) ActivateGrad(f Act, dx, dy, x, y Buffer) error {
	DX, DY, X, Y := f32(dx), f32(dy), f32(x), f32(y)
	for i, v := range X {
		_, d, err := activation(f, v, Y[i])
		if err != nil {
			return err
		}
		DX[i] = DY[i] * d
	}
	return nil
}

// geluC is √(2/π), the tanh approximation's scale.
const geluC = 0.7978845608028654

// activation is f(x) and f'(x) given y = f(x), the formulas of
// kernels.cu's act and act_grad.
func activation(f Act, x, y float32) (out, grad float32, err error) {
	switch f {
	case "":
		return x, 1, nil
	case "relu":
		// x·[x ≥ 0], as gorgonia's Rectify: the derivative at 0 is 1,
		// which a unit whose inputs are all zero (a dead unit upstream)
		// meets exactly, and which then moves its bias.
		if x >= 0 {
			return x, 1, nil
		}
		return 0, 0, nil
	case "tanh":
		return float32(math.Tanh(float64(x))), 1 - y*y, nil
	case "sigmoid":
		return float32(1 / (1 + math.Exp(-float64(x)))), y * (1 - y), nil
	case "gelu":
		u := geluC * (x + 0.044715*x*x*x)
		t := float32(math.Tanh(float64(u)))
		return 0.5 * x * (1 + t), 0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*0.044715*x*x), nil
	case "silu":
		s := float32(1 / (1 + math.Exp(-float64(x))))
		return x * s, s * (1 + x*(1-s)), nil
	}
	return 0, 0, fmt.Errorf("no kernel for activation %q", f)
}

func (*Fake) Xent(rowLoss, probs, logits, targets Buffer, rows, cols int) error {
	L, P, X, T := f32(rowLoss), f32(probs), f32(logits), f32(targets)
	for i := 0; i < rows; i++ {
		x, p := X[i*cols:(i+1)*cols], P[i*cols:(i+1)*cols]
		m := x[0]
		for _, v := range x {
			m = max(m, v)
		}
		var z float32
		for j, v := range x {
			p[j] = float32(math.Exp(float64(v - m)))
			z += p[j]
		}
		for j := range p {
			p[j] /= z
		}
		t := int(T[i])
		if t < 0 || t >= cols {
			return fmt.Errorf("target %d of row %d is not in [0, %d)", t, i, cols)
		}
		L[i] = m + float32(math.Log(float64(z))) - x[t]
	}
	return nil
}

func (*Fake) XentGrad(dlogits, probs, targets Buffer, rows, cols int, scale float32) error {
	D, P, T := f32(dlogits), f32(probs), f32(targets)
	for i := 0; i < rows; i++ {
		t := int(T[i])
		for j := 0; j < cols; j++ {
			v := P[i*cols+j]
			if j == t {
				v--
			}
			D[i*cols+j] = scale * v
		}
	}
	return nil
}

func (*Fake) SGD(p, g Buffer, lr float32) error {
	P, G := f32(p), f32(g)
	for i := range P {
		P[i] -= lr * G[i]
		G[i] = 0
	}
	return nil
}

func (*Fake) Momentum(p, g, buf Buffer, lr, mu float32) error {
	P, G, B := f32(p), f32(g), f32(buf)
	for i := range P {
		B[i] = mu*B[i] + G[i]
		P[i] -= lr * B[i]
		G[i] = 0
	}
	return nil
}

func (*Fake) Adam(p, g, m, v Buffer, b1, b2, step, eps float32) error {
	P, G, M, V := f32(p), f32(g), f32(m), f32(v)
	c1, c2 := 1-b1, 1-b2
	for i := range P {
		gi := G[i]
		M[i] = b1*M[i] + c1*gi
		V[i] = b2*V[i] + c2*gi*gi
		P[i] -= step * M[i] / (float32(math.Sqrt(float64(V[i]))) + eps)
		G[i] = 0
	}
	return nil
}

func (*Fake) Scale(x Buffer, a float32) error {
	X := f32(x)
	for i := range X {
		X[i] *= a
	}
	return nil
}

func (*Fake) AddScaled(y, x Buffer, a float32) error {
	Y, X := f32(y), f32(x)
	for i := range Y {
		Y[i] += a * X[i]
	}
	return nil
}

func (f *Fake) LayerNorm(y, mean, rstd, x, gain, bias Buffer, rows, cols int, eps float32) error {
	return f.norm(y, mean, rstd, x, gain, bias, rows, cols, eps)
}

func (f *Fake) RMSNorm(y, rstd, x, gain Buffer, rows, cols int, eps float32) error {
	return f.norm(y, nil, rstd, x, gain, nil, rows, cols, eps)
}

// norm is LayerNorm, or RMSNorm where mean is nil (no centring, no bias),
// in kernels.cu's formulas.
func (*Fake) norm(y, mean, rstd, x, gain, bias Buffer, rows, cols int, eps float32) error {
	Y, R, X, G := f32(y), f32(rstd), f32(x), f32(gain)
	for i := range rows {
		xr, yr := X[i*cols:(i+1)*cols], Y[i*cols:(i+1)*cols]
		var mu float32
		if mean != nil {
			for _, v := range xr {
				mu += v
			}
			mu /= float32(cols)
			f32(mean)[i] = mu
		}
		var ss float32
		for _, v := range xr {
			ss += (v - mu) * (v - mu)
		}
		r := 1 / float32(math.Sqrt(float64(ss/float32(cols)+eps)))
		R[i] = r
		for j, v := range xr {
			yr[j] = (v - mu) * r * G[j]
			if bias != nil {
				yr[j] += f32(bias)[j]
			}
		}
	}
	return nil
}

func (f *Fake) LayerNormGrad(dx, dgain, dbias, dy, x, mean, rstd, gain Buffer, rows, cols int) error {
	return f.normGrad(dx, dgain, dbias, dy, x, mean, rstd, gain, rows, cols)
}

func (f *Fake) RMSNormGrad(dx, dgain, dy, x, rstd, gain Buffer, rows, cols int) error {
	return f.normGrad(dx, dgain, nil, dy, x, nil, rstd, gain, rows, cols)
}

// normGrad: with x̂ = (x − mean)·rstd and g = dy·gain, dx = rstd·(g −
// mean(g) − x̂·mean(g·x̂)) (LayerNorm; RMSNorm drops mean(g)); dgain +=
// Σ_rows dy·x̂, dbias += Σ_rows dy.
func (*Fake) normGrad(dx, dgain, dbias, dy, x, mean, rstd, gain Buffer, rows, cols int) error {
	DX, DG, DY, X, R, G := f32(dx), f32(dgain), f32(dy), f32(x), f32(rstd), f32(gain)
	for i := range rows {
		var mu float32
		if mean != nil {
			mu = f32(mean)[i]
		}
		r := R[i]
		var sg, sgx float32
		for j := range cols {
			xh, g := (X[i*cols+j]-mu)*r, DY[i*cols+j]*G[j]
			sg += g
			sgx += g * xh
		}
		sg, sgx = sg/float32(cols), sgx/float32(cols)
		if mean == nil {
			sg = 0
		}
		for j := range cols {
			xh, g := (X[i*cols+j]-mu)*r, DY[i*cols+j]*G[j]
			DX[i*cols+j] = r * (g - sg - xh*sgx)
		}
	}
	for j := range cols {
		var s, sb float32
		for i := range rows {
			var mu float32
			if mean != nil {
				mu = f32(mean)[i]
			}
			s += DY[i*cols+j] * (X[i*cols+j] - mu) * R[i]
			sb += DY[i*cols+j]
		}
		DG[j] += s
		if dbias != nil {
			f32(dbias)[j] += sb
		}
	}
	return nil
}

func (*Fake) Rope(y, x, cos, sin Buffer, rows, width, context, headDim int, inverse bool) error {
	Y, X, C, S := f32(y), f32(x), f32(cos), f32(sin)
	half := headDim / 2
	if width%headDim != 0 || headDim%2 != 0 || len(C) < context*half {
		return fmt.Errorf("rotary embedding of width %d in heads of %d over %d positions, tables of %d", width, headDim, context, len(C))
	}
	for r := range rows {
		t := r % context
		for h := r * width; h < (r+1)*width; h += headDim {
			for i := range half {
				c, s := C[t*half+i], S[t*half+i]
				if inverse {
					s = -s
				}
				x1, x2 := X[h+i], X[h+half+i]
				Y[h+i] = x1*c - x2*s
				Y[h+half+i] = x2*c + x1*s
			}
		}
	}
	return nil
}

func (*Fake) Softmax(p, s Buffer, rows, cols int, scale float32, causal bool) error {
	P, S := f32(p), f32(s)
	for r := range rows {
		seen := cols
		if causal {
			seen = r%cols + 1
		}
		sr, pr := S[r*cols:(r+1)*cols], P[r*cols:(r+1)*cols]
		m := scale * sr[0]
		for _, v := range sr[:seen] {
			m = max(m, scale*v)
		}
		var z float32
		for j := range pr {
			pr[j] = 0
			if j < seen {
				pr[j] = float32(math.Exp(float64(scale*sr[j] - m)))
				z += pr[j]
			}
		}
		for j := range pr[:seen] {
			pr[j] /= z
		}
	}
	return nil
}

func (*Fake) SoftmaxGrad(ds, p, dp Buffer, rows, cols int, scale float32) error {
	DS, P, DP := f32(ds), f32(p), f32(dp)
	for r := range rows {
		var dot float32
		for j := range cols {
			dot += P[r*cols+j] * DP[r*cols+j]
		}
		for j := range cols {
			DS[r*cols+j] = scale * P[r*cols+j] * (DP[r*cols+j] - dot)
		}
	}
	return nil
}

func (*Fake) Embed(y, table, tokens Buffer, rows, width int) error {
	Y, T, K := f32(y), f32(table), f32(tokens)
	for i := range rows {
		k := int(K[i])
		if k < 0 || (k+1)*width > len(T) {
			return fmt.Errorf("token %d of row %d is not in the table's %d rows", k, i, len(T)/width)
		}
		copy(Y[i*width:(i+1)*width], T[k*width:(k+1)*width])
	}
	return nil
}

func (*Fake) EmbedGrad(dtable, dy, tokens Buffer, rows, width int) error {
	D, DY, K := f32(dtable), f32(dy), f32(tokens)
	for i := range rows {
		k := int(K[i])
		for j := range width {
			D[k*width+j] += DY[i*width+j]
		}
	}
	return nil
}
