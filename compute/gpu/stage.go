package gpu

import (
	"errors"
	"fmt"
	"math"
	"slices"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
)

// dense is a models.Dense on the device: y = act(x·W + b), W [in, out].
type dense struct {
	in, out int
	act     Act
	w, b    int // indices of W and b in the stage's params
}

// Stage is a chunk computed on a Backend: its weights, their summed
// gradients, its optimizer's state and every in-flight micro-batch's
// activations stay in device memory; only a micro-batch's input, output
// and gradients cross to the host, and the weights, gradients and
// optimizer state when the runtime asks for them (checkpoints, all-reduce,
// clipping).
type Stage struct {
	be                 Backend
	model              *models.Model
	first, last, batch int
	split, recompute   bool
	layers             []dense

	names     []string
	shapes    []tensor.Shape
	params    []Buffer
	grads     []Buffer
	hostW     []*tensor.Dense // Weights' host copies
	hostG     []*tensor.Dense // Gradients' host copies
	optimizer optim.Spec
	slots     map[string][]Buffer // the optimizer's state, by optim's slot names

	flights map[int]*flight
	peak    int
	free    map[int][]Buffer // buffers given back, by length, for the next micro-batch
	logits  Buffer           // a copy of the last forward's logits (last chunk)
	fault   error            // a failed copy in a method that returns no error
}

// flight is one micro-batch on the device between its forward and its
// backward.
type flight struct {
	x       Buffer   // the chunk's input
	targets Buffer   // last chunk: each row's class
	z, y    []Buffer // each layer's product plus bias and its activation (y[i] == z[i] without one); nil until recomputed
	probs   Buffer   // last chunk: the softmax of the logits
	// dz is each layer's gradient of z after the input-gradient pass
	// (split backward), which the weight pass reads.
	dz []Buffer
}

// NewStage builds the chunk s describes on be, with the weights the cpu
// engine starts from: each layer's Build, the one place initial values
// are made, run on a graph of its own.
func NewStage(be Backend, s compute.Spec) (*Stage, error) {
	m := s.Model
	if s.First < 0 || s.Last > len(m.Layers) || s.First >= s.Last {
		return nil, fmt.Errorf("layer range [%d, %d) is not within the model's %d layers", s.First, s.Last, len(m.Layers))
	}
	if m.DType != tensor.Float32 {
		return nil, fmt.Errorf("%s: model.dtype %v: the device computes float32", be.Name(), m.DType)
	}
	if s.Options.Selective {
		return nil, fmt.Errorf("%s: layers [%d, %d) have no internals to recompute selectively", be.Name(), s.First, s.Last)
	}
	st := &Stage{be: be, model: m, first: s.First, last: s.Last, batch: s.Batch, split: s.Options.Split, recompute: s.Options.Recompute,
		flights: map[int]*flight{}, free: map[int][]Buffer{}}
	values, err := st.initialWeights(s.Seed)
	if err != nil {
		return nil, err
	}
	for i, v := range values {
		p, err := st.upload(v.Data().([]float32))
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("%s: weight %s: %w", be.Name(), st.names[i], err)
		}
		g, err := st.zeros(v.Size())
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("%s: gradient of %s: %w", be.Name(), st.names[i], err)
		}
		st.params, st.grads = append(st.params, p), append(st.grads, g)
		st.hostW = append(st.hostW, tensor.New(tensor.WithShape(v.Shape().Clone()...), tensor.Of(tensor.Float32)))
		st.hostG = append(st.hostG, tensor.New(tensor.WithShape(v.Shape().Clone()...), tensor.Of(tensor.Float32)))
	}
	return st, nil
}

