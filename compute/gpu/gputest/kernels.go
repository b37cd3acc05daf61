package gputest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pipetrain/pipetrain/compute/gpu"
)

// Kernel tolerances against float64 references: a kernel computes in
// float32, whose unit in the last place is 1.2e-7 relative, with a few
// roundings per element (the transcendental functions of the GPU's fast
// paths are within 2 ulp); sums over k terms add k such roundings.
const (
	elemTol = 1e-6 // elementwise ops, relative to max(1, |want|)
	sumTol  = 1e-5 // products and row sums of up to a hundred terms
	// fdTol: a derivative against the float64 central difference of the
	// float64 function, step 1e-4: truncation error of about 1e-8·f'''.
	fdTol = 1e-4
)

// CheckKernels runs each of be's kernels on random values and checks it
// against a float64 reference; the activations' derivatives also against
// finite differences of the function.
func CheckKernels(t *testing.T, be gpu.Backend) {
	r := rand.New(rand.NewPCG(3, 4))
	t.Run("gemm", func(t *testing.T) { checkGemm(t, be, r) })
	t.Run("bias", func(t *testing.T) { checkBias(t, be, r) })
	for _, f := range []gpu.Act{"", "relu", "tanh", "sigmoid", "gelu", "silu"} {
		t.Run("activation-"+string(f), func(t *testing.T) { checkActivation(t, be, r, f) })
	}
	t.Run("xent", func(t *testing.T) { checkXent(t, be, r) })
	t.Run("optimizers", func(t *testing.T) { checkOptimizers(t, be, r) })
	t.Run("long", func(t *testing.T) { checkLong(t, be, r) })
	t.Run("rope", func(t *testing.T) { checkRope(t, be, r) })
	for _, causal := range []bool{false, true} {
		for _, cols := range []int{7, 600} {
			t.Run(fmt.Sprintf("softmax-causal=%v-%d", causal, cols), func(t *testing.T) { checkSoftmax(t, be, r, causal, cols) })
		}
	}
	t.Run("embed", func(t *testing.T) { checkEmbed(t, be, r) })
	for _, layer := range []bool{true, false} {
		for _, cols := range []int{37, 700} {
			t.Run(fmt.Sprintf("norm-layer=%v-%d", layer, cols), func(t *testing.T) { checkNorm(t, be, r, layer, 5, cols) })
		}
	}
}

// checkLong runs an elementwise kernel over more elements than one launch
// has threads (the kernels loop over the rest), and fills and copies as
// many.
func checkLong(t *testing.T, be gpu.Backend, r *rand.Rand) {
	n := 256*4096 + 5
	x0 := random(r, n, 1)
	x := dev(t, be, x0)
	if err := be.Scale(x, 3); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, n)
	for i, v := range x0 {
		want[i] = 3 * float64(v)
	}
	y := dev(t, be, make([]float32, n))
	if err := be.Copy(y, x); err != nil {
		t.Fatal(err)
	}
	expect(t, "scaled and copied", host(t, be, y), want, elemTol)
	if err := be.Fill(x, 0.25); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i] = 0.25
	}
	expect(t, "filled", host(t, be, x), want, 0)
}

func random(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((r.Float64()*2 - 1) * scale)
	}
	return v
}

// dev uploads v to a new buffer of be.
func dev(t *testing.T, be gpu.Backend, v []float32) gpu.Buffer {
	t.Helper()
	b, err := be.Alloc(len(v))
	if err == nil {
		err = be.Upload(b, v)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Free(b) })
	return b
}

func host(t *testing.T, be gpu.Backend, b gpu.Buffer) []float32 {
	t.Helper()
	v := make([]float32, b.Len())
	if err := be.Download(v, b); err != nil {
		t.Fatal(err)
	}
	return v
}

// expect fails t at the first value of got more than tol·max(1, |want|)
// from want.
func expect(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*math.Max(1, math.Abs(want[i]))) {
			t.Fatalf("%s[%d] = %g, want %g (float64) within %g", what, i, got[i], want[i], tol)
		}
	}
}

