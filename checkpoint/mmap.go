package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
)

// Mapped is a safetensors file mapped into memory read-only: its header is
// parsed, and a tensor's bytes are read only when it is decoded, so a stage
// that needs a few of a large checkpoint's tensors touches only their pages.
type Mapped struct {
	Path    string
	Meta    map[string]string
	entries map[string]entry
	mapped  []byte // the whole file
	data    []byte // the bytes after the header
}

// dtypeSize is the bytes per value of each dtype Mapped decodes.
var dtypeSize = map[string]int64{"F64": 8, "F32": 4, "F16": 2, "BF16": 2}

// OpenMapped maps the safetensors file at path and checks its header: every
// tensor F32, F64, F16 or BF16, lying within the file.
func OpenMapped(path string) (*Mapped, error) {
	f, err := os.Open(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return nil, fmt.Errorf("%s: %w", path, pathErr.Err)
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: "+format, append([]any{path}, args...)...)
	}
	if !st.Mode().IsRegular() {
		return nil, bad("not a regular file")
	}
	if st.Size() < 8 {
		return nil, bad("not a safetensors file (%d bytes, too short for a header)", st.Size())
	}
	b, err := mapFile(f, st.Size())
	if err != nil {
		return nil, bad("mmap: %v", err)
	}
	m := &Mapped{Path: path, mapped: b}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader || n > uint64(len(b)-8) {
		m.Close()
		return nil, bad("not a safetensors file (header length %d in a %d-byte file)", n, len(b))
	}
	if m.entries, m.Meta, err = parseHeader(b[8:8+n], bad); err != nil {
		m.Close()
		return nil, err
	}
	m.data = b[8+n:]
	for name, e := range m.entries {
		if err := checkEntry(name, e, int64(len(m.data))); err != nil {
			m.Close()
			return nil, bad("%v", err)
		}
	}
	return m, nil
}

// checkEntry refuses a dtype Mapped does not decode, a bad shape, or bytes
// outside the data.
func checkEntry(name string, e entry, data int64) error {
	size := dtypeSize[e.DType]
	if size == 0 {
		return fmt.Errorf("tensor %s is %s; F32, F16, BF16 and F64 are read", name, e.DType)
	}
	count := int64(1)
	for _, d := range e.Shape {
		if d < 0 || (d > 0 && count > math.MaxInt32/int64(d)) {
			return fmt.Errorf("tensor %s: bad shape %v", name, e.Shape)
		}
		count *= int64(d)
	}
	if lo, hi := int64(e.Offsets[0]), int64(e.Offsets[1]); lo < 0 || hi-lo != count*size || hi > data {
		return fmt.Errorf("tensor %s: bytes [%d, %d) do not hold %s %v within the file's %d data bytes (truncated?)", name, lo, hi, e.DType, e.Shape, data)
	}
	return nil
}

// Close unmaps the file (a nil Mapped is closed); tensors decoded before
// stay valid.
func (m *Mapped) Close() error {
	if m == nil || m.mapped == nil {
		return nil
	}
	err := unmapFile(m.mapped)
	m.mapped, m.data = nil, nil
	return err
}

// Info is tensor name's dtype and shape, ok false when the file lacks it.
func (m *Mapped) Info(name string) (dtype string, shape []int, ok bool) {
	e, ok := m.entries[name]
	return e.DType, e.Shape, ok
}

// Names lists the file's tensors.
func (m *Mapped) Names() []string {
	out := make([]string, 0, len(m.entries))
	for n := range m.entries {
		out = append(out, n)
	}
	return out
}

// Tensor decodes tensor name into float64 values when f64, else float32:
// F16 and BF16 widen exactly, F64 rounds to float32.
func (m *Mapped) Tensor(name string, f64 bool) (Tensor, error) {
	e, ok := m.entries[name]
	if !ok {
		return Tensor{}, fmt.Errorf("%s: no tensor %s", m.Path, name)
	}
	raw := m.data[e.Offsets[0]:e.Offsets[1]]
	n := len(raw) / int(dtypeSize[e.DType])
	t := Tensor{Name: name, Shape: append([]int{}, e.Shape...)}
	if f64 {
		t.F64 = make([]float64, n)
	} else {
		t.F32 = make([]float32, n)
	}
	for i := range n {
		var v float64
		switch e.DType {
		case "F64":
			v = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
		case "F32":
			v = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		case "BF16":
			v = float64(BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:])))
		case "F16":
			v = float64(F16ToF32(binary.LittleEndian.Uint16(raw[2*i:])))
		}
		if f64 {
			t.F64[i] = v
		} else {
			t.F32[i] = float32(v)
		}
	}
	return t, nil
}

// BF16ToF32 widens a bfloat16, the high half of a float32, exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds v to the nearest bfloat16, ties to even, as PyTorch's
// .to(torch.bfloat16) does; a NaN stays a NaN.
func F32ToBF16(v float32) uint16 {
	b := math.Float32bits(v)
	if v != v {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToF32 widens an IEEE half exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		// A subnormal: frac · 2⁻²⁴.
		v := float32(frac) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// F32ToF16 rounds v to the nearest IEEE half, ties to even; beyond the
// half's range it is ±Inf.
func F32ToF16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	frac := b & 0x7fffff
	switch {
	case v != v:
		return sign | 0x7e00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		// A subnormal half: shift the full significand into place, rounding.
		m := frac | 0x800000
		shift := uint32(14 - exp)
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	h := uint32(exp)<<10 | frac>>13
	rem := frac & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is the right rounding, up to Inf
	}
	return sign | uint16(h)
}
