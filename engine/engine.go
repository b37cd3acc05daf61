package engine

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
)

// Engine computes one stage's slice of a model: layers [First, Last) of the model,
// plus the loss when Last is the model's end. It runs the forward of a micro-batch
// and, any time later, its backward, without recomputing the forward: the stage is
// one compiled gorgonia program whose tape pauses where the upstream gradient enters
// (see pauseOp), and each micro-batch in flight keeps its own tape machine, whose
// registers are that micro-batch's stashed activations.
//
// In fused mode (Backward) the resumed tape computes the input gradient and the
// weight gradients together, summing the latter into the parameters' dual values,
// or, for the weights of products, straight into sums the engine keeps
// (accumulateOp).
// In split mode, for zero-bubble schedules, the resumed tape computes only the input
// gradient (Input) and the gradient of each parameterised part's tap
// (models.Part), which it copies out with each part's input; a second, small
// program built from the parts alone turns those into weight gradients whenever
// the schedule says (Weight). Both modes use gorgonia's symbolic gradients and
// give identical bits.
type Engine struct {
	Model       *models.Model
	First, Last int // layer range [First, Last)
	Batch       int // examples per micro-batch
	Split       bool
	Recompute   bool // see Options

	g      *G.ExprGraph
	x      *G.Node // stage input: data on the first stage, else the upstream activation
	onehot *G.Node // last stage: one-hot targets
	out    *G.Node // activation sent downstream, or the scalar loss on the last stage
	dx     *G.Node // gradient w.r.t. x; nil on the first stage (nobody to send it to)
	params []*G.Node
	logits G.Value // last stage: copied out by a Read node during the forward

	newMachine func() G.VM
	fresh      bool // a layer needs fresh registers every run (models.FreshValues)
	gate       *gate
	idle       []G.VM
	flights    map[int]*flight
	peak       int
	seen       map[uintptr]int64 // HeldBytes' scratch

	// Split mode only.
	reads []G.Value // targets of Read nodes: the parts' inputs, then their taps' gradients
	// phase is the pass in which each Read runs, learnt from the first
	// micro-batch; spare, per Read, the stashes of micro-batches whose
	// weight pass is done, lent back to the Read (lend), which then copies
	// into them instead of allocating a copy.
	phase   []pass
	spare   [][]G.Value
	weights []*weightProgram // one per layer, in order
	// watch hears, during weight passes, how far their sums are complete
	// (WatchGradients); nil: no one listens.
	watch func(first int)
	// grads are the summed gradients the engine owns, in params order:
	// every one in split mode; in fused mode those of the products'
	// weights (linearWeight), nil for the rest, which gorgonia sums into
	// the parameters' dual values.
	grads []*tensor.Dense
	// dual are the parameters gorgonia sums gradients for, into dual values
	// bound to them (fused mode).
	dual []*G.Node

	// draws are the keys the layers' random draws (dropout) read, set
	// before every run: the forward's key for a micro-batch's forward,
	// recomputation and backward alike, so each draws its mask again
	// instead of keeping it. next is the key TrainNext armed for the next
	// Forward; a Forward without one draws nothing (evaluation).
	draws []*models.DrawKey
	next  models.DrawKey
}

// Options choose how an engine keeps what a micro-batch's backward needs;
// the zero value is the fused backward from activations kept since the
// forward.
type Options struct {
	// Split builds the backward as two passes, Input then Weight, for
	// zero-bubble schedules.
	Split bool
	// Recompute keeps only a micro-batch's input (and targets) after its
	// forward, handing its machine back: Recomputation must run the forward
	// again before the backward or input-gradient pass (full activation
	// recomputation, the schedule's RF).
	Recompute bool
	// Selective builds every layer that can (models.RecomputingInternals) to
	// recompute its memory-heavy internals inside its backward instead of
	// keeping them; a range with no such layer is an error.
	Selective bool
}

// flight is one micro-batch between its forward and the end of its backward.
type flight struct {
	vm    G.VM      // paused tape; nil once the input gradient is done (split mode), or until recomputed
	stash []G.Value // split mode, after Input: what Weight needs, in reads' order
	// Recompute mode, from the forward to the recomputation: what the
	// forward ran on.
	input   *tensor.Dense
	targets []int
	// key is what the forward drew its random numbers for (Engine.draws).
	key models.DrawKey
}

