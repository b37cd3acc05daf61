package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"unsafe"
)

// Kind says what a tensor message carries. The upstream end of a link sends
// activations and receives gradients; the downstream end does the reverse.
type Kind uint8

const (
	Activation Kind = 1
	Gradient   Kind = 2
)

func (k Kind) String() string {
	switch k {
	case Activation:
		return "activation"
	case Gradient:
		return "gradient"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// DType is the element type of a tensor's payload.
type DType uint8

const (
	Float32 DType = 1
	Float64 DType = 2
	// BFloat16 and Float16 exist only on the wire: a link compressing float32
	// activations and gradients (transport.compression) sends them as these.
	BFloat16 DType = 3
	Float16  DType = 4
)

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Size is the element size in bytes, 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float64:
		return 8
	case BFloat16, Float16:
		return 2
	}
	return 0
}

// ParseDType parses "float32" or "float64".
func ParseDType(s string) (DType, error) {
	switch s {
	case "float32":
		return Float32, nil
	case "float64":
		return Float64, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (want float32 or float64)", s)
}

// MaxRank bounds a tensor's rank so a header can never ask for more than a
// few bytes of shape.
const MaxRank = 8

// Tensor is one message on a link: a micro-batch's activation or gradient.
type Tensor struct {
	Kind       Kind
	Step       int64
	MicroBatch int32
	Chunk      int32 // model chunk (interleaved schedules); indexes Hello.Shapes; 0 for a plain pipeline
	DType      DType
	Shape      []int
	Data       []byte // little-endian values, len == prod(Shape)*DType.Size()

	// pooled is the recvBuffers buffer Data lives in, for tensors a link
	// received; Release hands it back.
	pooled *[]byte
}

// Release hands a received tensor's memory back to the transport, which
// reuses it for a later message. Afterwards t.Data is nil, and every slice
// taken from it (Float32s, Float64s, a gorgonia tensor backed by them) must
// no longer be used: it will be overwritten. Releasing is optional (an
// unreleased tensor is garbage collected as usual) and a no-op for a tensor
// that was not received, or was released already.
func (t *Tensor) Release() {
	if t.pooled == nil {
		return
	}
	recvBuffers.put(t.pooled)
	t.pooled, t.Data = nil, nil
}

// Wire format, all integers little-endian:
//
//	magic    [4]byte "PTT\x00"
//	version  uint8   (1)
//	kind     uint8
//	dtype    uint8
//	rank     uint8   (<= MaxRank)
//	step     int64
//	micro    int32
//	chunk    int32
//	dims     rank × int64 (each >= 0)
//	payload  prod(dims) × dtype size bytes, the rest of the message
//
// There is no padding or reserved space, so a decoded message re-encodes to
// exactly the same bytes, and the payload starts 8-byte aligned in the frame.
const (
	tensorMagic   = "PTT\x00"
	tensorVersion = 1
	fixedHeader   = 4 + 4 + 8 + 4 + 4
	// maxPayload keeps every size computation far from int overflow.
	maxPayload = math.MaxInt / 2
)

var errTensorMsg = errors.New("tensor message")

func tensorErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errTensorMsg}, args...)...)
}

// payloadSize validates the metadata (kind, dtype, shape) and returns the
// number of payload bytes the shape needs. Both encoding and decoding use it,
// so whatever decodes also encodes.
func (t *Tensor) payloadSize() (int, error) {
	if t.Kind != Activation && t.Kind != Gradient {
		return 0, tensorErr("unknown kind %d", t.Kind)
	}
	if t.DType.Size() == 0 {
		return 0, tensorErr("unknown dtype %d", t.DType)
	}
	if len(t.Shape) > MaxRank {
		return 0, tensorErr("rank %d exceeds %d", len(t.Shape), MaxRank)
	}
	n := uint64(t.DType.Size())
	for _, d := range t.Shape {
		if d < 0 {
			return 0, tensorErr("negative dimension in shape %v", t.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > maxPayload {
			return 0, tensorErr("shape %v %s is too large", t.Shape, t.DType)
		}
		n = lo
	}
	return int(n), nil
}

// check validates t, including that Data has the length its shape needs.
func (t *Tensor) check() error {
	n, err := t.payloadSize()
	if err != nil {
		return err
	}
	if len(t.Data) != n {
		return tensorErr("payload is %d bytes, shape %v %s needs %d", len(t.Data), t.Shape, t.DType, n)
	}
	return nil
}

// header validates t and returns its encoded header (everything but Data).
func (t *Tensor) header() ([]byte, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	b := make([]byte, fixedHeader+8*len(t.Shape))
	copy(b, tensorMagic)
	b[4], b[5], b[6], b[7] = tensorVersion, byte(t.Kind), byte(t.DType), byte(len(t.Shape))
	binary.LittleEndian.PutUint64(b[8:], uint64(t.Step))
	binary.LittleEndian.PutUint32(b[16:], uint32(t.MicroBatch))
	binary.LittleEndian.PutUint32(b[20:], uint32(t.Chunk))
	for i, d := range t.Shape {
		binary.LittleEndian.PutUint64(b[fixedHeader+8*i:], uint64(d))
	}
	return b, nil
}

// MarshalBinary encodes t in the wire format, copying Data.
func (t *Tensor) MarshalBinary() ([]byte, error) {
	h, err := t.header()
	if err != nil {
		return nil, err
	}
	return append(h, t.Data...), nil
}

// UnmarshalBinary decodes a wire-format message into t, copying the payload.
// It validates every field and never panics or allocates more than len(b).
func (t *Tensor) UnmarshalBinary(b []byte) error {
	if err := t.decode(b); err != nil {
		return err
	}
	t.Data = append([]byte(nil), t.Data...)
	return nil
}

// decode is UnmarshalBinary without the copy: t.Data aliases b. The link
// uses it on frames it owns, saving a copy per received tensor.
func (t *Tensor) decode(b []byte) error {
	if len(b) < fixedHeader {
		return tensorErr("%d bytes is shorter than the %d-byte header", len(b), fixedHeader)
	}
	if string(b[:4]) != tensorMagic {
		return tensorErr("bad magic %q", b[:4])
	}
	if b[4] != tensorVersion {
		return tensorErr("unsupported version %d (want %d)", b[4], tensorVersion)
	}
	rank := int(b[7])
	if rank > MaxRank {
		return tensorErr("rank %d exceeds %d", rank, MaxRank)
	}
	hdr := fixedHeader + 8*rank
	if len(b) < hdr {
		return tensorErr("%d bytes is shorter than the %d-byte header of a rank-%d tensor", len(b), hdr, rank)
	}
	x := Tensor{
		Kind:       Kind(b[5]),
		DType:      DType(b[6]),
		Step:       int64(binary.LittleEndian.Uint64(b[8:])),
		MicroBatch: int32(binary.LittleEndian.Uint32(b[16:])),
		Chunk:      int32(binary.LittleEndian.Uint32(b[20:])),
		Shape:      make([]int, rank),
		Data:       b[hdr:],
	}
	for i := range x.Shape {
		d := binary.LittleEndian.Uint64(b[fixedHeader+8*i:])
		if d > maxPayload {
			return tensorErr("dimension %d of %d is out of range", i, d)
		}
		x.Shape[i] = int(d)
	}
	if err := x.check(); err != nil {
		return err
	}
	*t = x
	return nil
}

// nativeLittle reports whether the host is little-endian, which lets the
// float accessors reinterpret Data in place instead of converting.
var nativeLittle = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func aligned(b []byte, n uintptr) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%n == 0
}

// Float32s returns the payload as float32s, or nil if DType is not Float32.
// On little-endian hosts with aligned data (the case for received tensors and
// the From constructors) the result shares memory with Data: treat it as
// read-only unless you own the tensor.
func (t *Tensor) Float32s() []float32 {
	if t.DType != Float32 {
		return nil
	}
	n := len(t.Data) / 4
	if n == 0 {
		return []float32{}
	}
	if nativeLittle && aligned(t.Data, 4) {
		return unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), n)
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v
}

