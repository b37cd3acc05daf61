package models

import (
	"fmt"
	"hash"
	"hash/fnv"
	"math"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Fused ops: the transformer's token and position embedding, LayerNorm,
// GELU, bias add and causal attention, each one op with a hand-written backward (checked against
// finite differences in gradcheck_test.go). Composed from gorgonia's
// element-wise and broadcast ops, the same layers spent most of a GPT step
// repeating vectors over rows, permuting heads in and out of place and
// walking strided views, each a pass over memory with its own allocation; a
// fused op makes one pass, into memory the tape machine keeps between runs
// (UsePreallocDo).
//
// Like every op here they hold no per-run state: an engine keeps several
// tape machines of one graph in flight. So a backward op either recomputes
// what it needs from the forward's inputs (a row's mean and variance, GELU's
// tanh) or reads it from the forward's output, which its machine keeps until
// the micro-batch's backward (attention's probabilities).

// fusedOp is an op computed by one kernel per dtype over contiguous inputs.
type fusedOp[T float32 | float64] struct {
	name    string // with every parameter: it is also the op's hash
	inDims  []int
	outDims int
	// data[i] marks input i as data, which gets no gradient: grad returns
	// nil for it.
	data   []bool
	shape  func(in []tensor.Shape) (tensor.Shape, error)
	kernel func(out []T, in [][]T, shapes []tensor.Shape)
	// check, when set, vets the inputs' values before the kernel runs, for
	// the ops whose inputs index memory (token ids).
	check func(in [][]T, shapes []tensor.Shape) error
	// grad returns the gradient node of each input, or nil for an op that
	// has none.
	grad func(o *ops, in G.Nodes, output, grad *G.Node) G.Nodes
}

func (op *fusedOp[T]) Arity() int { return len(op.inDims) }

func (op *fusedOp[T]) Type() hm.Type {
	a := hm.TypeVariable('a')
	ts := make([]hm.Type, 0, len(op.inDims)+1)
	for _, d := range op.inDims {
		ts = append(ts, G.TensorType{Dims: d, Of: a})
	}
	return hm.NewFnType(append(ts, G.TensorType{Dims: op.outDims, Of: a})...)
}

func (op *fusedOp[T]) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	shapes := make([]tensor.Shape, len(in))
	for i, d := range in {
		s, ok := d.(tensor.Shape)
		if !ok || s.Dims() != op.inDims[i] {
			return nil, fmt.Errorf("%s: input %d has shape %v, want %d dimensions", op.name, i, d, op.inDims[i])
		}
		shapes[i] = s
	}
	return op.shape(shapes)
}

func (op *fusedOp[T]) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo computes into prealloc when it has the output's shape.
func (op *fusedOp[T]) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	data := make([][]T, len(in))
	shapes := make([]tensor.Shape, len(in))
	for i, v := range in {
		d, ok := v.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("%s: input %d is a %T, want a dense tensor", op.name, i, v)
		}
		if d.IsMaterializable() { // a view: lay it out
			d = d.Materialize().(*tensor.Dense)
		}
		if data[i], ok = d.Data().([]T); !ok {
			return nil, fmt.Errorf("%s: input %d has dtype %v", op.name, i, d.Dtype())
		}
		shapes[i] = d.Shape()
	}
	shape, err := op.shape(shapes)
	if err != nil {
		return nil, err
	}
	if op.check != nil {
		if err := op.check(data, shapes); err != nil {
			return nil, err
		}
	}
	out, _ := prealloc.(*tensor.Dense)
	if out == nil || !out.Shape().Eq(shape) || out.IsMaterializable() {
		out = tensor.New(tensor.Of(dtypeOf[T]()), tensor.WithShape(shape...))
	}
	op.kernel(out.Data().([]T), data, shapes)
	return out, nil
}

func (op *fusedOp[T]) ReturnsPtr() bool      { return false }
func (op *fusedOp[T]) CallsExtern() bool     { return false }
func (op *fusedOp[T]) OverwritesInput() int  { return -1 }
func (op *fusedOp[T]) WriteHash(h hash.Hash) { fmt.Fprintf(h, "pipetrain.%s", op.name) }
func (op *fusedOp[T]) Hashcode() uint32      { return hashOf(op) }
func (op *fusedOp[T]) String() string        { return op.name }