// initialWeights reads the chunk's layers, refusing any the device has no
// kernels for, and returns their initial values in the engine's order.
func (st *Stage) initialWeights(seed uint64) (values []*tensor.Dense, err error) {
	m := st.model
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("building layers [%d, %d): %v", st.first, st.last, r)
		}
	}()
	g := G.NewGraph()
	in := m.ShapeAt(st.first, st.batch)
	h := G.NewTensor(g, m.DType, len(in), G.WithShape(in...), G.WithName("input"))
	for _, l := range m.Layers[st.first:st.last] {
		d, ok := l.(*models.Dense)
		if !ok {
			return nil, fmt.Errorf("%s: layer %s (%T) has no device kernels; the device runs Dense layers (model mlp)", st.be.Name(), l.Name(), l)
		}
		b, err := l.Build(g, h, seed)
		if err != nil {
			return nil, err
		}
		if len(b.Params) != 2 {
			return nil, fmt.Errorf("%s: layer %s has %d parameters, want a weight and a bias", st.be.Name(), l.Name(), len(b.Params))
		}
		st.layers = append(st.layers, dense{in: d.In, out: d.Out, act: Act(d.Act), w: len(st.names), b: len(st.names) + 1})
		for _, p := range b.Params {
			st.names = append(st.names, p.Name())
			st.shapes = append(st.shapes, p.Shape().Clone())
			values = append(values, p.Value().(*tensor.Dense))
		}
		h = b.Out
	}
	return values, nil
}

// Close gives back the stage's device memory.
func (st *Stage) Close() {
	for k := range st.flights {
		st.Discard(k)
	}
	for _, bs := range [][]Buffer{st.params, st.grads} {
		for _, b := range bs {
			st.be.Free(b)
		}
	}
	for _, bs := range st.slots {
		for _, b := range bs {
			st.be.Free(b)
		}
	}
	for _, bs := range st.free {
		for _, b := range bs {
			st.be.Free(b)
		}
	}
	if st.logits != nil {
		st.be.Free(st.logits)
	}
	st.params, st.grads, st.slots, st.free, st.logits = nil, nil, nil, map[int][]Buffer{}, nil
}

func (st *Stage) IsFirst() bool             { return st.first == 0 }
func (st *Stage) IsLast() bool              { return st.last == len(st.model.Layers) }
func (st *Stage) Layers() (first, last int) { return st.first, st.last }
func (st *Stage) InShape() tensor.Shape     { return st.model.ShapeAt(st.first, st.batch) }
func (st *Stage) InFlight() int             { return len(st.flights) }
func (st *Stage) PeakInFlight() int         { return st.peak }
func (st *Stage) Unshare([]byte) bool       { return true } // inputs are copied to the device at once
func (st *Stage) LossScale(mbs int) *tensor.Dense {
	return tensor.New(tensor.FromScalar(1 / float32(mbs)))
}

// rows is the rows of a micro-batch's matrices: examples times the rows
// each yields (1 for a classifier).
func (st *Stage) rows() int { return st.batch * st.model.Targets() }

// get is a device buffer of n values, one given back if there is one.
func (st *Stage) get(n int) (Buffer, error) {
	if bs := st.free[n]; len(bs) > 0 {
		b := bs[len(bs)-1]
		st.free[n] = bs[:len(bs)-1]
		return b, nil
	}
	return st.be.Alloc(n)
}

// put gives b back for a later micro-batch; nil is ignored.
func (st *Stage) put(bs ...Buffer) {
	for _, b := range bs {
		if b != nil {
			st.free[b.Len()] = append(st.free[b.Len()], b)
		}
	}
}

func (st *Stage) upload(v []float32) (Buffer, error) {
	b, err := st.get(len(v))
	if err == nil {
		if err = st.be.Upload(b, v); err != nil {
			st.put(b)
		}
	}
	return b, err
}

func (st *Stage) zeros(n int) (Buffer, error) {
	b, err := st.get(n)
	if err == nil {
		if err = st.be.Fill(b, 0); err != nil {
			st.put(b)
		}
	}
	return b, err
}

// download copies b into a new host tensor of the given shape.
func (st *Stage) download(b Buffer, shape ...int) (*tensor.Dense, error) {
	out := tensor.New(tensor.WithShape(shape...), tensor.Of(tensor.Float32))
	return out, st.be.Download(out.Data().([]float32), b)
}