// part is one parameterised part of a split engine's layers (models.Part).
type part struct {
	layer  models.Splittable
	index  int // in the layer's Built.Parts
	in     int // its input, among the engine's distinct part inputs
	tap    *G.Node
	params []int // indices into the engine's params
	// linear is the index in params of the weight the part multiplies
	// by (linearWeight), or -1; transposed, by its transpose.
	linear     int
	transposed bool
}

// NewEngine builds and compiles the stage programs once; nothing is rebuilt per step.
func NewEngine(m *models.Model, first, last, batch int, seed uint64, o Options) (e *Engine, err error) {
	if first < 0 || last > len(m.Layers) || first >= last {
		return nil, fmt.Errorf("layer range [%d, %d) is not within the model's %d layers", first, last, len(m.Layers))
	}
	// Graph construction in gorgonia panics on some shape errors; report them as errors.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("building layers [%d, %d): %v", first, last, r)
		}
	}()
	split := o.Split
	e = &Engine{Model: m, First: first, Last: last, Batch: batch, Split: split, Recompute: o.Recompute, g: G.NewGraph(), gate: &gate{}, flights: map[int]*flight{}}
	layers, err := layersFor(m.Layers[first:last], o.Selective)
	if err != nil {
		return nil, fmt.Errorf("layers [%d, %d): %w", first, last, err)
	}
	inShape := m.ShapeAt(first, batch)
	e.x = G.NewTensor(e.g, m.DType, len(inShape), G.WithShape(inShape...), G.WithName("input"))
	h := e.x
	var parts []part
	var ins []*G.Node // the parts' distinct inputs, each kept once
	var linear []linearWeight
	for _, l := range layers {
		sl, ok := l.(models.Splittable)
		if split && !ok {
			return nil, fmt.Errorf("layer %s cannot split its backward into input and weight gradients, which zero-bubble schedules need", l.Name())
		}
		if _, ok := l.(models.FreshValues); ok {
			e.fresh = true
		}
		b, err := l.Build(e.g, h, seed)
		if err != nil {
			return nil, err
		}
		if split {
			if parts, ins, err = addParts(parts, ins, sl, b, len(e.params)); err != nil {
				return nil, err
			}
		}
		linear = append(linear, linearWeightsOf(l, b, len(e.params))...)
		h = b.Out
		e.params = append(e.params, b.Params...)
		if b.Draws != nil {
			e.draws = append(e.draws, b.Draws)
		}
	}
	isLinear, dual := e.makeSums(linear, parts)
	e.dual = dual
	e.out = h
	var keep G.Nodes // what a split program must compute besides the gradients
	if e.IsLast() {
		e.onehot = G.NewMatrix(e.g, m.DType, G.WithShape(batch*m.Targets(), m.Classes), G.WithName("targets"))
		keep = append(keep, G.Read(h, &e.logits))
		if e.out, err = models.SoftmaxCrossEntropy(h, e.onehot); err != nil {
			return nil, fmt.Errorf("loss: %w", err)
		}
	}
	upstream, err := G.ApplyOp(newPause(e.gate), e.out)
	if err != nil {
		return nil, fmt.Errorf("adding the backward pause: %w", err)
	}
	var wrt []*G.Node
	var taps []*G.Node // fused mode: the products' taps, each once
	if split {
		for _, p := range parts {
			wrt = append(wrt, p.tap)
		}
	} else {
		for _, lw := range linear {
			if !slices.Contains(taps, lw.tap) {
				taps = append(taps, lw.tap)
			}
		}
		wrt = append(append(wrt, dual...), taps...)
	}
	wrt = append(wrt, e.x)
	if e.IsFirst() {
		wrt = wrt[:len(wrt)-1]
	}
	grads, err := G.Backpropagate(G.Nodes{e.out}, G.Nodes{upstream}, wrt)
	if err != nil {
		return nil, fmt.Errorf("differentiating layers [%d, %d): %w", first, last, err)
	}
	if !e.IsFirst() {
		e.dx = grads[len(grads)-1]
	}
	if split {
		e.reads = make([]G.Value, len(ins)+len(parts))
		e.phase, e.spare = make([]pass, len(e.reads)), make([][]G.Value, len(e.reads))
		for i, in := range ins {
			keep = append(keep, G.Read(in, &e.reads[i]))
		}
		for i := range parts {
			keep = append(keep, G.Read(grads[i], &e.reads[len(ins)+i]))
		}
		if e.weights, err = newWeightPrograms(ins, parts, e.params, e.grads, isLinear); err != nil {
			return nil, err
		}
		for _, w := range e.weights {
			w.rearm = e.rearm
		}
	}
	// The derivative of a matmul has nodes for both operands whatever was asked
	// for, so the program is compiled from its outputs back: a whole-graph
	// compile would compute the weight gradients in a split program's input
	// pass, and the first stage's gradient with respect to its data, which
	// nothing reads (as many multiply-adds as its first layer's forward).
	outputs := append(G.Nodes{e.out}, keep...)
	if !split {
		outputs = append(outputs, grads[:len(dual)]...)
		for _, lw := range linear {
			acc, err := lw.accumulate(lw.in, grads[len(dual)+slices.Index(taps, lw.tap)], e.grads[lw.param])
			if err != nil {
				return nil, fmt.Errorf("summing the gradient of %s: %w", e.params[lw.param].Name(), err)
			}
			outputs = append(outputs, acc)
		}
	}
	if e.dx != nil {
		outputs = append(outputs, e.dx)
	}
	inputs := append(G.Nodes{e.x}, e.params...)
	if e.onehot != nil {
		inputs = append(inputs, e.onehot)
	}
	prog, locMap, err := G.CompileFunction(e.g, inputs, outputs)
	if err != nil {
		return nil, fmt.Errorf("compiling layers [%d, %d): %w", first, last, err)
	}
	if split {
		e.newMachine = func() G.VM { return G.NewTapeMachine(e.g, G.WithPrecompiled(prog, locMap), G.WithEngine(fast)) }
	} else {
		e.newMachine = func() G.VM {
			return G.NewTapeMachine(e.g, G.WithPrecompiled(prog, locMap), G.BindDualValues(dual...), G.WithEngine(fast))
		}
	}
	e.useFast()
	return e, nil
}