func (op *fusedOp[T]) DiffWRT(inputs int) []bool {
	d := make([]bool, inputs)
	for i := range d {
		d[i] = op.grad != nil && (i >= len(op.data) || !op.data[i])
	}
	return d
}

func (op *fusedOp[T]) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.grad == nil {
		return make(G.Nodes, len(inputs)), nil
	}
	o := newOps(output.Dtype())
	out := op.grad(o, inputs, output, grad)
	if o.err != nil {
		return nil, fmt.Errorf("%s backward: %w", op.name, o.err)
	}
	return out, nil
}

// fused applies the op of o's dtype.
func (o *ops) fused(op32 *fusedOp[float32], op64 *fusedOp[float64], in ...*G.Node) *G.Node {
	if o.dt == tensor.Float64 {
		return o.apply(op64, in...)
	}
	return o.apply(op32, in...)
}

// sameShape is the shape function of ops whose output has input 0's shape.
func sameShape(in []tensor.Shape) (tensor.Shape, error) { return in[0].Clone(), nil }

// rowsOf checks that input 0 is (n, d) and every other input is a vector of d.
func rowsOf(name string, in []tensor.Shape) (n, d int, err error) {
	n, d = in[0][0], in[0][1]
	for i, s := range in[1:] {
		if s.Dims() == 1 && s[0] != d || s.Dims() == 2 && !s.Eq(in[0]) {
			return 0, 0, fmt.Errorf("%s: input %d has shape %v, input 0 %v", name, i+1, s, in[0])
		}
	}
	return n, d, nil
}

// ---- bias add and column sums ----

// biasAdd is x (n, d) plus b (d) on every row.
func (o *ops) biasAdd(x, b *G.Node) *G.Node {
	return o.fused(biasAddOp[float32](), biasAddOp[float64](), x, b)
}

func biasAddOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "BiasAdd", inDims: []int{2, 1}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, _, err := rowsOf("bias add", in)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				addRows32(out, any(in[0]).([]float32), any(in[1]).([]float32), s[0][1])
			default:
				addRowsGo(out.([]float64), any(in[0]).([]float64), any(in[1]).([]float64), s[0][1])
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{grad, o.colSum(grad)}
		},
	}
}

// colSum is the sum of the rows of x (n, d): a vector of d.
func (o *ops) colSum(x *G.Node) *G.Node {
	return o.fused(colSumOp[float32](), colSumOp[float64](), x)
}

func colSumOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "ColSum", inDims: []int{2}, outDims: 1,
		shape:  func(in []tensor.Shape) (tensor.Shape, error) { return tensor.Shape{in[0][1]}, nil },
		kernel: func(out []T, in [][]T, s []tensor.Shape) { colSums(out, in[0], s[0][1]) },
	}
}

// colSums sets out[j] to the sum over rows of x[r·d+j], row after row, in
// T's kernel.
func colSums[T float32 | float64](out, x []T, d int) {
	switch out := any(out).(type) {
	case []float32:
		colSum32(out, any(x).([]float32), d)
	default:
		colSumGo(out.([]float64), any(x).([]float64), d)
	}
}

// ---- LayerNorm ----

// layerNorm normalises each row of x (n, d) to zero mean and unit variance
// (the biased variance, as in GPT-2 and torch.nn.LayerNorm) and applies the
// learned per-feature gain and bias (d).
func (o *ops) layerNorm(x, gain, bias *G.Node) *G.Node {
	return o.fused(layerNormOp[float32](), layerNormOp[float64](), x, gain, bias)
}

// normRow returns row x's mean and 1/sqrt(variance + eps).
func normRow[T float32 | float64](x []T) (mean, rstd T) {
	mean = sum(x) / T(len(x))
	return mean, 1 / T(math.Sqrt(float64(centredSquares(x, mean)/T(len(x))+layerNormEps)))
}

func layerNormOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "LayerNorm", inDims: []int{2, 1, 1}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, _, err := rowsOf("layer norm", in)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, gain, bias, d := in[0], in[1], in[2], s[0][1]
			for r := 0; r < len(x); r += d {
				xr, or := x[r:r+d], out[r:r+d]
				mean, rstd := normRow(xr)
				for j, v := range xr {
					or[j] = (v-mean)*rstd*gain[j] + bias[j]
				}
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			x, gain := in[0], in[1]
			return G.Nodes{
				o.fused(layerNormInputGradOp[float32](), layerNormInputGradOp[float64](), x, gain, grad),
				o.fused(layerNormGainGradOp[float32](), layerNormGainGradOp[float64](), x, grad),
				o.colSum(grad),
			}
		},
	}
}