// Forward copies micro-batch mb's input (and targets) to the device and
// runs the chunk's layers; the loss or the output activation comes back.
func (st *Stage) Forward(mb int, in *tensor.Dense, targets []int) (*tensor.Dense, error) {
	if st.fault != nil {
		return nil, st.fault
	}
	if _, busy := st.flights[mb]; busy {
		return nil, fmt.Errorf("micro-batch %d: forward run twice before its backward", mb)
	}
	x, ok := in.Data().([]float32)
	if want := st.InShape(); !ok || in.Size() != want.TotalSize() {
		return nil, fmt.Errorf("micro-batch %d input: %v %v, want float32 %v", mb, in.Dtype(), in.Shape(), want)
	}
	f := &flight{}
	var err error
	if f.x, err = st.upload(x); err != nil {
		return nil, fmt.Errorf("micro-batch %d input: %w", mb, err)
	}
	if st.IsLast() {
		if f.targets, err = st.uploadTargets(targets); err != nil {
			st.put(f.x)
			return nil, fmt.Errorf("micro-batch %d targets: %w", mb, err)
		}
	}
	st.flights[mb] = f
	st.peak = max(st.peak, len(st.flights))
	out, err := st.forward(f)
	if err != nil {
		st.Discard(mb)
		return nil, fmt.Errorf("micro-batch %d forward: %w", mb, err)
	}
	if st.recompute { // keep what the forward ran on, not what it made
		st.dropActivations(f)
	}
	return out, nil
}

// uploadTargets checks the classes as the engine's one-hot does and copies
// them to the device as float32s (exact below 2^24 classes).
func (st *Stage) uploadTargets(targets []int) (Buffer, error) {
	c, rows := st.model.Classes, st.rows()
	if len(targets) != rows {
		return nil, fmt.Errorf("%d targets for %d rows", len(targets), rows)
	}
	t := make([]float32, rows)
	for i, y := range targets {
		if y < 0 || y >= c {
			return nil, fmt.Errorf("target %d of row %d is not in [0, %d), the model's classes", y, i, c)
		}
		t[i] = float32(y)
	}
	return st.upload(t)
}

// forward runs the layers on f.x, keeping each layer's z and y in f, and
// returns the loss (last chunk) or the output activation in host memory.
func (st *Stage) forward(f *flight) (*tensor.Dense, error) {
	rows, x := st.rows(), f.x
	for _, l := range st.layers {
		z, err := st.get(rows * l.out)
		if err != nil {
			return nil, err
		}
		f.z = append(f.z, z)
		if err := st.be.Gemm(false, false, rows, l.out, l.in, 1, x, st.params[l.w], 0, z); err != nil {
			return nil, err
		}
		if err := st.be.AddBias(z, st.params[l.b], rows, l.out); err != nil {
			return nil, err
		}
		y := z
		if l.act != "" {
			if y, err = st.get(rows * l.out); err != nil {
				return nil, err
			}
			if err := st.be.Activate(l.act, y, z); err != nil {
				st.put(y)
				return nil, err
			}
		}
		f.y = append(f.y, y)
		x = y
	}
	if !st.IsLast() {
		return st.download(x, st.model.ShapeAt(st.last, st.batch)...)
	}
	return st.loss(f, x)
}

// loss is the mean softmax cross-entropy of the logits over the rows, and
// keeps a copy of the logits for Logits.
func (st *Stage) loss(f *flight, logits Buffer) (*tensor.Dense, error) {
	rows, c := st.rows(), st.model.Classes
	var err error
	if f.probs, err = st.get(rows * c); err != nil {
		return nil, err
	}
	rowLoss, err := st.get(rows)
	if err != nil {
		return nil, err
	}
	defer st.put(rowLoss)
	if err := st.be.Xent(rowLoss, f.probs, logits, f.targets, rows, c); err != nil {
		return nil, err
	}
	if st.logits == nil {
		if st.logits, err = st.be.Alloc(rows * c); err != nil {
			return nil, err
		}
	}
	if err := st.be.Copy(st.logits, logits); err != nil {
		return nil, err
	}
	losses := make([]float32, rows)
	if err := st.be.Download(losses, rowLoss); err != nil {
		return nil, err
	}
	var total float32 // in the engine's order and precision (models.xentLoss)
	for _, l := range losses {
		total += l
	}
	return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{total / float32(rows)})), nil
}

// dropActivations gives back what the forward made, keeping its input and
// targets for the recomputation.
func (st *Stage) dropActivations(f *flight) {
	for i, z := range f.z {
		if i < len(f.y) && f.y[i] != z { // a failed forward may stop between the two
			st.put(f.y[i])
		}
		st.put(z)
	}
	st.put(f.probs)
	f.z, f.y, f.probs = nil, nil, nil
}

// Recomputation runs mb's forward again from the input it kept.
func (st *Stage) Recomputation(mb int) error {
	f, ok := st.flights[mb]
	switch {
	case !st.recompute:
		return fmt.Errorf("micro-batch %d: recomputation in a stage that keeps its activations", mb)
	case !ok || f.z != nil:
		return fmt.Errorf("micro-batch %d: recomputation without a forward, or twice", mb)
	}
	if _, err := st.forward(f); err != nil {
		return fmt.Errorf("micro-batch %d recomputation: %w", mb, err)
	}
	return nil
}