// makeSums decides who sums each parameter's gradient: every weight of a
// product by an accumulation into a sum of the engine's (accumulateOp),
// the rest by gorgonia, into the parameters' dual values (dual, fused
// mode) or by the weight program into sums of the engine's (split mode).
// It marks each part's product weight.
func (e *Engine) makeSums(linear []linearWeight, parts []part) (isLinear []bool, dual []*G.Node) {
	isLinear = make([]bool, len(e.params))
	for _, lw := range linear {
		isLinear[lw.param] = true
	}
	for i := range parts {
		parts[i].linear = -1
		for _, lw := range linear {
			if lw.tap == parts[i].tap {
				parts[i].linear, parts[i].transposed = slices.Index(parts[i].params, lw.param), lw.transposed
			}
		}
	}
	e.grads = make([]*tensor.Dense, len(e.params))
	for i, p := range e.params {
		if e.Split || isLinear[i] {
			e.grads[i] = tensor.New(tensor.Of(e.Model.DType), tensor.WithShape(p.Shape()...))
			continue
		}
		dual = append(dual, p)
	}
	return isLinear, dual
}

// layersFor is layers as the engine builds them: with selective, every
// layer that can recompute its internals does.
func layersFor(layers []models.Layer, selective bool) ([]models.Layer, error) {
	if !selective {
		return layers, nil
	}
	out, n := make([]models.Layer, len(layers)), 0
	for i, l := range layers {
		out[i] = l
		if r, ok := l.(models.RecomputingInternals); ok {
			out[i], n = r.RecomputingInternals(), n+1
		}
	}
	if n == 0 {
		return nil, errors.New("selective recomputation recomputes attention's internals, and none of these layers has any (use full, or none)")
	}
	return out, nil
}

// IsFirst reports whether the stage reads data (it computes no input gradient).
func (e *Engine) IsFirst() bool { return e.First == 0 }

// IsLast reports whether the stage computes the loss.
func (e *Engine) IsLast() bool { return e.Last == len(e.Model.Layers) }

// Layers are the model stages [First, Last) the engine computes.
func (e *Engine) Layers() (first, last int) { return e.First, e.Last }