// checkGemm tries each transposition on a small product and on one whose
// sizes are no multiple of a GPU's tiles.
func checkGemm(t *testing.T, be gpu.Backend, r *rand.Rand) {
	for _, size := range [][3]int{{7, 9, 33}, {130, 70, 300}} {
		m, n, k := size[0], size[1], size[2]
		for _, c := range []struct{ ta, tb bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
			checkGemmCase(t, be, r, m, n, k, c.ta, c.tb)
		}
	}
}

// checkGemmCase checks one product against float64. Its tolerance grows
// as √k: k float32 roundings of random sign.
func checkGemmCase(t *testing.T, be gpu.Backend, r *rand.Rand, m, n, k int, ta, tb bool) {
	a, b, c0 := random(r, m*k, 1), random(r, k*n, 1), random(r, m*n, 1)
	const alpha, beta = 0.5, 2
	c := dev(t, be, c0)
	if err := be.Gemm(ta, tb, m, n, k, alpha, dev(t, be, a), dev(t, be, b), beta, c); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				ai, bi := i*k+p, p*n+j
				if ta {
					ai = p*m + i
				}
				if tb {
					bi = j*k + p
				}
				s += float64(a[ai]) * float64(b[bi])
			}
			want[i*n+j] = alpha*s + beta*float64(c0[i*n+j])
		}
	}
	expect(t, fmt.Sprintf("gemm %dx%dx%d transA=%v transB=%v", m, n, k, ta, tb), host(t, be, c), want, sumTol*math.Sqrt(float64(k)/33))
}

func checkBias(t *testing.T, be gpu.Backend, r *rand.Rand) {
	rows, cols := 5, 11
	y0, b := random(r, rows*cols, 1), random(r, cols, 1)
	y := dev(t, be, y0)
	if err := be.AddBias(y, dev(t, be, b), rows, cols); err != nil {
		t.Fatal(err)
	}
	want := make([]float64, rows*cols)
	sums := make([]float64, cols)
	d0 := random(r, cols, 1)
	for i := range want {
		want[i] = float64(y0[i]) + float64(b[i%cols])
		sums[i%cols] += float64(y0[i])
	}
	expect(t, "bias add", host(t, be, y), want, elemTol)
	for j := range sums {
		sums[j] += 0.5 * float64(d0[j])
	}
	d := dev(t, be, d0)
	if err := be.SumRows(d, dev(t, be, y0), rows, cols, 0.5); err != nil {
		t.Fatal(err)
	}
	expect(t, "row sums", host(t, be, d), sums, sumTol)
}

// act64 is each activation in float64, the references.
func act64(f gpu.Act, x float64) float64 {
	switch f {
	case "relu":
		return math.Max(x, 0)
	case "tanh":
		return math.Tanh(x)
	case "sigmoid":
		return 1 / (1 + math.Exp(-x))
	case "gelu":
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	case "silu":
		return x / (1 + math.Exp(-x))
	}
	return x
}

func checkActivation(t *testing.T, be gpu.Backend, r *rand.Rand, f gpu.Act) {
	n := 257
	x0, dy0 := random(r, n, 4), random(r, n, 1)
	x0[0] = 0 // relu's kink, where the engine's derivative is 1
	x, y, dy, dx := dev(t, be, x0), dev(t, be, make([]float32, n)), dev(t, be, dy0), dev(t, be, make([]float32, n))
	if err := be.Activate(f, y, x); err != nil {
		t.Fatal(err)
	}
	if err := be.ActivateGrad(f, dx, dy, x, y); err != nil {
		t.Fatal(err)
	}
	want, grad := make([]float64, n), make([]float64, n)
	const h = 1e-4
	for i, v := range x0 {
		xv := float64(v)
		want[i] = act64(f, xv)
		grad[i] = float64(dy0[i]) * (act64(f, xv+h) - act64(f, xv-h)) / (2 * h)
		if f == "relu" && math.Abs(xv) < h { // the kink: the derivative is [x ≥ 0] (gorgonia's), the difference ½
			grad[i] = float64(dy0[i]) * map[bool]float64{true: 1, false: 0}[xv >= 0]
		}
	}
	expect(t, "activation "+string(f), host(t, be, y), want, elemTol)
	expect(t, "derivative of "+string(f), host(t, be, dx), grad, fdTol)
}