// layerNormInputGradOp is dx from (x, gain, dy): with x̂ the normalised row
// and g = dy·gain, dx = rstd·(g − mean(g) − x̂·mean(g·x̂)).
func layerNormInputGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "LayerNormInputGrad", inDims: []int{2, 1, 2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, _, err := rowsOf("layer norm input gradient", in)
			return in[0].Clone(), err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, gain, dy, d := in[0], in[1], in[2], s[0][1]
			for r := 0; r < len(x); r += d {
				xr, dyr, or := x[r:r+d], dy[r:r+d], out[r:r+d]
				mean, rstd := normRow(xr)
				var sg, sgx T
				for j, v := range xr {
					g := dyr[j] * gain[j]
					sg += g
					sgx += g * (v - mean) * rstd
				}
				mg, mgx := sg/T(d), sgx/T(d)
				for j, v := range xr {
					or[j] = rstd * (dyr[j]*gain[j] - mg - (v-mean)*rstd*mgx)
				}
			}
		},
	}
}

// layerNormGainGradOp is the gain's gradient from (x, dy): the sum over rows
// of dy·x̂.
func layerNormGainGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "LayerNormGainGrad", inDims: []int{2, 2}, outDims: 1,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			_, d, err := rowsOf("layer norm gain gradient", in)
			return tensor.Shape{d}, err
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			x, dy, d := in[0], in[1], s[0][1]
			clear(out)
			for r := 0; r < len(x); r += d {
				xr, dyr := x[r:r+d], dy[r:r+d]
				mean, rstd := normRow(xr)
				for j, v := range xr {
					out[j] += dyr[j] * (v - mean) * rstd
				}
			}
		},
	}
}

// ---- token and position embedding ----

// embed is the GPT's input layer on token ids (batch, context), stored as
// floats: row b·context+t of the result, (batch·context, width), is row
// ids[b, t] of the token table tok (vocab, width) plus row t of the position
// table pos (context, width). The backward scatters: the token table's
// gradient adds each row of the output's gradient into its token's row, in
// row order, and the position table's sums each position's rows over the
// sequences, in sequence order. (As a one-hot matrix times tok, the lookup
// and its gradient were vocab-wide products, and the gradient's bits were
// the BLAS's to choose.)
func (o *ops) embed(ids, tok, pos *G.Node) *G.Node {
	return o.fused(embedOp[float32](), embedOp[float64](), ids, tok, pos)
}

// checkIDs vets token ids: a fractional or out-of-range id is an error, not
// a silently wrong row (or a read past the table).
func checkIDs[T float32 | float64](ids []T, vocab int) error {
	for i, v := range ids {
		if id := int(v); T(id) != v || id < 0 || id >= vocab {
			return fmt.Errorf("embed: token id %v at position %d is not an integer in [0, %d)", v, i, vocab)
		}
	}
	return nil
}

func embedOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "Embed", inDims: []int{2, 2, 2}, outDims: 2, data: []bool{true},
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			ids, tok, pos := in[0], in[1], in[2]
			if pos[0] != ids[1] || pos[1] != tok[1] {
				return nil, fmt.Errorf("embed: token ids %v, token table %v and position table %v do not fit", ids, tok, pos)
			}
			return tensor.Shape{ids[0] * ids[1], tok[1]}, nil
		},
		check: func(in [][]T, s []tensor.Shape) error { return checkIDs(in[0], s[1][0]) },
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			ids, tok, pos, t, w := in[0], in[1], in[2], s[0][1], s[1][1]
			for r, id := range ids {
				tr, pr, or := tok[int(id)*w:][:w], pos[r%t*w:][:w], out[r*w:][:w]
				for j := range or {
					or[j] = tr[j] + pr[j]
				}
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			vocab, context := in[1].Shape()[0], in[0].Shape()[1]
			return G.Nodes{nil,
				o.fused(tokenGradOp[float32](vocab), tokenGradOp[float64](vocab), in[0], grad),
				o.fused(positionGradOp[float32](context), positionGradOp[float64](context), grad)}
		},
	}
}

