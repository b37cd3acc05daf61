package engine

import (
	"reflect"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// A stage hands received tensors back to the transport once their
// micro-batch is finished, so the link receives the next ones into warm
// memory rather than a fresh allocation per message. That is only safe if
// nothing will write into that memory again, and gorgonia makes it subtle: a
// machine keeps its registers between runs (rewind), a view op such as
// Reshape leaves a register pointing into its input, and the next run's alloc
// instruction reuses any register of the right shape, writing into it. So
// before a buffer is released, every machine's registers and every node's
// value and gradient are checked for pointers into it: idle machines forget
// such registers (their next run allocates afresh), and anything else that
// still points there keeps the buffer from being released at all.

// Unshare drops idle machines' registers that point into mem and reports
// whether nothing else in e does: no in-flight machine's register, no node's
// value or gradient (except the input node's value, which the next Forward
// rebinds before anything reads it).
func (e *Engine) Unshare(mem []byte) bool {
	if len(mem) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	hi := lo + uintptr(len(mem))
	within := func(v G.Value) bool {
		if rv := reflect.ValueOf(v); !rv.IsValid() || rv.Kind() == reflect.Pointer && rv.IsNil() {
			return false
		}
		p, n := v.Uintptr(), v.MemSize()
		return n > 0 && p < hi && lo < p+n
	}
	for _, f := range e.flights {
		if f.vm == nil {
			continue
		}
		for _, v := range registers(f.vm) {
			if within(*v) {
				return false
			}
		}
	}
	for _, n := range e.g.AllNodes() {
		if n != e.x && within(n.Value()) {
			return false
		}
		if g, ok := e.gradOf(n); ok && within(g) {
			return false
		}
	}
	for _, vm := range e.idle {
		regs := registers(vm)
		if regs == nil {
			return false // not a machine whose registers can be checked
		}
		for _, v := range regs {
			if within(*v) {
				*v = nil
			}
		}
	}
	return true
}

// Bytes is t's memory, to hand to Unshare; nil for a tensor of neither
// float type.
func Bytes(t *tensor.Dense) []byte {
	switch d := t.Data().(type) {
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d))), 4*len(d))
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d))), 8*len(d))
	}
	return nil
}

// registers returns pointers to a tape machine's CPU registers (unexported,
// hence reflection, as in rewind), or nil for another kind of machine.
func registers(vm G.VM) []*G.Value {
	mem, ok := registerFile(vm)
	if !ok {
		return nil
	}
	out := make([]*G.Value, len(mem)) // never nil: nil means "cannot check"
	for i := range mem {
		out[i] = &mem[i]
	}
	return out
}

// registerFile is a tape machine's CPU registers themselves, read in place.
func registerFile(vm G.VM) ([]G.Value, bool) {
	v := reflect.ValueOf(vm)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	f := v.Elem().FieldByName("cpumem")
	if !f.IsValid() || f.Type() != reflect.TypeFor[[]G.Value]() || !f.CanAddr() {
		return nil, false
	}
	return *(*[]G.Value)(unsafe.Pointer(f.UnsafeAddr())), true
}
