package transport

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Wire compression casts float32 tensors to 16 bits for the link and back, as
// TensorFlow's distributed runtime can: half the bytes, at the cost of rounding
// activations and gradients (bfloat16 keeps float32's range with 8 bits of
// mantissa; float16 keeps 11 bits of mantissa within ±65504). Conversion rounds
// to nearest even, keeps NaN a NaN and infinities infinite; float16 turns values
// beyond its range into infinities and keeps subnormals.

// WireDType is the dtype a float32 link carries under compression none, fp16 or bf16.
func WireDType(model DType, compression string) (DType, error) {
	switch compression {
	case "", "none":
		return model, nil
	case "bf16", "fp16":
		if model != Float32 {
			return 0, fmt.Errorf("compression %s needs a float32 model, not %s", compression, model)
		}
		if compression == "bf16" {
			return BFloat16, nil
		}
		return Float16, nil
	}
	return 0, fmt.Errorf("unknown compression %q (known: none, fp16, bf16)", compression)
}

// FromFloat32sAs builds a tensor of dtype dt (Float32, BFloat16 or Float16)
// from float32 values, rounding them to dt.
func FromFloat32sAs(dt DType, kind Kind, step int64, mb int32, shape []int, vals []float32) (*Tensor, error) {
	switch dt {
	case Float32:
		return FromFloat32s(kind, step, mb, shape, vals)
	case BFloat16, Float16:
		data := make([]byte, 2*len(vals))
		halves := uint16View(data)
		if !encodeHalvesSIMD(dt, vals, halves) {
			encodeHalves(dt, vals, halves)
		}
		storeHalves(data, halves)
		return newTensor(kind, step, mb, dt, shape, data)
	}
	return nil, fmt.Errorf("cannot encode float32 values as %s", dt)
}

// AsFloat32s returns the payload of a Float32, BFloat16 or Float16 tensor as
// float32s (a view for Float32, see Float32s; a new slice otherwise), or nil.
func (t *Tensor) AsFloat32s() []float32 {
	switch t.DType {
	case Float32:
		return t.Float32s()
	case BFloat16, Float16:
		v := make([]float32, len(t.Data)/2)
		halves := loadHalves(t.Data)
		if !decodeHalvesSIMD(t.DType, halves, v) {
			decodeHalves(t.DType, halves, v)
		}
		return v
	}
	return nil
}

// Widen turns a received BFloat16 or Float16 tensor into the Float32 tensor
// it stands for. The float32 values live in a receive buffer that Release
// hands back like any received tensor's, and the 16-bit one goes back at once,
// so a compressed link allocates no more per message than a plain one.
// Widening a Float32 tensor does nothing.
func (t *Tensor) Widen() error {
	switch t.DType {
	case Float32:
		return nil
	case BFloat16, Float16:
	default:
		return fmt.Errorf("cannot widen a %s tensor to float32", t.DType)
	}
	buf := recvBuffers.get(2 * len(t.Data))
	vals := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(*buf))), len(t.Data)/2)
	halves := loadHalves(t.Data)
	if !decodeHalvesSIMD(t.DType, halves, vals) {
		decodeHalves(t.DType, halves, vals)
	}
	t.Release()
	t.DType, t.Data, t.pooled = Float32, *buf, buf
	if !nativeLittle {
		for i, v := range vals { // vals was written in native order
			binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(v))
		}
	}
	return nil
}

// encodeHalves is the Go cast of vals to dt (BFloat16 or Float16), for builds
// or CPUs without the vector casts.
func encodeHalves(dt DType, vals []float32, halves []uint16) {
	if dt == BFloat16 {
		for i, v := range vals {
			halves[i] = toBFloat16(v)
		}
		return
	}
	// toFloat16Fast written out, so the common case needs no call.
	for i, v := range vals {
		b := math.Float32bits(v)
		if e := (b >> 23) & 0xff; e-113 < 30 {
			h := (b>>16)&0x8000 | (e-112)<<10 | (b>>13)&0x3ff
			halves[i] = uint16(h + (b&0x1fff+0xfff+h&1)>>13)
		} else {
			halves[i] = toFloat16(v)
		}
	}
}

// decodeHalves is encodeHalves' way back to float32.
func decodeHalves(dt DType, halves []uint16, vals []float32) {
	if dt == BFloat16 {
		for i, h := range halves {
			vals[i] = math.Float32frombits(uint32(h) << 16)
		}
		return
	}
	table := float16Table()
	for i, h := range halves {
		vals[i] = table[h]
	}
}

// uint16View is a scratch slice to encode into: data itself on a little-endian
// host with aligned data (storeHalves then does nothing), else a new slice.
func uint16View(data []byte) []uint16 {
	if nativeLittle && aligned(data, 2) && len(data) > 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), len(data)/2)
	}
	return make([]uint16, len(data)/2)
}

func storeHalves(data []byte, halves []uint16) {
	if len(data) > 0 && unsafe.Pointer(&data[0]) == unsafe.Pointer(unsafe.SliceData(halves)) {
		return
	}
	for i, h := range halves {
		binary.LittleEndian.PutUint16(data[2*i:], h)
	}
}

func loadHalves(data []byte) []uint16 {
	if nativeLittle && aligned(data, 2) && len(data) > 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), len(data)/2)
	}
	out := make([]uint16, len(data)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	return out
}

// float16Table maps every float16 bit pattern to its float32 value, so decoding
// is one lookup per element.
var float16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = fromFloat16(uint16(h))
	}
	return &t
})

func toBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it quiet and a NaN
		return uint16(b>>16) | 0x40
	}
	// Round to nearest, ties to even, on the 16 bits dropped.
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

func fromBFloat16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// toFloat16Fast is toFloat16 with the common case, a value in float16's normal
// range, inline and branch-free in its rounding.
func toFloat16Fast(f float32) uint16 {
	b := math.Float32bits(f)
	e := (b >> 23) & 0xff
	if e-113 < 30 { // 113..142: float16 exponents 1..30
		h := (b>>16)&0x8000 | (e-112)<<10 | (b>>13)&0x3ff
		return uint16(h + (b&0x1fff+0xfff+h&1)>>13)
	}
	return toFloat16(f)
}

func toFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b >> 23) & 0xff)
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 { // a quiet NaN with the payload's top bits, as F16C does
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	case exp-127 > 15: // beyond float16's range
		return sign | 0x7c00
	case exp-127 >= -14: // normal
		e := uint32(exp - 127 + 15)
		m := mant >> 13
		rest := mant & 0x1fff
		h := e<<10 | m
		if rest > 0x1000 || (rest == 0x1000 && m&1 == 1) {
			h++ // may carry into the exponent, up to infinity: correct
		}
		return sign | uint16(h)
	case exp-127 >= -25: // subnormal in float16
		m := mant | 0x800000 // the implicit bit
		shift := uint32(-14-(exp-127)) + 13
		h := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	return sign // underflows to zero
}

func fromFloat16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant != 0 { // NaN, made quiet as F16C does
			mant |= 0x200
		}
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: mant × 2^-24.
		v := float32(mant) * float32(math.Ldexp(1, -24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