// tokenGradOp is the token table's gradient (vocab, width) from the ids
// (batch, context) and the gradient dy (batch·context, width) of embed's
// output: row v is the sum of the rows of dy whose token is v, in row order.
func tokenGradOp[T float32 | float64](vocab int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("EmbedTokenGrad{%d}", vocab), inDims: []int{2, 2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if in[1][0] != in[0][0]*in[0][1] {
				return nil, fmt.Errorf("embed token gradient: token ids %v, gradient %v", in[0], in[1])
			}
			return tensor.Shape{vocab, in[1][1]}, nil
		},
		check: func(in [][]T, _ []tensor.Shape) error { return checkIDs(in[0], vocab) },
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			ids, dy, w := in[0], in[1], s[1][1]
			clear(out)
			for r, id := range ids {
				or, dr := out[int(id)*w:][:w], dy[r*w:][:w]
				for j := range or {
					or[j] += dr[j]
				}
			}
		},
	}
}

// positionGradOp is the position table's gradient (context, width) from the
// gradient dy (batch·context, width) of embed's output: each sequence's
// (context, width) block of dy, summed sequence after sequence.
func positionGradOp[T float32 | float64](context int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("EmbedPositionGrad{%d}", context), inDims: []int{2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if in[0][0]%context != 0 {
				return nil, fmt.Errorf("embed position gradient: %v is not sequences of %d tokens", in[0], context)
			}
			return tensor.Shape{context, in[0][1]}, nil
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) { colSums(out, in[0], context*s[0][1]) },
	}
}

// ---- GELU ----

// The tanh approximation GPT-2 uses:
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
const geluCubic = 0.044715

var geluScale = math.Sqrt(2 / math.Pi)

func (o *ops) gelu(x *G.Node) *G.Node {
	return o.fused(geluOp[float32](), geluOp[float64](), x)
}

// The fused ops' loops in Go: for float64, and for float32 where the
// vector kernels (simd_amd64.s) are not built or the CPU lacks AVX2; those
// compute these loops' bits.

// addRowsGo sets out[r·d+j] = x[r·d+j] + b[j].
func addRowsGo[T float32 | float64](out, x, b []T, d int) {
	for r := 0; r < len(out); r += d {
		xr, or := x[r:r+d], out[r:r+d]
		for j, bj := range b[:d] {
			or[j] = xr[j] + bj
		}
	}
}

// colSumGo sets out[j] to the sum over rows of x[r·d+j], row after row.
func colSumGo[T float32 | float64](out, x []T, d int) {
	clear(out[:d])
	for r := 0; r < len(x); r += d {
		for j, v := range x[r : r+d] {
			out[j] += v
		}
	}
}

// The GELU's constants in each precision, as the vector kernels get them.
var (
	geluC32, geluK32, geluK332 = float32(geluScale), float32(geluCubic), float32(3 * geluCubic)
)

func geluConsts[T float32 | float64]() (c, k, k3 T) {
	var zero T
	if _, ok := any(zero).(float32); ok {
		return T(geluC32), T(geluK32), T(geluK332)
	}
	return T(geluScale), geluCubic, 3 * geluCubic
}

func tanhOf[T float32 | float64](v T) T {
	if x, ok := any(v).(float32); ok {
		return T(tanh32(x))
	}
	return T(math.Tanh(float64(v)))
}

// geluGo sets out[i] = 0.5·x·(1 + tanh(c·(x + k·x³))).
func geluGo[T float32 | float64](out, x []T) {
	c, k, _ := geluConsts[T]()
	for i, v := range x[:len(out)] {
		t := tanhOf(c * (v + k*v*v*v))
		out[i] = 0.5 * v * (1 + t)
	}
}

// geluGradGo sets out[i] = dy·(0.5·(1 + t) + 0.5·x·(1 − t²)·c·(1 + 3k·x²)).
func geluGradGo[T float32 | float64](out, x, dy []T) {
	c, k, k3 := geluConsts[T]()
	for i, v := range x[:len(out)] {
		t := tanhOf(c * (v + k*v*v*v))
		out[i] = dy[i] * (0.5*(1+t) + 0.5*v*(1-t*t)*c*(1+k3*v*v))
	}
}

func geluOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "GELU", inDims: []int{2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				gelu32(out, any(in[0]).([]float32))
			default:
				geluGo(out.([]float64), any(in[0]).([]float64))
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			return G.Nodes{o.fused(geluGradOp[float32](), geluGradOp[float64](), in[0], grad)}
		},
	}
}

