package engine

import (
	"sync/atomic"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/parallel"
)

// fastEngine is gorgonia's standard CPU engine with vectorised kernels for
// the elementwise operations a stage program spends its time in besides its
// products: the bias add, the gradient accumulation into the parameters'
// derivatives (both Add), ReLU and its mask (Mul, and the comparison with
// zero). gorgonia's own loops add one value at a time; these take eight
// (SIMD lanes) and give the same bits, since each lane does the same IEEE
// operation. Anything else (views, broadcasts, increments, other dtypes) is
// left to the standard engine.
//
// Values get the engine from the stage's tape machines (WithEngine, for the
// buffers they allocate) and from the engine itself for the parameters,
// their derivatives and the inputs it binds; results of the operations here
// keep it.
type fastEngine struct{ tensor.StdEng }

var fast = fastEngine{}

// workers is how many goroutines share an elementwise operation of at least
// parallelMin elements (SetWorkers); 0 or 1: the caller's alone.
var workers atomic.Int32

// parallelMin is the smallest operation shared among workers: below it
// starting goroutines costs more than the work.
const parallelMin = 1 << 16

// SetWorkers lets the vectorised kernels cut a large elementwise operation
// (a weight matrix's gradient accumulation) into n contiguous ranges done at
// once: a process given n cores for its products should not add on one.
// Each element depends on its own operands only, so the bits do not
// depend on n.
func SetWorkers(n int) { workers.Store(int32(n)) }

// Workers is the count SetWorkers last set.
func Workers() int { return int(workers.Load()) }

// shared runs f over [0, n) in the workers' ranges at once, or whole on the
// caller's goroutine.
func shared(n int, f func(lo, hi int)) { parallel.Ranges(n, int(workers.Load()), parallelMin, f) }

type binaryKernel int

const (
	kernelAdd binaryKernel = iota
	kernelMul
)

func (e fastEngine) Add(a, b tensor.Tensor, opts ...tensor.FuncOpt) (tensor.Tensor, error) {
	if out, ok := e.binary(kernelAdd, a, b, opts); ok {
		return out, nil
	}
	return e.StdEng.Add(a, b, opts...)
}

func (e fastEngine) Mul(a, b tensor.Tensor, opts ...tensor.FuncOpt) (tensor.Tensor, error) {
	if out, ok := e.binary(kernelMul, a, b, opts); ok {
		return out, nil
	}
	return e.StdEng.Mul(a, b, opts...)
}

// GteScalar handles t >= s with a result of t's own type (a ReLU's mask).
func (e fastEngine) GteScalar(t tensor.Tensor, s interface{}, leftTensor bool, opts ...tensor.FuncOpt) (tensor.Tensor, error) {
	if out, ok := e.gteScalar(t, s, leftTensor, opts); ok {
		return out, nil
	}
	return e.StdEng.GteScalar(t, s, leftTensor, opts...)
}

// plain is a dense tensor whose data is one contiguous slice in order.
func plain(t tensor.Tensor) (*tensor.Dense, bool) {
	d, ok := t.(*tensor.Dense)
	if !ok || d.RequiresIterator() || d.IsView() || !d.IsNativelyAccessible() {
		return nil, false
	}
	switch d.Dtype() {
	case tensor.Float32, tensor.Float64:
		return d, true
	}
	return nil, false
}

// destination is where an elementwise result of a's shape and type goes,
// as opts say: a itself (unsafe), the reuse tensor, or a new one. An
// increment is left to the standard engine.
func (e fastEngine) destination(a *tensor.Dense, opts []tensor.FuncOpt) (*tensor.Dense, bool) {
	fo := tensor.ParseFuncOpts(opts...)
	if fo.Incr() != nil || fo.As().Type != nil {
		return nil, false
	}
	if r := fo.Reuse(); r != nil {
		d, ok := plain(r)
		if !ok || d.Dtype() != a.Dtype() || !d.Shape().Eq(a.Shape()) {
			return nil, false
		}
		return d, true
	}
	if !fo.Safe() {
		return a, true
	}
	return tensor.New(tensor.Of(a.Dtype()), tensor.WithShape(a.Shape().Clone()...), tensor.WithEngine(e)), true
}

