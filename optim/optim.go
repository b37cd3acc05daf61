// Package optim holds pipetrain's optimizers: SGD, SGD with momentum, Adam
// and AdamW, with optional weight decay, updating parameters in place from
// summed gradients. Their state (step count,
// moment buffers) can be read out and restored exactly, so a run resumed from a
// checkpoint continues with the same bits as one never stopped.
package optim

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/parallel"
)

// Optimizer updates one list of parameters (a stage chunk's), always in the same
// order, so two processes holding the same parameters compute the same update.
type Optimizer struct {
	cfg    Spec
	shapes []tensor.Shape
	dt     tensor.Dtype
	steps  int64
	// lr is the learning rate of the next step: cfg.LR until SetLR.
	lr float64
	// decay is the weight decay of each parameter: cfg.WeightDecay for
	// those Spec.Decays selects, 0 for the others.
	decay []float64
	// slots holds the per-parameter buffers: "momentum" for SGD with momentum,
	// "m" and "v" for Adam; each list in parameter order.
	slots map[string][]*tensor.Dense
	// workers is how many goroutines share a large parameter's update
	// (SetWorkers); 0 or 1: the calling goroutine alone.
	workers int
	// shard, when set (Shard), limits the state and the update to some
	// elements of the parameters; slots is then empty.
	shard *shard
}

// SetWorkers lets Step cut each parameter of at least parallelMin elements
// into n contiguous ranges updated at once, one goroutine each: a process
// given n cores for its products should not update on one. Every element's
// update depends on that element alone, so the bits do not depend on n.
func (o *Optimizer) SetWorkers(n int) { o.workers = n }

// parallelMin is the smallest parameter Step shares among workers: below it
// starting goroutines costs more than the update.
const parallelMin = 1 << 16

// New makes the configured optimizer for parameters of the given shapes.
// Weight decay needs the parameters' names: see NewNamed.
func New(o Spec, dt tensor.Dtype, shapes []tensor.Shape) (*Optimizer, error) {
	return NewNamed(o, dt, nil, shapes)
}

// NewNamed makes the configured optimizer for parameters of the given
// names and shapes, in the order Step receives them. The names choose
// which parameters weight decay applies to (Spec.Decays); they may be nil
// when the spec has none.
func NewNamed(o Spec, dt tensor.Dtype, names []string, shapes []tensor.Shape) (*Optimizer, error) {
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("optimizer: unsupported dtype %v", dt)
	}
	if !slices.Contains(Names(), o.Name) {
		return nil, fmt.Errorf("unknown optimizer %q (known: %s)", o.Name, strings.Join(Names(), ", "))
	}
	decay, err := decays(o, names, shapes)
	if err != nil {
		return nil, err
	}
	return &Optimizer{cfg: o, dt: dt, shapes: shapes, lr: o.LR, decay: decay}, nil
}

// allocate makes the whole state's buffers on first use, unless Shard has
// limited the state to a shard: a sharded optimizer never holds the whole.
func (o *Optimizer) allocate() {
	if o.slots != nil || o.shard != nil {
		return
	}
	o.slots = map[string][]*tensor.Dense{}
	for _, n := range o.SlotNames() {
		for _, s := range o.shapes {
			o.slots[n] = append(o.slots[n], tensor.New(tensor.Of(o.dt), tensor.WithShape(s.Clone()...)))
		}
	}
}

// decays is the weight decay of each parameter, or nil where none has any.
func decays(o Spec, names []string, shapes []tensor.Shape) ([]float64, error) {
	if o.WeightDecay == 0 {
		return nil, nil
	}
	if err := o.CheckPatterns(); err != nil {
		return nil, fmt.Errorf("optimizer %s: %w", o.Name, err)
	}
	if len(names) != len(shapes) {
		return nil, fmt.Errorf("optimizer %s: weight decay needs the name of each of the %d parameters, got %d names", o.Name, len(shapes), len(names))
	}
	out := make([]float64, len(names))
	for i, n := range names {
		if o.Decays(n, len(shapes[i])) {
			out[i] = o.WeightDecay
		}
	}
	return out, nil
}