// geluGradOp is dx from (x, dy): dy · (0.5 (1 + t) + 0.5 x (1 − t²) · c (1 +
// 3·0.044715 x²)) with t the forward's tanh.
func geluGradOp[T float32 | float64]() *fusedOp[T] {
	return &fusedOp[T]{name: "GELUGrad", inDims: []int{2, 2}, outDims: 2, shape: sameShape,
		kernel: func(out []T, in [][]T, _ []tensor.Shape) {
			switch out := any(out).(type) {
			case []float32:
				geluGrad32(out, any(in[0]).([]float32), any(in[1]).([]float32))
			default:
				geluGradGo(out.([]float64), any(in[0]).([]float64), any(in[1]).([]float64))
			}
		},
	}
}

// ---- causal attention ----

// causalAttention is multi-head causal self-attention without its
// projections: q, k, v are (batch*context, width) with each row a token and
// head h owning columns [h*dh, (h+1)*dh); the result has the same layout,
// ready for the output projection. Each head of each sequence is two
// products on strided blocks of the inputs (BLAS reads them in place) and a
// softmax over the keys a query may see, j <= i; the others get exactly 0.
// With keep, the forward keeps each head's probabilities for the backward;
// without, the backward computes them again from q and k, the same bits.
func (o *ops) causalAttention(q, k, v *G.Node, batch, context, heads int, keep bool) *G.Node {
	if o.err != nil {
		return nil
	}
	width := q.Shape()[1]
	if width%heads != 0 || q.Shape()[0] != batch*context {
		o.err = fmt.Errorf("attention: q %v does not hold %d sequences of %d tokens in %d heads", q.Shape(), batch, context, heads)
		return nil
	}
	return o.attend(q, k, v, attention{context: context, heads: heads, keep: keep})
}

// attend adds attention a on q, k and v, whose shapes the caller checked.
func (o *ops) attend(q, k, v *G.Node, a attention) *G.Node {
	width := q.Shape()[1]
	packed := o.fused(attentionOp[float32](a), attentionOp[float64](a), q, k, v)
	if !a.keep {
		return packed
	}
	return o.columns(packed, 0, width)
}

// attention is the shape of a causal attention op: tokens per sequence and
// heads, and whether the forward keeps the probabilities; the width and the
// number of sequences come from its inputs.
type attention struct {
	context, heads int
	// kvHeads, unless 0 (meaning heads), is how many heads k and v hold:
	// grouped-query attention, where query head h reads key and value head
	// h/(heads/kvHeads).
	kvHeads int
	keep    bool
	// blk, unless 0 (meaning attentionBlock), is the block of queries of
	// the kernels: tests take small ones to cover several blocks.
	blk int
}

func (a attention) String() string {
	s := fmt.Sprintf("{context %d, heads %d", a.context, a.heads)
	if a.grouped() {
		s += fmt.Sprintf(", kv heads %d", a.kvHeads)
	}
	if !a.keep {
		s += ", recomputed"
	}
	return s + "}"
}

// grouped says whether k and v hold fewer heads than q.
func (a attention) grouped() bool { return a.kvHeads != 0 && a.kvHeads != a.heads }

// group is how many query heads share one key and value head.
func (a attention) group() int {
	if !a.grouped() {
		return 1
	}
	return a.heads / a.kvHeads
}

// kvWidth is the width of k's and v's rows for q's rows of w.
func (a attention) kvWidth(w int) int { return w / a.group() }

// packedWidth is the width of the forward's output rows: the token's
// output (w), then, when kept, its row of each head's probabilities (t each).
func (a attention) packedWidth(w int) int {
	if !a.keep {
		return w
	}
	return w + a.heads*a.context
}