// InShape and OutShape are the shapes of one micro-batch entering and leaving the stage.
func (e *Engine) InShape() tensor.Shape  { return e.x.Shape().Clone() }
func (e *Engine) OutShape() tensor.Shape { return e.Model.ShapeAt(e.Last, e.Batch) }

// Params returns the stage's parameter nodes in a stable order (layer order, then
// weight before bias); the order fixes optimizer state and checkpoint layout.
func (e *Engine) Params() []*G.Node { return e.params }

// InFlight is how many micro-batches hold stashed activations (forward done,
// backward not finished); PeakInFlight the most at once since the engine was made.
func (e *Engine) InFlight() int     { return len(e.flights) }
func (e *Engine) PeakInFlight() int { return e.peak }

// Forward runs micro-batch key's forward on input. On the last stage targets holds
// the class of each example and the result is the scalar loss, as a tensor of shape
// (1); elsewhere it is the activation to send downstream. The result is the caller's.
func (e *Engine) Forward(key int, input *tensor.Dense, targets []int) (*tensor.Dense, error) {
	if _, busy := e.flights[key]; busy {
		return nil, fmt.Errorf("micro-batch %d: forward run twice before its backward", key)
	}
	tensor.WithEngine(fast)(input)
	if err := G.Let(e.x, input); err != nil {
		return nil, fmt.Errorf("micro-batch %d input: %w", key, err)
	}
	if !e.Recompute { // else its copies are dropped: the recomputation makes them
		e.lend(forwardPass)
	}
	if e.IsLast() {
		onehot, err := e.oneHot(targets)
		if err == nil {
			err = G.Let(e.onehot, onehot)
		}
		if err != nil {
			return nil, fmt.Errorf("micro-batch %d targets: %w", key, err)
		}
	}
	draw := e.next
	e.next = models.DrawKey{}
	e.setDraws(draw)
	vm, err := e.runForward()
	if err != nil {
		return nil, fmt.Errorf("micro-batch %d forward: %w", key, err)
	}
	f := &flight{vm: vm, key: draw}
	e.flights[key] = f
	e.peak = max(e.peak, len(e.flights))
	if !e.Recompute {
		e.harvest(f, forwardPass)
		return copyDense(e.out.Value())
	}
	// Keep what the forward ran on, not what it made: the machine goes
	// back to the pool until Recomputation.
	defer func() {
		clear(e.reads)
		e.release(vm)
	}()
	f.vm, f.input, f.targets = nil, input, slices.Clone(targets)
	return copyDense(e.out.Value())
}

// TrainNext says that the next Forward is a training one, of the step's
// micro-batch microBatch, numbered in the step's global batch as the
// one-process reference numbers it: the key of the forward's random draws
// (dropout), which its recomputation and backward draw again. It holds for
// that one Forward; a Forward not announced draws nothing, as evaluation
// wants (compute.Drawing).
func (e *Engine) TrainNext(step, microBatch int) {
	e.next = models.DrawKey{Train: true, Step: step, MicroBatch: microBatch}
}

// setDraws sets the key every layer's draws read in the next run.
func (e *Engine) setDraws(k models.DrawKey) {
	for _, d := range e.draws {
		*d = k
	}
}

// runForward runs the bound input through a machine to the backward pause.
func (e *Engine) runForward() (G.VM, error) {
	vm := e.machine()
	e.gate.open, e.gate.hit = false, false
	err := vm.RunAll()
	if err == nil || !e.gate.hit {
		e.release(vm)
		if err == nil {
			err = errors.New("program finished without reaching the backward pause")
		}
		return nil, err
	}
	return vm, nil
}