// checkXent tries rows narrower than a block of the kernel's threads and
// rows wider than one (several columns a thread).
func checkXent(t *testing.T, be gpu.Backend, r *rand.Rand) {
	for _, size := range [][2]int{{6, 13}, {3, 1000}} {
		checkXentSize(t, be, r, size[0], size[1])
	}
}

func checkXentSize(t *testing.T, be gpu.Backend, r *rand.Rand, rows, cols int) {
	x0 := random(r, rows*cols, 5)
	tg := make([]float32, rows)
	for i := range tg {
		tg[i] = float32(r.IntN(cols))
	}
	loss, probs, x, targets := dev(t, be, make([]float32, rows)), dev(t, be, make([]float32, rows*cols)), dev(t, be, x0), dev(t, be, tg)
	if err := be.Xent(loss, probs, x, targets, rows, cols); err != nil {
		t.Fatal(err)
	}
	d := dev(t, be, make([]float32, rows*cols))
	const scale = 0.25
	if err := be.XentGrad(d, probs, targets, rows, cols, scale); err != nil {
		t.Fatal(err)
	}
	wantLoss, wantP, wantD := make([]float64, rows), make([]float64, rows*cols), make([]float64, rows*cols)
	for i := range rows {
		row := x0[i*cols : (i+1)*cols]
		var z float64
		for _, v := range row {
			z += math.Exp(float64(v))
		}
		wantLoss[i] = math.Log(z) - float64(row[int(tg[i])])
		for j, v := range row {
			p := math.Exp(float64(v)) / z
			wantP[i*cols+j] = p
			if j == int(tg[i]) {
				p--
			}
			wantD[i*cols+j] = scale * p
		}
	}
	expect(t, "row losses", host(t, be, loss), wantLoss, elemTol*10)
	expect(t, "softmax", host(t, be, probs), wantP, elemTol)
	expect(t, "cross-entropy gradient", host(t, be, d), wantD, elemTol)
}

func checkOptimizers(t *testing.T, be gpu.Backend, r *rand.Rand) {
	n := 100
	p0, g0, s0, v0 := random(r, n, 1), random(r, n, 1), random(r, n, 1), random(r, n, 1)
	for i := range v0 {
		v0[i] = v0[i] * v0[i] // a second moment is not negative
	}
	const lr, mu, b1, b2, step, eps, a = 0.1, 0.9, 0.9, 0.999, 0.01, 1e-8, 0.3
	cases := []struct {
		name string
		run  func(p, g, s, v gpu.Buffer) error
		// ref updates one element: parameter, gradient, the slots.
		ref func(p, g, s, v float64) (float64, float64, float64, float64)
	}{
		{"sgd", func(p, g, _, _ gpu.Buffer) error { return be.SGD(p, g, lr) },
			func(p, g, s, v float64) (float64, float64, float64, float64) { return p - lr*g, 0, s, v }},
		{"momentum", func(p, g, s, _ gpu.Buffer) error { return be.Momentum(p, g, s, lr, mu) },
			func(p, g, s, v float64) (float64, float64, float64, float64) {
				s = mu*s + g
				return p - lr*s, 0, s, v
			}},
		{"adam", func(p, g, m, v gpu.Buffer) error { return be.Adam(p, g, m, v, b1, b2, step, eps) },
			func(p, g, m, v float64) (float64, float64, float64, float64) {
				m, v = b1*m+(1-b1)*g, b2*v+(1-b2)*g*g
				return p - step*m/(math.Sqrt(v)+eps), 0, m, v
			}},
		{"scale", func(p, _, _, _ gpu.Buffer) error { return be.Scale(p, a) },
			func(p, g, s, v float64) (float64, float64, float64, float64) { return a * p, g, s, v }},
		{"add-scaled", func(p, g, _, _ gpu.Buffer) error { return be.AddScaled(g, p, a) },
			func(p, g, s, v float64) (float64, float64, float64, float64) { return p, g + a*p, s, v }},
	}
	for _, c := range cases {
		p, g, s, v := dev(t, be, p0), dev(t, be, g0), dev(t, be, s0), dev(t, be, v0)
		if err := c.run(p, g, s, v); err != nil {
			t.Fatal(err)
		}
		want := [4][]float64{make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)}
		for i := range n {
			want[0][i], want[1][i], want[2][i], want[3][i] = c.ref(float64(p0[i]), float64(g0[i]), float64(s0[i]), float64(v0[i]))
		}
		for j, b := range []gpu.Buffer{p, g, s, v} {
			expect(t, fmt.Sprintf("%s: %s", c.name, []string{"parameter", "gradient", "first slot", "second slot"}[j]), host(t, be, b), want[j], elemTol*10)
		}
	}
}

