package models

import (
	"errors"
	"fmt"
	"hash"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestMaxPool2x2Shape: the output shape is gorgonia's MaxPool2D's with kernel
// 2, no padding and stride 2, odd rows and columns dropped.
func TestMaxPool2x2Shape(t *testing.T) {
	for _, hw := range [][2]int{{2, 2}, {3, 3}, {4, 5}, {7, 7}, {6, 9}, {28, 28}} {
		in := tensor.Shape{2, 3, hw[0], hw[1]}
		got, err := maxPool2x2Op{}.InferShape(in)
		if err != nil {
			t.Fatal(err)
		}
		g := G.NewGraph()
		x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(in...), G.WithName("x"))
		ref, err := G.MaxPool2D(x, tensor.Shape{2, 2}, []int{0, 0}, []int{2, 2})
		if err != nil {
			t.Fatal(err)
		}
		if want := (tensor.Shape{2, 3, hw[0] / 2, hw[1] / 2}); !got.Eq(want) || !ref.Shape().Eq(want) {
			t.Errorf("%v: shape %v, MaxPool2D %v, want %v", in, got, ref.Shape(), want)
		}
	}
	for _, bad := range []tensor.Shape{{1, 1, 1, 4}, {1, 1, 4, 1}, {4, 4}} {
		if _, err := (maxPool2x2Op{}).InferShape(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	if _, err := (maxPool2x2GradOp{}).InferShape(tensor.Shape{1, 1, 5, 5}, tensor.Shape{1, 1, 3, 2}); err == nil || !strings.Contains(err.Error(), "want (1, 1, 2, 2)") {
		t.Errorf("mismatched output gradient: error %v", err)
	}
}

// poolGrads runs pool(x), the gradient of sum(pool(x) .* R) with respect to x
// and returns both, on one tape machine.
func poolGrads(t *testing.T, x *tensor.Dense, pool func(*G.Node) (*G.Node, error)) (y, dx []float64) {
	t.Helper()
	g := G.NewGraph()
	xn := newParam(g, "x", x.Clone().(*tensor.Dense))
	yn, err := pool(xn)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(8, 8))
	w := G.NewConstant(denseOf(x.Dtype(), randDense(r, 1, yn.Shape()...).Data().([]float64), yn.Shape()...))
	loss, err := G.Sum(G.Must(G.HadamardProd(yn, w)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := G.Grad(loss, xn); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g, G.BindDualValues(xn))
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	gv, err := xn.Grad()
	if err != nil {
		t.Fatal(err)
	}
	return asFloat64s(yn.Value()), asFloat64s(gv)
}

func asFloat64s(v G.Value) []float64 {
	switch d := v.Data().(type) {
	case []float32:
		out := make([]float64, len(d))
		for i, x := range d {
			out[i] = float64(x)
		}
		return out
	case []float64:
		return slices.Clone(d)
	}
	panic(fmt.Sprintf("unexpected data %T", v.Data()))
}

// TestMaxPool2x2MatchesGorgonia: on inputs without ties, and run once, the op
// and its gradient agree bit for bit with MaxPool2D, in both dtypes.
func TestMaxPool2x2MatchesGorgonia(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, hw := range [][2]int{{4, 4}, {5, 7}, {7, 6}} {
			x := denseOf(dt, randDense(r, 1, 2, 3, hw[0], hw[1]).Data().([]float64), 2, 3, hw[0], hw[1])
			y, dx := poolGrads(t, x, maxPool2x2)
			yRef, dxRef := poolGrads(t, x, func(n *G.Node) (*G.Node, error) {
				return G.MaxPool2D(n, tensor.Shape{2, 2}, []int{0, 0}, []int{2, 2})
			})
			if !slices.Equal(y, yRef) || !slices.Equal(dx, dxRef) {
				t.Errorf("%v %v: pool %v, gradient %v; MaxPool2D %v, %v", dt, hw, y, dx, yRef, dxRef)
			}
		}
	}
}

// TestGradMaxPool2x2 checks the gradient against central differences, on odd
// and even sizes. Ties for the maximum make the pool non-differentiable, so
// the inputs only have ties below it (checked in TestMaxPool2x2Ties).
func TestGradMaxPool2x2(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 12))
	for _, shape := range [][]int{{2, 3, 4, 4}, {1, 2, 5, 7}, {2, 1, 3, 2}} {
		x := randDense(r, 1, shape...)
		d := x.Data().([]float64)
		// Repeat the smallest value of the first window around the others,
		// a tie that does not decide the maximum.
		w := shape[3]
		low := min(d[0], d[1], d[w], d[w+1])
		for _, i := range []int{0, 1, w, w + 1} {
			if d[i] != max(d[0], d[1], d[w], d[w+1]) {
				d[i] = low
			}
		}
		t.Run(fmt.Sprint(shape), func(t *testing.T) {
			checkGrads(t, []*tensor.Dense{x}, func(g *G.ExprGraph, in []*G.Node) (*G.Node, error) {
				return maxPool2x2(in[0])
			})
		})
	}
}

