package stages

import (
	"errors"
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// Engine computes one stage's slice of a model: layers [First, Last) of the model,
// plus the loss when Last is the model's end. It runs the forward of a micro-batch
// and, any time later, its backward, without recomputing the forward: the stage is
// one compiled gorgonia program whose tape pauses where the upstream gradient enters
// (see pauseOp), and each micro-batch in flight keeps its own tape machine, whose
// registers are that micro-batch's stashed activations. Weight gradients of all
// micro-batches sum into the parameters' dual values until Step.
type Engine struct {
	Model       *models.Model
	First, Last int // layer range [First, Last)
	Batch       int // examples per micro-batch

	g      *G.ExprGraph
	x      *G.Node // stage input: data on the first stage, else the upstream activation
	onehot *G.Node // last stage: one-hot targets
	out    *G.Node // activation sent downstream, or the scalar loss on the last stage
	dx     *G.Node // gradient w.r.t. x; nil on the first stage (nobody to send it to)
	params []*G.Node
	logits G.Value // last stage: copied out by a Read node during the forward

	compiled compiledProgram
	gate     *gate
	idle     []G.VM
	inflight map[int]G.VM
	peak     int
}

type compiledProgram struct {
	newMachine func() G.VM
}

// NewEngine builds and compiles the stage program once; nothing is rebuilt per step.
func NewEngine(m *models.Model, first, last, batch int, seed uint64) (e *Engine, err error) {
	if first < 0 || last > len(m.Layers) || first >= last {
		return nil, fmt.Errorf("layer range [%d, %d) is not within the model's %d layers", first, last, len(m.Layers))
	}
	// Graph construction in gorgonia panics on some shape errors; report them as errors.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("building layers [%d, %d): %v", first, last, r)
		}
	}()
	e = &Engine{Model: m, First: first, Last: last, Batch: batch, g: G.NewGraph(), gate: &gate{}, inflight: map[int]G.VM{}}
	inShape := m.ShapeAt(first, batch)
	e.x = G.NewTensor(e.g, m.DType, len(inShape), G.WithShape(inShape...), G.WithName("input"))
	h := e.x
	for _, l := range m.Layers[first:last] {
		var ps []*G.Node
		if h, ps, err = l.Build(e.g, h, seed); err != nil {
			return nil, err
		}
		e.params = append(e.params, ps...)
	}
	e.out = h
	if e.IsLast() {
		e.onehot = G.NewMatrix(e.g, m.DType, G.WithShape(batch, m.Classes), G.WithName("targets"))
		G.Read(h, &e.logits)
		if e.out, err = models.SoftmaxCrossEntropy(h, e.onehot); err != nil {
			return nil, fmt.Errorf("loss: %w", err)
		}
	}
	wrt := append([]*G.Node{}, e.params...)
	if !e.IsFirst() {
		wrt = append(wrt, e.x)
	}
	upstream, err := G.ApplyOp(newPause(e.gate), e.out)
	if err != nil {
		return nil, fmt.Errorf("adding the backward pause: %w", err)
	}
	grads, err := G.Backpropagate(G.Nodes{e.out}, G.Nodes{upstream}, wrt)
	if err != nil {
		return nil, fmt.Errorf("differentiating layers [%d, %d): %w", first, last, err)
	}
	if !e.IsFirst() {
		e.dx = grads[len(grads)-1]
	}
	prog, locMap, err := G.Compile(e.g)
	if err != nil {
		return nil, fmt.Errorf("compiling layers [%d, %d): %w", first, last, err)
	}
	params := e.params
	e.compiled.newMachine = func() G.VM {
		return G.NewTapeMachine(e.g, G.WithPrecompiled(prog, locMap), G.BindDualValues(params...))
	}
	return e, nil
}

// IsFirst reports whether the stage reads data (it computes no input gradient).
func (e *Engine) IsFirst() bool { return e.First == 0 }

// IsLast reports whether the stage computes the loss.
func (e *Engine) IsLast() bool { return e.Last == len(e.Model.Layers) }

// InShape and OutShape are the shapes of one micro-batch entering and leaving the stage.
func (e *Engine) InShape() tensor.Shape  { return e.x.Shape().Clone() }
func (e *Engine) OutShape() tensor.Shape { return e.Model.ShapeAt(e.Last, e.Batch) }

// Params returns the stage's parameter nodes in a stable order (layer order, then
// weight before bias); the order fixes optimizer state and checkpoint layout.
func (e *Engine) Params() []*G.Node { return e.params }

// InFlight is how many micro-batches have run forward and await backward; PeakInFlight
// the most at once since the engine was made.
func (e *Engine) InFlight() int     { return len(e.inflight) }
func (e *Engine) PeakInFlight() int { return e.peak }