// check is the shape function of the attention ops: the first three inputs
// (q, k, v) are (n, w), with n a whole number of sequences and w of heads
// (k and v (n, kvWidth(w)) when grouped); any others are (n, packedWidth(w)).
func (a attention) check(name string, out func(n, w int) tensor.Shape) func([]tensor.Shape) (tensor.Shape, error) {
	return func(in []tensor.Shape) (tensor.Shape, error) {
		n, w := in[0][0], in[0][1]
		for i, s := range in {
			want := in[0]
			switch {
			case i == 1 || i == 2:
				want = tensor.Shape{n, a.kvWidth(w)}
			case i >= 3:
				want = tensor.Shape{n, a.packedWidth(w)}
			}
			if !s.Eq(want) {
				return nil, fmt.Errorf("%s: input %d has shape %v, input 0 %v", name, i, s, in[0])
			}
		}
		if n%a.context != 0 || w%a.heads != 0 || a.heads%a.group() != 0 {
			return nil, fmt.Errorf("%s: inputs %v are not sequences of %d tokens in %d heads", name, in[0], a.context, a.heads)
		}
		return out(n, w), nil
	}
}

// attentionBlock is how many queries (and keys) the attention kernels take
// at a time: a block of queries is multiplied with the keys up to its last
// one only, so the products skip most of the masked upper triangle (6 of
// 16 blocks at 256 tokens) instead of computing scores the mask then drops.
const attentionBlock = 64

// block is a's block of queries, attentionBlock unless a test set blk.
func (a attention) block() int {
	if a.blk > 0 {
		return a.blk
	}
	return attentionBlock
}

// blocks calls f on [lo, hi) for consecutive blocks of b covering [0, t).
func blocks(t, b int, f func(lo, hi int)) {
	for lo := 0; lo < t; lo += b {
		f(lo, min(lo+b, t))
	}
}

// attentionOp is (q, k, v) -> (n, packedWidth(w)): each row the token's
// output, then its probabilities under every head, kept for the backward
// (the op itself holds no state; the machine keeps its output until the
// micro-batch's backward has run).
func attentionOp[T float32 | float64](a attention) *fusedOp[T] {
	return &fusedOp[T]{name: "CausalAttention" + a.String(), inDims: []int{2, 2, 2}, outDims: 2,
		shape: a.check("attention", func(n, w int) tensor.Shape { return tensor.Shape{n, a.packedWidth(w)} }),
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			q, k, v, w := in[0], in[1], in[2], s[0][1]
			t, dh, pw, kw, b := a.context, w/a.heads, a.packedWidth(w), a.kvWidth(w), a.block()
			var scratch []T
			if !a.keep {
				scratch = make([]T, t*t)
			}
			for seq := 0; seq < s[0][0]; seq += t {
				for h := range a.heads {
					at, kat := seq*w+h*dh, seq*kw+h/a.group()*dh
					// Kept, the probabilities go straight to the head's
					// columns of the output, rows pw apart.
					p, ld := scratch, t
					if a.keep {
						p, ld = out[seq*pw+w+h*t:], pw
					}
					probabilities(p, ld, q[at:], k[kat:], t, dh, w, kw, b)
					// O = P V, into the head's columns of the output, each
					// block of queries over the keys it sees.
					blocks(t, b, func(lo, hi int) {
						gemm(false, false, hi-lo, dh, hi, 1, p[lo*ld:], ld, v[kat:], kw, 0, out[(seq+lo)*pw+h*dh:], pw)
					})
				}
			}
		},
		grad: func(o *ops, in G.Nodes, output, grad *G.Node) G.Nodes {
			packed := o.fused(attentionGradOp[float32](a), attentionGradOp[float64](a), in[0], in[1], in[2], output, grad)
			w := in[0].Shape()[1]
			kw := a.kvWidth(w)
			return G.Nodes{o.columns(packed, 0, w), o.columns(packed, w, kw), o.columns(packed, w+kw, kw)}
		},
	}
}

// probabilities fills p (t rows of t, ldp apart) with one head's causal
// softmax of q kᵀ/√dh, q and k being t rows of dh at strides ldq and ldk;
// each block of b queries is scored against the keys up to its last.
func probabilities[T float32 | float64](p []T, ldp int, q, k []T, t, dh, ldq, ldk, b int) {
	scale := T(1 / math.Sqrt(float64(dh)))
	blocks(t, b, func(lo, hi int) {
		gemm(false, true, hi-lo, hi, dh, scale, q[lo*ldq:], ldq, k, ldk, 0, p[lo*ldp:], ldp)
	})
	switch p := any(p).(type) {
	case []float32:
		causalSoftmax32(p, t, ldp)
	default:
		causalSoftmaxGo(p.([]float64), t, ldp)
	}
}