// TestMaxPool2x2Ties: the first maximum of a window in row-major order wins,
// NaN beats numbers, and the dropped last column gets no gradient.
func TestMaxPool2x2Ties(t *testing.T) {
	nan := math.NaN()
	x := []float64{
		1, 1, 0, 2, 9,
		1, 1, 2, 1, 9,
		3, -1, 1, nan, 9,
		3, 3, 7, nan, 9,
	}
	dy := []float64{10, 20, 30, 40}
	wantY := []float64{1, 2, 3, nan}
	wantDx := []float64{
		10, 0, 0, 20, 0,
		0, 0, 0, 0, 0,
		30, 0, 0, 40, 0,
		0, 0, 0, 0, 0,
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		xt := denseOf(dt, x, 1, 1, 4, 5)
		y, err := maxPool2x2Op{}.Do(xt)
		if err != nil {
			t.Fatal(err)
		}
		if got := asFloat64s(y); !y.Shape().Eq(tensor.Shape{1, 1, 2, 2}) || !sameFloats(got, wantY) {
			t.Errorf("%v: pooled %v %v, want (1, 1, 2, 2) %v", dt, y.Shape(), got, wantY)
		}
		dx, err := maxPool2x2GradOp{}.Do(xt, denseOf(dt, dy, 1, 1, 2, 2))
		if err != nil {
			t.Fatal(err)
		}
		if got := asFloat64s(dx); !dx.Shape().Eq(tensor.Shape{1, 1, 4, 5}) || !slices.Equal(got, wantDx) {
			t.Errorf("%v: gradient %v %v, want (1, 1, 4, 5) %v", dt, dx.Shape(), got, wantDx)
		}
	}
}

// sameFloats is slices.Equal with NaN equal to NaN.
func sameFloats(a, b []float64) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return x == y || x != x && y != y })
}

// testGate and testPauseOp stop a tape machine between a forward and its
// backward, as an engine does, so that other machines of the same program can
// run in between.
type testGate struct {
	open, hit bool
	grad      G.Value
}

var errTestPause = errors.New("paused before the backward")

type testPauseOp struct{ g *testGate }

func (op testPauseOp) Arity() int { return 1 }
func (op testPauseOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op testPauseOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return in[0].(tensor.Shape).Clone(), nil
}
func (op testPauseOp) Do(in ...G.Value) (G.Value, error) {
	if !op.g.open {
		op.g.hit = true
		return nil, errTestPause
	}
	return op.g.grad, nil
}
func (op testPauseOp) ReturnsPtr() bool          { return true }
func (op testPauseOp) CallsExtern() bool         { return false }
func (op testPauseOp) OverwritesInput() int      { return -1 }
func (op testPauseOp) WriteHash(h hash.Hash)     { fmt.Fprintf(h, "testpause(%p)", op.g) }
func (op testPauseOp) Hashcode() uint32          { return hashOf(op) }
func (op testPauseOp) String() string            { return "testpause" }
func (op testPauseOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }
func (op testPauseOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	return make(G.Nodes, len(inputs)), nil
}