// Forward runs micro-batch key's forward on input. On the last stage targets holds
// the class of each example and the result is the scalar loss; elsewhere it is the
// activation to send downstream. The returned tensor is a copy the caller owns.
func (e *Engine) Forward(key int, input *tensor.Dense, targets []int) (*tensor.Dense, error) {
	if _, busy := e.inflight[key]; busy {
		return nil, fmt.Errorf("micro-batch %d: forward run twice before its backward", key)
	}
	if err := G.Let(e.x, input); err != nil {
		return nil, fmt.Errorf("micro-batch %d input: %w", key, err)
	}
	if e.IsLast() {
		if err := G.Let(e.onehot, e.oneHot(targets)); err != nil {
			return nil, fmt.Errorf("micro-batch %d targets: %w", key, err)
		}
	}
	vm := e.machine()
	e.gate.open, e.gate.hit = false, false
	err := vm.RunAll()
	if err == nil || !e.gate.hit {
		vm.Reset()
		e.idle = append(e.idle, vm)
		if err == nil {
			err = errors.New("program finished without reaching the backward pause")
		}
		return nil, fmt.Errorf("micro-batch %d forward: %w", key, err)
	}
	e.inflight[key] = vm
	if len(e.inflight) > e.peak {
		e.peak = len(e.inflight)
	}
	return copyDense(e.out.Value())
}

// Logits returns a copy of the last forward's logits (last stage only), for evaluation.
func (e *Engine) Logits() (*tensor.Dense, error) {
	if e.logits == nil {
		return nil, errors.New("no logits: not the last stage, or no forward has run")
	}
	return copyDense(e.logits)
}

// Backward resumes micro-batch key's machine with the gradient of the stage output
// (the loss scale on the last stage), adds its weight gradients to the parameters'
// and returns the gradient w.r.t. the stage input (nil on the first stage).
func (e *Engine) Backward(key int, grad G.Value) (*tensor.Dense, error) {
	vm, ok := e.inflight[key]
	if !ok {
		return nil, fmt.Errorf("micro-batch %d: backward without a forward", key)
	}
	delete(e.inflight, key)
	e.gate.open, e.gate.grad, e.gate.taken = true, grad, false
	err := vm.RunAll()
	e.gate.open, e.gate.grad = false, nil
	defer func() {
		vm.Reset()
		e.idle = append(e.idle, vm)
	}()
	if err != nil {
		return nil, fmt.Errorf("micro-batch %d backward: %w", key, err)
	}
	if !e.gate.taken {
		return nil, fmt.Errorf("micro-batch %d backward: machine did not resume at the pause", key)
	}
	if e.dx == nil {
		return nil, nil
	}
	return copyDense(e.dx.Value())
}

// Discard drops micro-batch key's stashed forward (evaluation: no backward follows).
func (e *Engine) Discard(key int) {
	if vm, ok := e.inflight[key]; ok {
		delete(e.inflight, key)
		vm.Reset()
		e.idle = append(e.idle, vm)
	}
}

// LossScale is the gradient of the step loss (mean of micro-batch losses) with
// respect to one micro-batch's loss.
func (e *Engine) LossScale(microBatches int) G.Value {
	if e.Model.DType == tensor.Float64 {
		return G.NewF64(1 / float64(microBatches))
	}
	return G.NewF32(1 / float32(microBatches))
}

// Step applies the optimizer to the summed gradients; the solver zeroes them.
func (e *Engine) Step(s G.Solver) error {
	if len(e.inflight) != 0 {
		return fmt.Errorf("optimizer step with %d micro-batches still in flight", len(e.inflight))
	}
	return s.Step(G.NodesToValueGrads(e.params))
}

func (e *Engine) machine() G.VM {
	if n := len(e.idle); n > 0 {
		vm := e.idle[n-1]
		e.idle = e.idle[:n-1]
		return vm
	}
	return e.compiled.newMachine()
}

func (e *Engine) oneHot(targets []int) *tensor.Dense {
	c := e.Model.Classes
	t := tensor.New(tensor.Of(e.Model.DType), tensor.WithShape(e.Batch, c))
	switch d := t.Data().(type) {
	case []float32:
		for i, y := range targets {
			d[i*c+y] = 1
		}
	case []float64:
		for i, y := range targets {
			d[i*c+y] = 1
		}
	}
	return t
}

// copyDense copies a value out of a machine's registers, which later instructions of
// the same machine may overwrite in place.
func copyDense(v G.Value) (*tensor.Dense, error) {
	switch t := v.(type) {
	case *tensor.Dense:
		return t.Clone().(*tensor.Dense), nil
	case *G.F32:
		return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{float32(*t)})), nil
	case *G.F64:
		return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{float64(*t)})), nil
	}
	return nil, fmt.Errorf("unexpected value type %T", v)
}