// Decay is the weight decay that parameter i gets: the spec's
// weight_decay where Spec.Decays selects it, else 0.
func (o *Optimizer) Decay(i int) float64 {
	if i < 0 || i >= len(o.decay) {
		return 0
	}
	return o.decay[i]
}

// SetLR sets the learning rate of the steps that follow, as a schedule
// (Schedule.LR) gives it; it is no state of the optimizer's: a resumed run
// sets it again from the step.
func (o *Optimizer) SetLR(lr float64) { o.lr = lr }

// LR is the learning rate the next step uses.
func (o *Optimizer) LR() float64 { return o.lr }

// Steps is the number of updates applied so far.
func (o *Optimizer) Steps() int64 { return o.steps }

// Step applies one update to params from grads, zeroing grads for the next
// step's sums in the same pass.
func (o *Optimizer) Step(params, grads []*tensor.Dense) error {
	if len(params) != len(o.shapes) || len(grads) != len(o.shapes) {
		return fmt.Errorf("optimizer: %d parameters and %d gradients for %d shapes", len(params), len(grads), len(o.shapes))
	}
	for i := range params {
		if !params[i].Shape().Eq(o.shapes[i]) || !grads[i].Shape().Eq(o.shapes[i]) {
			return fmt.Errorf("optimizer: parameter %d has shape %v and gradient %v, want %v", i, params[i].Shape(), grads[i].Shape(), o.shapes[i])
		}
	}
	o.allocate()
	o.steps++
	for i := range params {
		switch p := params[i].Data().(type) {
		case []float32:
			g := grads[i].Data().([]float32)
			o.ranges(i, len(p), func(lo, hi, at int) { update(o, i, p, g, lo, hi, at) })
			zeroUnowned(o, i, g)
		case []float64:
			g := grads[i].Data().([]float64)
			o.ranges(i, len(p), func(lo, hi, at int) { update(o, i, p, g, lo, hi, at) })
			zeroUnowned(o, i, g)
		}
	}
	return nil
}

// ranges runs f over the elements of parameter i (of n) that the optimizer
// updates, each range [lo, hi) with its state at [at, at+hi-lo), cut among
// o.workers goroutines at once, or whole on the caller's goroutine.
func (o *Optimizer) ranges(i, n int, f func(lo, hi, at int)) {
	if o.shard == nil {
		parallel.Ranges(n, o.workers, parallelMin, func(lo, hi int) { f(lo, hi, lo) })
		return
	}
	for _, pc := range o.shard.pieces[i] {
		parallel.Ranges(pc.hi-pc.lo, o.workers, parallelMin, func(a, b int) { f(pc.lo+a, pc.lo+b, pc.at+a) })
	}
}

// slotData is the state of slot name for parameter i: the whole buffer, or
// a shard's owned elements packed in order.
func (o *Optimizer) slotData(name string, i int) any {
	if o.shard != nil {
		return o.shard.state[name][i]
	}
	return o.slots[name][i].Data()
}

// adamScales are the step's bias-corrected step size and the epsilon scaled to
// match: lr*sqrt(1-b2^t)/(1-b1^t) and eps*sqrt(1-b2^t), as in Kingma and Ba's
// efficient form, so the inner loop needs no divisions by the corrections.
func (o *Optimizer) adamScales() (step, eps float64) {
	c1 := 1 - math.Pow(o.cfg.Beta1, float64(o.steps))
	c2 := math.Sqrt(1 - math.Pow(o.cfg.Beta2, float64(o.steps)))
	return o.lr * c2 / c1, o.cfg.Eps * c2
}