// TestConvInterleavedMachines runs one compiled conv layer (conv, bias, ReLU,
// max pool) on two tape machines in the order of a pipeline: forward of A,
// forward of B, backward of A, backward of B. Each backward must give exactly
// what it gives when nothing runs between it and its forward, which fails for
// an op that keeps state from its last run.
func TestConvInterleavedMachines(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		t.Run(dt.String(), func(t *testing.T) {
			conv := &Conv{name: "conv0", In: 2, Out: 3, Size: 7, dt: dt}
			const batch = 2
			g := G.NewGraph()
			x := G.NewMatrix(g, dt, G.WithShape(batch, 2*7*7), G.WithName("x"))
			b, err := conv.Build(g, x, 3)
			if err != nil {
				t.Fatal(err)
			}
			gate := &testGate{}
			seed, err := G.ApplyOp(testPauseOp{gate}, b.Out)
			if err != nil {
				t.Fatal(err)
			}
			wrt := append(slices.Clone(b.Params), x)
			grads, err := G.Backpropagate(G.Nodes{b.Out}, G.Nodes{seed}, wrt)
			if err != nil {
				t.Fatal(err)
			}
			prog, locMap, err := G.Compile(g)
			if err != nil {
				t.Fatal(err)
			}
			newVM := func() G.VM { return G.NewTapeMachine(g, G.WithPrecompiled(prog, locMap)) }
			r := rand.New(rand.NewPCG(13, 13))
			random := func(shape ...int) *tensor.Dense {
				return denseOf(dt, randDense(r, 1, shape...).Data().([]float64), shape...)
			}
			inA, inB := random(batch, 2*7*7), random(batch, 2*7*7)
			dyA, dyB := random(b.Out.Shape()...), random(b.Out.Shape()...)
			forward := func(vm G.VM, in *tensor.Dense) {
				t.Helper()
				if err := G.Let(x, in); err != nil {
					t.Fatal(err)
				}
				gate.open, gate.hit = false, false
				if err := vm.RunAll(); err == nil || !gate.hit {
					t.Fatalf("forward: %v, want the pause", err)
				}
			}
			backward := func(vm G.VM, dy *tensor.Dense) [][]float64 {
				t.Helper()
				gate.open, gate.grad = true, dy
				if err := vm.RunAll(); err != nil {
					t.Fatalf("backward: %v", err)
				}
				gate.open, gate.grad = false, nil
				out := make([][]float64, len(grads))
				for i, n := range grads {
					out[i] = asFloat64s(n.Value())
				}
				return out
			}
			alone := func(in, dy *tensor.Dense) [][]float64 {
				vm := newVM()
				defer vm.Close()
				forward(vm, in)
				return backward(vm, dy)
			}
			wantA, wantB := alone(inA, dyA), alone(inB, dyB)
			vmA, vmB := newVM(), newVM()
			defer vmA.Close()
			defer vmB.Close()
			forward(vmA, inA)
			forward(vmB, inB)
			gotA := backward(vmA, dyA)
			gotB := backward(vmB, dyB)
			for i, n := range wrt {
				if !slices.Equal(gotA[i], wantA[i]) {
					t.Errorf("micro-batch A, gradient of %s differs when B's forward runs before A's backward", n.Name())
				}
				if !slices.Equal(gotB[i], wantB[i]) {
					t.Errorf("micro-batch B, gradient of %s differs", n.Name())
				}
			}
			if slices.Equal(wantA[2], wantB[2]) {
				t.Error("A and B have the same input gradient: the test does not tell them apart")
			}
		})
	}
}