// Logits copies the last forward's logits to the host.
func (st *Stage) Logits() (*tensor.Dense, error) {
	if st.logits == nil {
		return nil, errors.New("no logits: not the last stage, or no forward has run")
	}
	return st.download(st.logits, st.rows(), st.model.Classes)
}

// Backward is the input-gradient pass and the weight pass at once.
func (st *Stage) Backward(mb int, grad *tensor.Dense) (*tensor.Dense, error) {
	dx, err := st.input(mb, grad, !st.split)
	if err != nil || st.split {
		if err == nil {
			err = st.Weight(mb)
		}
		return dx, err
	}
	st.release(mb)
	return dx, nil
}

// Input is the input-gradient pass of a split backward.
func (st *Stage) Input(mb int, grad *tensor.Dense) (*tensor.Dense, error) {
	if !st.split {
		return nil, errors.New("input gradient alone needs a stage built for split backward")
	}
	return st.input(mb, grad, false)
}

// input runs mb's backward from its output gradient, layer by layer down,
// adding each layer's weight gradients when weights is set and otherwise
// keeping each layer's dz for Weight; it returns the input gradient on
// the host (nil on the first chunk).
func (st *Stage) input(mb int, grad *tensor.Dense, weights bool) (*tensor.Dense, error) {
	f, ok := st.flights[mb]
	switch {
	case !ok || f.dz != nil:
		return nil, fmt.Errorf("micro-batch %d: backward without a forward, or twice", mb)
	case f.z == nil:
		return nil, fmt.Errorf("micro-batch %d: backward before its recomputation", mb)
	case grad == nil:
		return nil, fmt.Errorf("micro-batch %d backward: no output gradient", mb)
	}
	dy, err := st.outputGradient(f, grad)
	if err != nil {
		return nil, fmt.Errorf("micro-batch %d backward: %w", mb, err)
	}
	f.dz = make([]Buffer, len(st.layers))
	for i := len(st.layers) - 1; i >= 0; i-- {
		if dy, err = st.layerBackward(f, i, dy, weights); err != nil {
			return nil, fmt.Errorf("micro-batch %d backward: %s: %w", mb, st.names[st.layers[i].w], err)
		}
	}
	if dy == nil {
		return nil, nil
	}
	defer st.put(dy)
	return st.download(dy, st.InShape()...)
}

// outputGradient is the gradient of the last layer's y on the device: the
// loss's, scaled by grad's one value, on the last chunk; else grad copied.
func (st *Stage) outputGradient(f *flight, grad *tensor.Dense) (Buffer, error) {
	if !st.IsLast() {
		g, ok := grad.Data().([]float32)
		if !ok {
			return nil, fmt.Errorf("output gradient of dtype %v, want float32", grad.Dtype())
		}
		return st.upload(g)
	}
	var g float32
	switch v := grad.Data().(type) {
	case float32:
		g = v
	case []float32:
		if len(v) != 1 {
			return nil, fmt.Errorf("loss gradient of %d values, want one", len(v))
		}
		g = v[0]
	default:
		return nil, fmt.Errorf("loss gradient of dtype %v, want float32", grad.Dtype())
	}
	rows, c := st.rows(), st.model.Classes
	d, err := st.get(rows * c)
	if err != nil {
		return nil, err
	}
	return d, st.be.XentGrad(d, f.probs, f.targets, rows, c, g/float32(rows))
}

// layerBackward takes the gradient dy of layer i's output (which it gives
// back), computes dz = dy·act'(z), keeps it in f.dz (or adds the weight
// gradients now) and returns the gradient of the layer's input, nil for
// the model's first layer.
func (st *Stage) layerBackward(f *flight, i int, dy Buffer, weights bool) (Buffer, error) {
	l, rows := st.layers[i], st.rows()
	dz := dy
	if l.act != "" {
		var err error
		if dz, err = st.get(rows * l.out); err != nil {
			return nil, err
		}
		err = st.be.ActivateGrad(l.act, dz, dy, f.z[i], f.y[i])
		st.put(dy)
		if err != nil {
			st.put(dz)
			return nil, err
		}
	}
	f.dz[i] = dz
	if weights {
		if err := st.weightGradients(f, i); err != nil {
			return nil, err
		}
	}
	if i == 0 && st.IsFirst() {
		return nil, nil
	}
	dx, err := st.get(rows * l.in)
	if err != nil {
		return nil, err
	}
	return dx, st.be.Gemm(false, true, rows, l.in, l.out, 1, dz, st.params[l.w], 0, dx)
}