// Float64s is Float32s for Float64 tensors.
func (t *Tensor) Float64s() []float64 {
	if t.DType != Float64 {
		return nil
	}
	n := len(t.Data) / 8
	if n == 0 {
		return []float64{}
	}
	if nativeLittle && aligned(t.Data, 8) {
		return unsafe.Slice((*float64)(unsafe.Pointer(&t.Data[0])), n)
	}
	v := make([]float64, n)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v
}

// FromFloat32s builds a Float32 tensor, copying vals (so the caller may reuse
// vals at once, while the tensor itself must stay unchanged after Send).
// It fails if len(vals) does not match shape.
func FromFloat32s(kind Kind, step int64, mb int32, shape []int, vals []float32) (*Tensor, error) {
	data := make([]byte, 4*len(vals))
	if nativeLittle {
		copy(data, bytesOf(vals))
	} else {
		for i, v := range vals {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		}
	}
	return newTensor(kind, step, mb, Float32, shape, data)
}

// FromFloat64s is FromFloat32s for float64 values.
func FromFloat64s(kind Kind, step int64, mb int32, shape []int, vals []float64) (*Tensor, error) {
	data := make([]byte, 8*len(vals))
	if nativeLittle {
		copy(data, bytesOf(vals))
	} else {
		for i, v := range vals {
			binary.LittleEndian.PutUint64(data[8*i:], math.Float64bits(v))
		}
	}
	return newTensor(kind, step, mb, Float64, shape, data)
}

// WrapFloat32s is FromFloat32s without the copy where the host is
// little-endian: the tensor's Data is vals' memory. For a caller that hands
// vals over for good, such as a stage sending a fresh copy of its output:
// vals must not change afterwards, not even once Send has returned.
func WrapFloat32s(kind Kind, step int64, mb int32, shape []int, vals []float32) (*Tensor, error) {
	if !nativeLittle {
		return FromFloat32s(kind, step, mb, shape, vals)
	}
	return newTensor(kind, step, mb, Float32, shape, bytesOf(vals))
}

// WrapFloat64s is WrapFloat32s for float64 values.
func WrapFloat64s(kind Kind, step int64, mb int32, shape []int, vals []float64) (*Tensor, error) {
	if !nativeLittle {
		return FromFloat64s(kind, step, mb, shape, vals)
	}
	return newTensor(kind, step, mb, Float64, shape, bytesOf(vals))
}

// bytesOf is the memory of vals, in the host's byte order.
func bytesOf[T float32 | float64](vals []T) []byte {
	if len(vals) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(vals))), len(vals)*int(unsafe.Sizeof(vals[0])))
}

func newTensor(kind Kind, step int64, mb int32, dt DType, shape []int, data []byte) (*Tensor, error) {
	t := &Tensor{Kind: kind, Step: step, MicroBatch: mb, DType: dt, Shape: append([]int{}, shape...), Data: data}
	if err := t.check(); err != nil {
		return nil, err
	}
	return t, nil
}

// clone deep-copies t into a recvBuffers buffer (Pipe uses it so both ends
// never share memory and Release works as over a real link).
func (t *Tensor) clone() *Tensor {
	c := *t
	c.Shape = append([]int{}, t.Shape...)
	c.pooled = recvBuffers.get(len(t.Data))
	c.Data = *c.pooled
	copy(c.Data, t.Data)
	return &c
}