// Recomputation (Recompute mode) runs micro-batch key's forward again, from
// the input and targets its forward kept, so that its backward or
// input-gradient pass can follow: the same program on the same values and
// weights, so the same bits as the forward that was not kept.
func (e *Engine) Recomputation(key int) error {
	f, ok := e.flights[key]
	switch {
	case !e.Recompute:
		return fmt.Errorf("micro-batch %d: recomputation in an engine that keeps its activations", key)
	case !ok || f.input == nil:
		return fmt.Errorf("micro-batch %d: recomputation without a forward, or twice", key)
	}
	if err := G.Let(e.x, f.input); err != nil {
		return fmt.Errorf("micro-batch %d input: %w", key, err)
	}
	e.lend(forwardPass)
	if e.IsLast() {
		onehot, err := e.oneHot(f.targets)
		if err == nil {
			err = G.Let(e.onehot, onehot)
		}
		if err != nil {
			return fmt.Errorf("micro-batch %d targets: %w", key, err)
		}
	}
	e.setDraws(f.key)
	vm, err := e.runForward()
	if err != nil {
		return fmt.Errorf("micro-batch %d recomputation: %w", key, err)
	}
	f.vm, f.input, f.targets = vm, nil, nil
	e.harvest(f, forwardPass)
	return nil
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
func (e *Engine) Backward(key int, grad *tensor.Dense) (*tensor.Dense, error) {
	if e.Split {
		dx, err := e.Input(key, grad)
		if err != nil {
			return nil, err
		}
		return dx, e.Weight(key)
	}
	f, ok := e.flights[key]
	if !ok {
		return nil, fmt.Errorf("micro-batch %d: backward without a forward", key)
	}
	if f.vm == nil {
		return nil, fmt.Errorf("micro-batch %d: backward before its recomputation", key)
	}
	delete(e.flights, key)
	defer e.release(f.vm)
	e.setDraws(f.key)
	return e.resume(key, f.vm, grad)
}

// Input (split mode) resumes micro-batch key's machine to compute only the gradient
// w.r.t. the stage input, keeping what Weight needs.
func (e *Engine) Input(key int, grad *tensor.Dense) (*tensor.Dense, error) {
	f, ok := e.flights[key]
	if ok && f.input != nil {
		return nil, fmt.Errorf("micro-batch %d: input gradient before its recomputation", key)
	}
	if !ok || f.vm == nil {
		return nil, fmt.Errorf("micro-batch %d: input gradient without a forward, or twice", key)
	}
	if !e.Split {
		return nil, errors.New("input gradient alone needs an engine built for split backward")
	}
	vm := f.vm
	f.vm = nil
	defer e.release(vm)
	e.lend(inputPass)
	e.setDraws(f.key)
	dx, err := e.resume(key, vm, grad)
	if err != nil {
		delete(e.flights, key)
		return nil, err
	}
	e.harvest(f, inputPass)
	return dx, nil
}

// Weight (split mode) computes micro-batch key's weight gradients from what Input
// kept, adds them to the summed gradients and releases the micro-batch.
func (e *Engine) Weight(key int) error {
	f, ok := e.flights[key]
	if !ok || f.vm != nil || f.input != nil {
		return fmt.Errorf("micro-batch %d: weight gradient before its input gradient", key)
	}
	delete(e.flights, key)
	for i := len(e.weights) - 1; i >= 0; i-- {
		w := e.weights[i]
		if err := w.run(f.stash, e.grads); err != nil {
			return err
		}
		if e.watch != nil {
			e.watch(w.first)
		}
	}
	for i, v := range f.stash {
		if v != nil {
			e.spare[i] = append(e.spare[i], v)
		}
	}
	return nil
}

// WatchGradients (compute.GradientWatcher) has each weight pass report to
// f, after each layer's weight gradients, the first weight from which on
// every sum holds the micro-batch's gradient; layers go last first. Only a
// split engine runs weight passes: a fused one reports nothing. nil stops
// the reports.
func (e *Engine) WatchGradients(f func(first int)) { e.watch = f }

func (e *Engine) resume(key int, vm G.VM, grad *tensor.Dense) (*tensor.Dense, error) {
	if grad == nil {
		return nil, fmt.Errorf("micro-batch %d backward: no output gradient", key)
	}
	e.gate.open, e.gate.grad, e.gate.taken = true, gradValue(grad), false
	err := vm.RunAll()
	e.gate.open, e.gate.grad = false, nil
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

// pass is a run of a split engine's stage program in which a Read copies
// out what the weight pass needs.
type pass int8

const (
	unknownPass pass = iota
	forwardPass      // Forward or Recomputation: up to the pause
	inputPass        // Input: from the pause on
)

// harvest moves what the Read nodes copied during the last run, pass p,
// into f's stash: the Read targets are shared by all machines, so they are
// emptied after each run. A part's input may be copied in the forward or in
// the input pass, wherever the tape placed its Read; its tap's gradient, in
// the input pass.
func (e *Engine) harvest(f *flight, p pass) {
	if !e.Split {
		return
	}
	if f.stash == nil {
		f.stash = make([]G.Value, len(e.reads))
	}
	for i, v := range e.reads {
		if v != nil {
			if e.phase[i] == unknownPass {
				e.phase[i] = p
			}
			f.stash[i], e.reads[i] = v, nil
		}
	}
}

// lend hands the Reads of pass p spare stashes to copy into. A Read whose
// pass is not yet known gets none: a buffer lent to a Read that does not
// run in the pass would be harvested unwritten.
func (e *Engine) lend(p pass) {
	for i := range e.reads {
		if n := len(e.spare[i]); e.reads[i] == nil && e.phase[i] == p && n > 0 {
			e.reads[i], e.spare[i] = e.spare[i][n-1], e.spare[i][:n-1]
		}
	}
}

// addParts appends layer l's parts, built as b with its parameters starting
// at params in the engine's list, to parts, and their inputs not yet in ins
// to ins: parts sharing an input (a block's q, k and v projections) keep it
// once per micro-batch. Every parameter must be in exactly one part, or its
// weight gradient would be computed twice or never.
func addParts(parts []part, ins []*G.Node, l models.Splittable, b models.Built, params int) ([]part, []*G.Node, error) {
	index := make(map[*G.Node]int, len(b.Params))
	for i, p := range b.Params {
		index[p] = params + i
	}
	owned := make(map[*G.Node]bool, len(b.Params))
	for i, bp := range b.Parts {
		if bp.In == nil || bp.Tap == nil {
			return nil, nil, fmt.Errorf("layer %s: part %d has no input or no tap", l.Name(), i)
		}
		p := part{layer: l, index: i, in: slices.Index(ins, bp.In), tap: bp.Tap}
		if p.in < 0 {
			p.in, ins = len(ins), append(ins, bp.In)
		}
		for _, n := range bp.Params {
			k, ok := index[n]
			if !ok || owned[n] {
				return nil, nil, fmt.Errorf("layer %s: part %d's parameter %s is not the layer's, or in two parts", l.Name(), i, n.Name())
			}
			owned[n] = true
			p.params = append(p.params, k)
		}
		parts = append(parts, p)
	}
	for _, n := range b.Params {
		if !owned[n] {
			return nil, nil, fmt.Errorf("layer %s: parameter %s is in none of its parts", l.Name(), n.Name())
		}
	}
	return parts, ins, nil
}

// useFast gives the parameters, and their summed gradients once they
// exist, the vectorised engine (fastEngine): the gradients are summed into
// in place, micro-batch after micro-batch.
func (e *Engine) useFast() {
	for _, p := range e.params {
		if d, ok := p.Value().(*tensor.Dense); ok {
			tensor.WithEngine(fast)(d)
		}
		if g, ok := e.gradOf(p); ok {
			if d, ok := g.(*tensor.Dense); ok {
				tensor.WithEngine(fast)(d)
			}
		}
	}
	for _, g := range e.grads {
		if g != nil {
			tensor.WithEngine(fast)(g)
		}
	}
}

// gradOf is the gradient value gorgonia keeps for n, if it keeps one: a
// dual value's, or n's derivative node's. It asks Node.Grad only then,
// because for any other node Node.Grad builds an error with a stack trace,
// too dear for HeldBytes and Unshare, which run after every action.
func (e *Engine) gradOf(n *G.Node) (G.Value, bool) {
	if n.Deriv() == nil && !slices.Contains(e.dual, n) {
		return nil, false
	}
	g, err := n.Grad()
	return g, err == nil
}

// Discard drops micro-batch key's stashed forward (evaluation: no backward follows).
func (e *Engine) Discard(key int) {
	if f, ok := e.flights[key]; ok {
		delete(e.flights, key)
		if f.vm != nil {
			e.release(f.vm)
		}
	}
}

// LossScale is the gradient of the step loss (mean of micro-batch losses) with
// respect to one micro-batch's loss: a tensor of no dimensions, which the last
// stage's Backward and Input take as its output gradient.
func (e *Engine) LossScale(microBatches int) *tensor.Dense {
	if e.Model.DType == tensor.Float64 {
		return tensor.New(tensor.FromScalar(1 / float64(microBatches)))
	}
	return tensor.New(tensor.FromScalar(1 / float32(microBatches)))
}

// gradValue is an output gradient as the pause op hands it to the graph: a
// tensor of no dimensions (the loss's) as the scalar value gorgonia's ops
// take for one, any other tensor as it is.
func gradValue(grad *tensor.Dense) G.Value {
	if !grad.IsScalar() {
		return grad
	}
	switch v := grad.ScalarValue().(type) {
	case float32:
		return G.NewF32(v)
	case float64:
		return G.NewF64(v)
	}
	return grad
}

// Step applies the optimizer to the summed gradients and zeroes them.
func (e *Engine) Step(o *optim.Optimizer) error {
	if len(e.flights) != 0 {
		return fmt.Errorf("optimizer step with %d micro-batches still in flight", len(e.flights))
	}
	grads, err := e.Gradients()
	if err != nil {
		return err
	}
	params, sums := make([]*tensor.Dense, len(e.params)), make([]*tensor.Dense, len(e.params))
	for i, p := range e.params {
		params[i], sums[i] = p.Value().(*tensor.Dense), grads[i].Value
	}
	if err := o.Step(params, sums); err != nil {
		return err
	}
	e.useFast() // the gradients exist from the first step on
	return nil
}

// NewOptimizer makes the optimizer spec describes for this engine's parameters.
func (e *Engine) NewOptimizer(spec optim.Spec) (*optim.Optimizer, error) {
	shapes, names := make([]tensor.Shape, len(e.params)), make([]string, len(e.params))
	for i, p := range e.params {
		shapes[i], names[i] = p.Shape().Clone(), p.Name()
	}
	return optim.NewNamed(spec, e.Model.DType, names, shapes)
}

func (e *Engine) machine() G.VM {
	if n := len(e.idle); n > 0 {
		vm := e.idle[n-1]
		e.idle = e.idle[:n-1]
		return vm
	}
	return e.newMachine()
}

func (e *Engine) release(vm G.VM) {
	e.rearm(vm)
	e.idle = append(e.idle, vm)
}

// rearm readies a machine for its next run, keeping its registers unless a
// layer needs fresh ones.
func (e *Engine) rearm(vm G.VM) {
	if e.fresh {
		vm.Reset()
	} else {
		rewind(vm)
	}
}

// rewind readies a finished machine for its next run. gorgonia's Reset also
// drops every register's value, so the next run allocates all its intermediate
// tensors again; keeping them lets the tape's alloc instructions and
// preallocating ops reuse last run's memory. Nothing outside the machine keeps a
// register's value: outputs are copied out (copyDense) and Read nodes clone.
// The program counter is unexported, hence reflection; without it (another
// gorgonia), Reset.
func rewind(vm G.VM) {
	v := reflect.ValueOf(vm)
	if v.Kind() == reflect.Pointer && v.Elem().Kind() == reflect.Struct {
		if pc := v.Elem().FieldByName("pc"); pc.IsValid() && pc.Kind() == reflect.Int && pc.CanAddr() {
			reflect.NewAt(pc.Type(), unsafe.Pointer(pc.UnsafeAddr())).Elem().SetInt(0)
			return
		}
	}
	vm.Reset()
}

// oneHot refuses a target outside [0, classes) or a target count unlike the
// batch's, which would write into another row's classes (corrupting its
// target) or past the last; the data checks should have caught it first.
func (e *Engine) oneHot(targets []int) (*tensor.Dense, error) {
	c, rows := e.Model.Classes, e.Batch*e.Model.Targets()
	if len(targets) != rows {
		return nil, fmt.Errorf("%d targets for %d rows", len(targets), rows)
	}
	for i, y := range targets {
		if y < 0 || y >= c {
			return nil, fmt.Errorf("target %d of row %d is not in [0, %d), the model's classes", y, i, c)
		}
	}
	t := tensor.New(tensor.Of(e.Model.DType), tensor.WithShape(rows, c))
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
	return t, nil
}

// copyDense copies a value out of a machine's registers, which later instructions of
// the same machine may overwrite in place. Scalars become shape (1).
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

// Float64s is a float32 or float64 tensor's values as float64s (the tensor's
// own slice when it is float64).
func Float64s(t *tensor.Dense) []float64 {
	switch d := t.Data().(type) {
	case []float64:
		return d
	case []float32:
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out
	}
	return nil
}