func (e fastEngine) binary(k binaryKernel, at, bt tensor.Tensor, opts []tensor.FuncOpt) (tensor.Tensor, bool) {
	a, okA := plain(at)
	b, okB := plain(bt)
	if !okA || !okB || a.Dtype() != b.Dtype() || !a.Shape().Eq(b.Shape()) {
		return nil, false
	}
	out, ok := e.destination(a, opts)
	if !ok {
		return nil, false
	}
	switch a.Dtype() {
	case tensor.Float32:
		dst, x, y := out.Float32s(), a.Float32s(), b.Float32s()
		shared(len(dst), func(lo, hi int) { binary32(k, dst[lo:hi], x[lo:hi], y[lo:hi]) })
	default:
		dst, x, y := out.Float64s(), a.Float64s(), b.Float64s()
		shared(len(dst), func(lo, hi int) { binaryGo(k, dst[lo:hi], x[lo:hi], y[lo:hi]) })
	}
	return out, true
}

func (e fastEngine) gteScalar(t tensor.Tensor, s interface{}, leftTensor bool, opts []tensor.FuncOpt) (tensor.Tensor, bool) {
	a, ok := plain(t)
	if !ok || !leftTensor || !tensor.ParseFuncOpts(opts...).Same() {
		return nil, false
	}
	v, ok := scalarOf(s, a.Dtype())
	if !ok {
		return nil, false
	}
	// A comparison's options say "same type", which destination does not
	// take for a change of type: strip nothing, but decide here.
	fo := tensor.ParseFuncOpts(opts...)
	var out *tensor.Dense
	switch {
	case fo.Incr() != nil:
		return nil, false
	case fo.Reuse() != nil:
		r, ok := plain(fo.Reuse())
		if !ok || r.Dtype() != a.Dtype() || !r.Shape().Eq(a.Shape()) {
			return nil, false
		}
		out = r
	case !fo.Safe():
		out = a
	default:
		out = tensor.New(tensor.Of(a.Dtype()), tensor.WithShape(a.Shape().Clone()...), tensor.WithEngine(e))
	}
	switch a.Dtype() {
	case tensor.Float32:
		gteScalar32(out.Float32s(), a.Float32s(), float32(v))
	default:
		gteScalarGo(out.Float64s(), a.Float64s(), v)
	}
	return out, true
}

// scalarOf reads a comparison's scalar operand of dtype dt.
func scalarOf(s interface{}, dt tensor.Dtype) (float64, bool) {
	if d, ok := s.(interface{ Data() interface{} }); ok {
		s = d.Data()
	}
	switch v := s.(type) {
	case float32:
		return float64(v), dt == tensor.Float32
	case float64:
		return v, dt == tensor.Float64
	}
	return 0, false
}

// AddFloat32s sets acc[i] = acc[i] + v[i] with the vector kernel where
// the CPU has one: each lane is the same IEEE addition as the Go loop, so
// the bits are the same. The replicas' all-reduce sums its chunks with it.
func AddFloat32s(acc, v []float32) { binary32(kernelAdd, acc, acc, v[:len(acc)]) }

// binaryGo is the kernels in Go: for the vector kernels' tails, float64,
// machines without AVX and builds with -tags nosimd or for other
// architectures.
func binaryGo[T float32 | float64](k binaryKernel, dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch k {
	case kernelAdd:
		for i := range dst {
			dst[i] = a[i] + b[i]
		}
	case kernelMul:
		for i := range dst {
			dst[i] = a[i] * b[i]
		}
	}
}

func gteScalarGo[T float32 | float64](dst, a []T, s T) {
	a = a[:len(dst)]
	for i, v := range a {
		if v >= s {
			dst[i] = 1
		} else {
			dst[i] = 0
		}
	}
}