// norm64 is LayerNorm (layer) or RMSNorm of one row in float64.
func norm64(layer bool, x, gain, bias []float64, eps float64) []float64 {
	n := float64(len(x))
	var mu, ss float64
	if layer {
		for _, v := range x {
			mu += v
		}
		mu /= n
	}
	for _, v := range x {
		ss += (v - mu) * (v - mu)
	}
	r := 1 / math.Sqrt(ss/n+eps)
	y := make([]float64, len(x))
	for j, v := range x {
		y[j] = (v - mu) * r * gain[j]
		if layer {
			y[j] += bias[j]
		}
	}
	return y
}

// checkNorm checks LayerNorm's or RMSNorm's forward against float64 and
// its gradients against central differences of the float64 forward of
// L = Σ dy·y, with respect to each input, gain and bias.
func checkNorm(t *testing.T, be gpu.Backend, r *rand.Rand, layer bool, rows, cols int) {
	const eps = 1e-5
	x0, g0, b0, dy0 := random(r, rows*cols, 2), random(r, cols, 1), random(r, cols, 1), random(r, rows*cols, 1)
	for i := range x0 {
		x0[i] += 0.5 // a mean to take away
	}
	zeros := func(n int) gpu.Buffer { return dev(t, be, make([]float32, n)) }
	x, gain, bias, dy := dev(t, be, x0), dev(t, be, g0), dev(t, be, b0), dev(t, be, dy0)
	y, mean, rstd, dx := zeros(rows*cols), zeros(rows), zeros(rows), zeros(rows*cols)
	d0 := random(r, cols, 1) // the gradients are added to what these hold
	dgain, dbias := dev(t, be, d0), dev(t, be, d0)
	var err error
	if layer {
		if err = be.LayerNorm(y, mean, rstd, x, gain, bias, rows, cols, eps); err == nil {
			err = be.LayerNormGrad(dx, dgain, dbias, dy, x, mean, rstd, gain, rows, cols)
		}
	} else if err = be.RMSNorm(y, rstd, x, gain, rows, cols, eps); err == nil {
		err = be.RMSNormGrad(dx, dgain, dy, x, rstd, gain, rows, cols)
	}
	if err != nil {
		t.Fatal(err)
	}
	f64 := func(v []float32) []float64 {
		out := make([]float64, len(v))
		for i, e := range v {
			out[i] = float64(e)
		}
		return out
	}
	X, G, B, DY := f64(x0), f64(g0), f64(b0), f64(dy0)
	loss := func() float64 { // Σ dy·y over the rows
		var l float64
		for i := range rows {
			for j, v := range norm64(layer, X[i*cols:(i+1)*cols], G, B, eps) {
				l += DY[i*cols+j] * v
			}
		}
		return l
	}
	diff := func(v []float64, i int) float64 {
		const h = 1e-5
		keep := v[i]
		v[i] = keep + h
		up := loss()
		v[i] = keep - h
		down := loss()
		v[i] = keep
		return (up - down) / (2 * h)
	}
	want, wdx, wdg, wdb := make([]float64, 0, rows*cols), make([]float64, rows*cols), make([]float64, cols), make([]float64, cols)
	for i := range rows {
		want = append(want, norm64(layer, X[i*cols:(i+1)*cols], G, B, eps)...)
	}
	for i := range wdx {
		wdx[i] = diff(X, i)
	}
	for j := range cols {
		wdg[j] = float64(d0[j]) + diff(G, j)
		wdb[j] = float64(d0[j]) + diff(B, j)
	}
	what := map[bool]string{true: "LayerNorm", false: "RMSNorm"}[layer]
	expect(t, what, host(t, be, y), want, 10*elemTol)
	expect(t, what+" input gradient", host(t, be, dx), wdx, fdTol)
	expect(t, what+" gain gradient", host(t, be, dgain), wdg, fdTol)
	if layer {
		expect(t, what+" bias gradient", host(t, be, dbias), wdb, fdTol)
	}
}