// causalSoftmaxGo turns t rows of t scores, ld apart, into each row's
// softmax over the keys it sees, j <= i, in place, reading no score after
// j = i. Each row is shifted by its maximum over those and the rest masked
// to -Inf, whose exp is exactly 0.
func causalSoftmaxGo[T float32 | float64](p []T, t, ld int) {
	for i := range t {
		row := p[i*ld : i*ld+t]
		m := row[0]
		for _, v := range row[1 : i+1] {
			m = max(m, v)
		}
		for j := range row[:i+1] {
			row[j] -= m
		}
		for j := range row[i+1:] {
			row[i+1+j] = T(math.Inf(-1))
		}
		expInPlace(row)
		seen := row[:i+1]
		inv := 1 / sum(seen)
		for j := range seen {
			seen[j] *= inv
		}
	}
}

// expInPlace sets v[i] = exp(v[i]) in T's own precision (exp32 for float32).
func expInPlace[T float32 | float64](v []T) {
	switch v := any(v).(type) {
	case []float32:
		exp32s(v, v)
	case []float64:
		for i, x := range v {
			v[i] = math.Exp(x)
		}
	}
}

// attentionGradOp is (q, k, v, forward's output, its gradient) -> [dq | dk
// | dv], (n, 3w). Per head, with P the forward's: dV = Pᵀ dO; dP = dO Vᵀ;
// dS = P ∘ (dP − rowsum(dP ∘ P)); dQ = dS K/√dh; dK = dSᵀ Q/√dh. dO is the
// first w columns of the output's gradient (the rest, the probabilities'
// columns, gets none). P is the forward's, or computed again from q and k
// when the forward did not keep it. Grouped, dk and dv are kvWidth(w) wide
// and each key and value head sums the terms of its query heads, in head
// order. P and dS are lower triangular: each product runs over the blocks
// of queries and keys that can be non-zero, as the forward's.
func attentionGradOp[T float32 | float64](a attention) *fusedOp[T] {
	return &fusedOp[T]{name: "CausalAttentionGrad" + a.String(), inDims: []int{2, 2, 2, 2, 2}, outDims: 2,
		shape: a.check("attention gradient", func(n, w int) tensor.Shape { return tensor.Shape{n, w + 2*a.kvWidth(w)} }),
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			q, k, v, fwd, dO, w := in[0], in[1], in[2], in[3], in[4], s[0][1]
			t, dh, pw, kw, b := a.context, w/a.heads, a.packedWidth(w), a.kvWidth(w), a.block()
			ow := w + 2*kw
			scale := T(1 / math.Sqrt(float64(dh)))
			dp := make([]T, t*t)
			var scratch []T
			if !a.keep {
				scratch = make([]T, t*t)
			}
			for seq := 0; seq < s[0][0]; seq += t {
				for h := range a.heads {
					kh := h / a.group()
					at, kat, g := seq*w+h*dh, seq*kw+kh*dh, seq*pw+h*dh
					// dq's, dk's and dv's columns of the head in the output.
					dq, dk, dv := seq*ow+h*dh, seq*ow+w+kh*dh, seq*ow+w+kw+kh*dh
					// The first query head of a group sets its key and
					// value head's gradients, the others add to them.
					var acc T
					if h%a.group() != 0 {
						acc = 1
					}
					p, ld := scratch, t
					if a.keep {
						p, ld = fwd[seq*pw+w+h*t:], pw
					} else {
						probabilities(p, ld, q[at:], k[kat:], t, dh, w, kw, b)
					}
					// dV = Pᵀ dO: keys lo..hi are seen by queries lo..t.
					blocks(t, b, func(lo, hi int) {
						gemm(true, false, hi-lo, dh, t-lo, 1, p[lo*ld+lo:], ld, dO[g+lo*pw:], pw, acc, out[dv+lo*ow:], ow)
					})
					// dP = dO Vᵀ for the keys each block of queries sees.
					blocks(t, b, func(lo, hi int) {
						gemm(false, true, hi-lo, hi, dh, 1, dO[g+lo*pw:], pw, v[kat:], kw, 0, dp[lo*t:], t)
					})
					for i := range t {
						pr, dr := p[i*ld:i*ld+i+1], dp[i*t:i*t+t]
						pd := dot(pr, dr)
						for j, pj := range pr {
							dr[j] = pj * (dr[j] - pd)
						}
						// Zero up to the end of i's block: the products
						// below read dS no further.
						clear(dr[i+1 : min((i/b+1)*b, t)])
					}
					blocks(t, b, func(lo, hi int) {
						gemm(false, false, hi-lo, dh, hi, scale, dp[lo*t:], t, k[kat:], kw, 0, out[dq+lo*ow:], ow)
					})
					blocks(t, b, func(lo, hi int) {
						gemm(true, false, hi-lo, dh, t-lo, scale, dp[lo*t+lo:], t, q[at+lo*w:], w, acc, out[dk+lo*ow:], ow)
					})
				}
			}
		},
	}
}