// weightGradients adds layer i's gradients to the step's: xᵀ·dz to W's,
// dz's column sums to b's.
func (st *Stage) weightGradients(f *flight, i int) error {
	l, rows := st.layers[i], st.rows()
	x := f.x
	if i > 0 {
		x = f.y[i-1]
	}
	if err := st.be.Gemm(true, false, l.in, l.out, rows, 1, x, f.dz[i], 1, st.grads[l.w]); err != nil {
		return err
	}
	return st.be.SumRows(st.grads[l.b], f.dz[i], rows, l.out, 1)
}

// Weight is the weight pass of a split backward: the weight gradients from
// the inputs and dz the input pass kept.
func (st *Stage) Weight(mb int) error {
	f, ok := st.flights[mb]
	if !ok || f.dz == nil {
		return fmt.Errorf("micro-batch %d: weight gradient before its input gradient", mb)
	}
	for i := range st.layers {
		if err := st.weightGradients(f, i); err != nil {
			return fmt.Errorf("micro-batch %d weight gradients: %s: %w", mb, st.names[st.layers[i].w], err)
		}
	}
	st.release(mb)
	return nil
}

// release gives back everything micro-batch mb holds.
func (st *Stage) release(mb int) {
	f := st.flights[mb]
	delete(st.flights, mb)
	st.dropActivations(f)
	st.put(f.x, f.targets)
	st.put(f.dz...)
}

// Discard drops what mb kept without a backward.
func (st *Stage) Discard(mb int) {
	if _, ok := st.flights[mb]; ok {
		st.release(mb)
	}
}

// HeldBytes is the device memory the in-flight micro-batches hold.
func (st *Stage) HeldBytes() int64 {
	var n int
	for _, f := range st.flights {
		for _, b := range slices.Concat([]Buffer{f.x, f.targets, f.probs}, f.z, f.dz) {
			if b != nil {
				n += b.Len()
			}
		}
		for i, y := range f.y {
			if y != f.z[i] {
				n += y.Len()
			}
		}
	}
	return int64(n) * 4
}

// NewOptimizer makes the host optimizer the runtime schedules and
// checkpoints (learning rate, step count, slots in host memory) and the
// device copies of its state, which the steps update.
func (st *Stage) NewOptimizer(spec optim.Spec) (*optim.Optimizer, error) {
	o, err := optim.NewNamed(spec, tensor.Float32, st.names, st.shapes)
	if err != nil {
		return nil, err
	}
	st.optimizer = spec
	st.slots = map[string][]Buffer{}
	for _, name := range o.SlotNames() {
		for i, s := range st.shapes {
			b, err := st.zeros(s.TotalSize())
			if err != nil {
				return nil, fmt.Errorf("%s: optimizer state %s of %s: %w", st.be.Name(), name, st.names[i], err)
			}
			st.slots[name] = append(st.slots[name], b)
		}
	}
	return o, nil
}

// Step applies the optimizer on the device, with o's learning rate, step
// count and weight decay, to the summed gradients, and zeroes them.
func (st *Stage) Step(o *optim.Optimizer) error {
	if len(st.flights) != 0 {
		return fmt.Errorf("optimizer step with %d micro-batches still in flight", len(st.flights))
	}
	if st.slots == nil {
		return errors.New("optimizer step before NewOptimizer")
	}
	o.SetSteps(o.Steps() + 1)
	spec, lr := st.optimizer, o.LR()
	for i, p := range st.params {
		if err := st.update(spec, o, i, p, st.grads[i], lr); err != nil {
			return fmt.Errorf("%s: updating %s: %w", st.be.Name(), st.names[i], err)
		}
	}
	return nil
}