// checkRope checks the rotation and its inverse against float64, on two
// sequences of 5 positions with 3 heads of 8: the inverse undoes the
// rotation and is its transpose, Σ dy·rope(x) = Σ rope⁻¹(dy)·x.
func checkRope(t *testing.T, be gpu.Backend, r *rand.Rand) {
	const context, heads, headDim, theta = 5, 3, 8, 10000.0
	rows, width, half := 2*context, heads*headDim, headDim/2
	cos, sin := make([]float32, context*half), make([]float32, context*half)
	for i := range half {
		f := 1 / math.Pow(theta, float64(2*i)/headDim)
		for p := range context {
			cos[p*half+i], sin[p*half+i] = float32(math.Cos(float64(p)*f)), float32(math.Sin(float64(p)*f))
		}
	}
	x0, dy0 := random(r, rows*width, 1), random(r, rows*width, 1)
	C, S := dev(t, be, cos), dev(t, be, sin)
	y, back, dx := dev(t, be, make([]float32, rows*width)), dev(t, be, make([]float32, rows*width)), dev(t, be, make([]float32, rows*width))
	for _, err := range []error{
		be.Rope(y, dev(t, be, x0), C, S, rows, width, context, headDim, false),
		be.Rope(back, y, C, S, rows, width, context, headDim, true),
		be.Rope(dx, dev(t, be, dy0), C, S, rows, width, context, headDim, true),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	want, undone := make([]float64, rows*width), make([]float64, rows*width)
	for row := range rows {
		p := row % context
		for h := row * width; h < (row+1)*width; h += headDim {
			for i := range half {
				c, s := float64(cos[p*half+i]), float64(sin[p*half+i])
				x1, x2 := float64(x0[h+i]), float64(x0[h+half+i])
				want[h+i], want[h+half+i] = x1*c-x2*s, x2*c+x1*s
			}
		}
	}
	for i, v := range x0 {
		undone[i] = float64(v)
	}
	expect(t, "rotary embedding", host(t, be, y), want, elemTol)
	expect(t, "rotary embedding undone", host(t, be, back), undone, elemTol)
	var lhs, rhs float64
	got, g := host(t, be, y), host(t, be, dx)
	for i := range got {
		lhs += float64(dy0[i]) * float64(got[i])
		rhs += float64(g[i]) * float64(x0[i])
	}
	if math.Abs(lhs-rhs) > sumTol*math.Max(1, math.Abs(lhs))*10 {
		t.Errorf("Σ dy·rope(x) = %g but Σ rope⁻¹(dy)·x = %g: the inverse is not the rotation's gradient", lhs, rhs)
	}
}

// softmax64 is attention's softmax of one row in float64, the first seen
// keys only.
func softmax64(s []float64, scale float64, seen int) []float64 {
	p := make([]float64, len(s))
	m := math.Inf(-1)
	for _, v := range s[:seen] {
		m = math.Max(m, scale*v)
	}
	var z float64
	for j := range s[:seen] {
		p[j] = math.Exp(scale*s[j] - m)
		z += p[j]
	}
	for j := range p {
		p[j] /= z
	}
	return p
}

// checkSoftmax checks attention's softmax against float64 and its gradient
// against central differences of L = Σ dp·softmax(s), on two blocks of
// cols query rows (causal: row r sees r mod cols + 1 keys).
func checkSoftmax(t *testing.T, be gpu.Backend, r *rand.Rand, causal bool, cols int) {
	rows := 2 * cols
	if cols > 64 {
		rows = 9 // a few rows of a long context: the mask's shape is the same
	}
	const scale = 0.35
	s0, dp0 := random(r, rows*cols, 4), random(r, rows*cols, 1)
	p, ds := dev(t, be, make([]float32, rows*cols)), dev(t, be, make([]float32, rows*cols))
	if err := be.Softmax(p, dev(t, be, s0), rows, cols, scale, causal); err != nil {
		t.Fatal(err)
	}
	if err := be.SoftmaxGrad(ds, p, dev(t, be, dp0), rows, cols, scale); err != nil {
		t.Fatal(err)
	}
	want, grad := make([]float64, 0, rows*cols), make([]float64, 0, rows*cols)
	for row := range rows {
		seen := cols
		if causal {
			seen = row%cols + 1
		}
		s := make([]float64, cols)
		for j := range s {
			s[j] = float64(s0[row*cols+j])
		}
		want = append(want, softmax64(s, scale, seen)...)
		loss := func() float64 {
			var l float64
			for j, v := range softmax64(s, scale, seen) {
				l += float64(dp0[row*cols+j]) * v
			}
			return l
		}
		for j := range s {
			const h = 1e-5
			keep := s[j]
			s[j] = keep + h
			up := loss()
			s[j] = keep - h
			down := loss()
			s[j] = keep
			grad = append(grad, (up-down)/(2*h))
		}
	}
	expect(t, "softmax", host(t, be, p), want, elemTol)
	expect(t, "softmax gradient", host(t, be, ds), grad, fdTol)
}

// checkEmbed gathers rows of a table by token, and scatters gradients back,
// tokens repeated (their rows' gradients add up).
func checkEmbed(t *testing.T, be gpu.Backend, r *rand.Rand) {
	const vocab, width, rows = 11, 6, 20
	table0, dy0 := random(r, vocab*width, 1), random(r, rows*width, 1)
	tokens := make([]float32, rows)
	for i := range tokens {
		tokens[i] = float32(r.IntN(vocab))
	}
	tokens[1] = tokens[0]
	y, dtable := dev(t, be, make([]float32, rows*width)), dev(t, be, make([]float32, vocab*width))
	K := dev(t, be, tokens)
	if err := be.Embed(y, dev(t, be, table0), K, rows, width); err != nil {
		t.Fatal(err)
	}
	if err := be.EmbedGrad(dtable, dev(t, be, dy0), K, rows, width); err != nil {
		t.Fatal(err)
	}
	want, grad := make([]float64, rows*width), make([]float64, vocab*width)
	for i, k := range tokens {
		for j := range width {
			want[i*width+j] = float64(table0[int(k)*width+j])
			grad[int(k)*width+j] += float64(dy0[i*width+j])
		}
	}
	expect(t, "embedding", host(t, be, y), want, 0)
	expect(t, "embedding gradient", host(t, be, dtable), grad, elemTol)
}