// columns is columns [from, from+n) of x (r, c), laid out as (r, n).
func (o *ops) columns(x *G.Node, from, n int) *G.Node {
	return o.fused(columnsOp[float32](from, n), columnsOp[float64](from, n), x)
}

func columnsOp[T float32 | float64](from, n int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("Columns{%d, %d}", from, n), inDims: []int{2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if from+n > in[0][1] {
				return nil, fmt.Errorf("columns [%d, %d) of %v", from, from+n, in[0])
			}
			return tensor.Shape{in[0][0], n}, nil
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			c := s[0][1]
			for r := range s[0][0] {
				copy(out[r*n:(r+1)*n], in[0][r*c+from:r*c+from+n])
			}
		},
		grad: func(o *ops, in G.Nodes, _, grad *G.Node) G.Nodes {
			width := in[0].Shape()[1]
			return G.Nodes{o.fused(placeColumnsOp[float32](from, width), placeColumnsOp[float64](from, width), grad)}
		},
	}
}

// placeColumnsOp is columns's gradient: x (r, n) placed at columns [from,
// from+n) of an (r, width) matrix of zeros.
func placeColumnsOp[T float32 | float64](from, width int) *fusedOp[T] {
	return &fusedOp[T]{name: fmt.Sprintf("PlaceColumns{%d, %d}", from, width), inDims: []int{2}, outDims: 2,
		shape: func(in []tensor.Shape) (tensor.Shape, error) {
			if from+in[0][1] > width {
				return nil, fmt.Errorf("placing %v at column %d of %d", in[0], from, width)
			}
			return tensor.Shape{in[0][0], width}, nil
		},
		kernel: func(out []T, in [][]T, s []tensor.Shape) {
			// Row by row, each element written once: the attention's
			// probabilities make rows five times wider than what is placed.
			n := s[0][1]
			for r := range s[0][0] {
				row := out[r*width : (r+1)*width]
				clear(row[:from])
				copy(row[from:from+n], in[0][r*n:(r+1)*n])
				clear(row[from+n:])
			}
		},
	}
}

// gemm is C = alpha·op(A)·op(B) + beta·C in the BLAS gorgonia uses, A m×k
// and B k×n after the optional transposes, each at its own row stride.
func gemm[T float32 | float64](transA, transB bool, m, n, k int, alpha T, a []T, lda int, b []T, ldb int, beta T, c []T, ldc int) {
	tA, tB := blas.NoTrans, blas.NoTrans
	if transA {
		tA = blas.Trans
	}
	if transB {
		tB = blas.Trans
	}
	// BLAS checks each slice's length against the last element it reads.
	rowsA, colsA := m, k
	if transA {
		rowsA, colsA = k, m
	}
	rowsB, colsB := k, n
	if transB {
		rowsB, colsB = n, k
	}
	a, b, c = a[:(rowsA-1)*lda+colsA], b[:(rowsB-1)*ldb+colsB], c[:(m-1)*ldc+n]
	switch a := any(a).(type) {
	case []float32:
		G.WhichBLAS().Sgemm(tA, tB, m, n, k, float32(alpha), a, lda, any(b).([]float32), ldb, float32(beta), any(c).([]float32), ldc)
	case []float64:
		G.WhichBLAS().Dgemm(tA, tB, m, n, k, float64(alpha), a, lda, any(b).([]float64), ldb, float64(beta), any(c).([]float64), ldc)
	}
}

// hashOf is the FNV hash of an op's WriteHash, which gorgonia uses to merge
// identical nodes.
func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

// dtypeOf is T's tensor dtype.
func dtypeOf[T float32 | float64]() tensor.Dtype {
	var zero T
	if _, ok := any(zero).(float64); ok {
		return tensor.Float64
	}
	return tensor.Float32
}