// update is one parameter's step, as optim's update computes it.
func (st *Stage) update(spec optim.Spec, o *optim.Optimizer, i int, p, g Buffer, lr float64) error {
	if wd := o.Decay(i); wd != 0 {
		var err error
		if spec.Name == "adamw" {
			err = st.be.Scale(p, float32(1-lr*wd))
		} else {
			err = st.be.AddScaled(g, p, float32(wd))
		}
		if err != nil {
			return err
		}
	}
	switch {
	case spec.Name == "adam" || spec.Name == "adamw":
		t := float64(o.Steps())
		c1 := 1 - math.Pow(spec.Beta1, t)
		c2 := math.Sqrt(1 - math.Pow(spec.Beta2, t))
		return st.be.Adam(p, g, st.slots["m"][i], st.slots["v"][i], float32(spec.Beta1), float32(spec.Beta2), float32(lr*c2/c1), float32(spec.Eps*c2))
	case spec.Momentum > 0:
		return st.be.Momentum(p, g, st.slots["momentum"][i], float32(lr), float32(spec.Momentum))
	}
	return st.be.SGD(p, g, float32(lr))
}

// StoreOptimizer copies the device's optimizer state into o's slots.
func (st *Stage) StoreOptimizer(o *optim.Optimizer) error {
	return st.eachSlot(o, func(host *tensor.Dense, dev Buffer) error {
		return st.be.Download(host.Data().([]float32), dev)
	})
}

// LoadOptimizer copies o's slots (a checkpoint's) into the device's state.
func (st *Stage) LoadOptimizer(o *optim.Optimizer) error {
	return st.eachSlot(o, func(host *tensor.Dense, dev Buffer) error {
		return st.be.Upload(dev, host.Data().([]float32))
	})
}

func (st *Stage) eachSlot(o *optim.Optimizer, f func(*tensor.Dense, Buffer) error) error {
	for _, name := range o.SlotNames() {
		for i, dev := range st.slots[name] {
			host, err := o.Slot(name, i)
			if err == nil {
				err = f(host, dev)
			}
			if err != nil {
				return fmt.Errorf("%s: optimizer state %s of %s: %w", st.be.Name(), name, st.names[i], err)
			}
		}
	}
	return nil
}

// Weights copies the weights to the host. A failed copy is returned by the
// next Forward (Weights returns no error).
func (st *Stage) Weights() []compute.Weight {
	ws := make([]compute.Weight, len(st.params))
	for i, p := range st.params {
		if err := st.be.Download(st.hostW[i].Data().([]float32), p); err != nil && st.fault == nil {
			st.fault = fmt.Errorf("%s: copying weight %s to the host: %w", st.be.Name(), st.names[i], err)
		}
		ws[i] = compute.Weight{Name: st.names[i], Value: st.hostW[i]}
	}
	return ws
}

// LoadWeights copies ws, in Weights' order, names and shapes, to the device.
func (st *Stage) LoadWeights(ws []compute.Weight) error { return st.load("weight", st.params, ws) }

// Gradients copies the step's summed gradients to the host.
func (st *Stage) Gradients() ([]compute.Weight, error) {
	gs := make([]compute.Weight, len(st.grads))
	for i, g := range st.grads {
		if err := st.be.Download(st.hostG[i].Data().([]float32), g); err != nil {
			return nil, fmt.Errorf("%s: copying the gradient of %s to the host: %w", st.be.Name(), st.names[i], err)
		}
		gs[i] = compute.Weight{Name: st.names[i], Value: st.hostG[i]}
	}
	return gs, nil
}

// LoadGradients copies gs, in Gradients' order, to the device.
func (st *Stage) LoadGradients(gs []compute.Weight) error { return st.load("gradient", st.grads, gs) }

// load checks ws against the stage's names and shapes and uploads them.
func (st *Stage) load(what string, dst []Buffer, ws []compute.Weight) error {
	if len(ws) != len(dst) {
		return fmt.Errorf("%d %ss for a stage of %d", len(ws), what, len(dst))
	}
	for i, w := range ws {
		v, ok := w.Value.Data().([]float32)
		if w.Name != st.names[i] || !w.Value.Shape().Eq(st.shapes[i]) || !ok {
			return fmt.Errorf("%s %d: %s %v %v for %s %v float32", what, i, w.Name, w.Value.Shape(), w.Value.Dtype(), st.names[i], st.shapes[i])
		}
		if err := st.be.Upload(dst[i], v); err != nil {
			return fmt.Errorf("%s: copying %s %s to the device: %w", st.be.Name(), what, w.Name, err)
		}
	}
	return nil
}