// update applies one step to elements [lo, hi) of parameter i, in the
// parameters' own precision, and zeroes their gradients. A float32
// parameter's leading elements go to the vector kernels (vectorised),
// which give the loops' bits: the conversions round each operation, as
// they do, so that no compiler fuses a multiply and an add here either.
//
// The state of elements [lo, hi) is at [at, at+hi-lo) of the slots.
func update[T float32 | float64](o *Optimizer, i int, p, g []T, lo, hi, at int) {
	p, g = p[lo:hi], g[lo:hi]
	st := func(name string) []T { return o.slotData(name, i).([]T)[at : at+hi-lo] }
	lr := T(o.lr)
	if wd := o.Decay(i); wd != 0 {
		decay(o.cfg.Name == "adamw", o.lr, wd, p, g)
	}
	switch {
	case o.cfg.usesAdam():
		m, v := st("m"), st("v")
		b1, b2 := T(o.cfg.Beta1), T(o.cfg.Beta2)
		c1, c2 := 1-b1, 1-b2
		s, e := o.adamScales()
		step, eps := T(s), T(e)
		done := 0
		if p32, ok := any(p).([]float32); ok {
			c := adamConsts{float32(b1), float32(c1), float32(b2), float32(c2), float32(step), float32(eps)}
			done = vectorised(update32{p: p32, g: any(g).([]float32), m: any(m).([]float32), v: any(v).([]float32), adam: &c})
		}
		for j := done; j < len(p); j++ {
			gj := g[j]
			m[j] = T(b1*m[j]) + T(c1*gj)
			v[j] = T(b2*v[j]) + T(T(c2*gj)*gj)
			p[j] -= T(step*m[j]) / (T(math.Sqrt(float64(v[j]))) + eps)
			g[j] = 0
		}
	case o.cfg.Momentum > 0:
		buf, mu := st("momentum"), T(o.cfg.Momentum)
		done := 0
		if p32, ok := any(p).([]float32); ok {
			done = vectorised(update32{p: p32, g: any(g).([]float32), buf: any(buf).([]float32), lr: float32(lr), mu: float32(mu)})
		}
		for j := done; j < len(p); j++ {
			buf[j] = T(mu*buf[j]) + g[j]
			p[j] -= T(lr * buf[j])
			g[j] = 0
		}
	default:
		done := 0
		if p32, ok := any(p).([]float32); ok {
			done = vectorised(update32{p: p32, g: any(g).([]float32), lr: float32(lr)})
		}
		for j := done; j < len(p); j++ {
			p[j] -= T(lr * g[j])
			g[j] = 0
		}
	}
}

// decay applies weight decay wd to a range before the update, as
// torch.optim does: decoupled (AdamW) scales the parameters by 1 − lr·wd,
// computed in float64 and rounded once, as torch's Python scalar is;
// otherwise (SGD's and Adam's L2) wd·p is added to the gradients, which the
// update then reads. Parameters without decay never come here, so their
// updates keep their bits.
func decay[T float32 | float64](decoupled bool, lr, wd float64, p, g []T) {
	if decoupled {
		keep := T(1 - lr*wd)
		for j := range p {
			p[j] *= keep
		}
		return
	}
	w := T(wd)
	for j := range p {
		g[j] += T(w * p[j])
	}
}

// adamConsts are one Adam step's scalars, in the order adamAVX reads them.
type adamConsts struct{ b1, c1, b2, c2, step, eps float32 }

// update32 is a float32 range's update for the vector kernels: with adam,
// Adam's (m and v); with buf, SGD with momentum; else plain SGD.
type update32 struct {
	p, g, buf, m, v []float32
	lr, mu          float32
	adam            *adamConsts
}

// SlotNames lists the optimizer's per-parameter buffers, in a fixed order.
func (o *Optimizer) SlotNames() []string {
	switch {
	case o.cfg.usesAdam():
		return []string{"m", "v"}
	case o.cfg.Momentum > 0:
		return []string{"momentum"}
	}
	return nil
}

// Slot returns buffer name of parameter i, which the caller may read or fill
// (restoring a checkpoint).
func (o *Optimizer) Slot(name string, i int) (*tensor.Dense, error) {
	if o.shard != nil {
		return nil, fmt.Errorf("optimizer %s keeps a shard of its state: read it with ExportSlot", o.cfg.Name)
	}
	o.allocate()
	s, ok := o.slots[name]
	if !ok || i < 0 || i >= len(s) {
		return nil, fmt.Errorf("optimizer %s has no slot %q for parameter %d", o.cfg.Name, name, i)
	}
	return s[i], nil
}

// SetSteps restores the update count from a checkpoint (Adam's bias corrections
// depend on it).
func (o *Optimizer) SetSteps(n int64) { o.steps = n }
