package transport

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The replica ring's data path (all_reduce.transport: stream) moves the
// all-reduce's chunks as frames on a plain byte stream beside the ring's
// gRPC link: a fixed header, then the payload, the chunk's values in the
// wire dtype, little-endian, nothing between frames. The receiver knows
// from the all-reduce's plan exactly which frame comes next (step, phase,
// tag) and how long it is, so the header is checked against that before a
// byte of the payload is read, and a frame that is not the expected one is
// refused rather than summed.
//
// Frame header, 24 bytes, integers little-endian:
//
//	magic   [2]byte "PF"
//	dtype   uint8
//	zero    uint8
//	phase   int32   the ring's phase (Tensor.MicroBatch on the gRPC link)
//	tag     int32   the chunk's tag (Tensor.Chunk)
//	length  uint32  payload bytes
//	step    int64
const (
	frameMagic      = "PF"
	FrameHeaderSize = 24
	// MaxFramePayload bounds one frame's payload, as maxMsgSize bounds a
	// gRPC message: a ring chunk is at most a bucket.
	MaxFramePayload = maxMsgSize
)

// Frame names one message of the ring: which step, phase and chunk tag it
// belongs to, and its payload's dtype and length in bytes.
type Frame struct {
	Step  int64
	Phase int32
	Tag   int32
	DType DType
	Len   int
}

// appendHeader encodes f's header.
func (f Frame) appendHeader(b []byte) []byte {
	b = append(b, frameMagic...)
	b = append(b, byte(f.DType), 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(f.Phase))
	b = binary.LittleEndian.AppendUint32(b, uint32(f.Tag))
	b = binary.LittleEndian.AppendUint32(b, uint32(f.Len))
	return binary.LittleEndian.AppendUint64(b, uint64(f.Step))
}

// check refuses a frame this side would not send: an unknown dtype, a
// length beyond MaxFramePayload or not a whole number of elements.
func (f Frame) check() error {
	size := f.DType.Size()
	if size == 0 {
		return fmt.Errorf("frame of unknown dtype %d", uint8(f.DType))
	}
	if f.Len < 0 || f.Len > MaxFramePayload || f.Len%size != 0 {
		return fmt.Errorf("frame payload of %d bytes: not a whole number of %s values within the %d-byte limit", f.Len, f.DType, MaxFramePayload)
	}
	return nil
}

// decodeFrameHeader decodes a frame header and checks it against want, the
// frame the receiver expects next; peer names the sender in errors. It
// checks the framing first (magic, the zero byte, a known dtype, a length
// within MaxFramePayload), then that step, phase, tag, dtype and length are
// want's, so a frame of another step or chunk, or one longer than the chunk
// it claims to be, is refused before its payload is read or any memory is
// set aside for it.
func decodeFrameHeader(b []byte, want Frame, peer string) (Frame, error) {
	if len(b) != FrameHeaderSize {
		return Frame{}, fmt.Errorf("%s: protocol error: a frame header is %d bytes, got %d", peer, FrameHeaderSize, len(b))
	}
	if string(b[:2]) != frameMagic || b[3] != 0 {
		return Frame{}, fmt.Errorf("%s: protocol error: expected a frame header, got bytes starting %q", peer, b[:4])
	}
	f := Frame{
		DType: DType(b[2]),
		Phase: int32(binary.LittleEndian.Uint32(b[4:])),
		Tag:   int32(binary.LittleEndian.Uint32(b[8:])),
		Step:  int64(binary.LittleEndian.Uint64(b[16:])),
	}
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	if n > MaxFramePayload || n > math.MaxInt {
		return Frame{}, fmt.Errorf("%s: protocol error: frame payload of %d bytes exceeds the %d-byte limit", peer, n, MaxFramePayload)
	}
	f.Len = int(n)
	if f.DType.Size() == 0 {
		return Frame{}, fmt.Errorf("%s: protocol error: frame of unknown dtype %d", peer, b[2])
	}
	if f.Step != want.Step || f.Phase != want.Phase || f.Tag != want.Tag {
		return Frame{}, fmt.Errorf("%s sent step %d phase %d tag %d, expected step %d phase %d tag %d",
			peer, f.Step, f.Phase, f.Tag, want.Step, want.Phase, want.Tag)
	}
	if f.DType != want.DType || f.Len != want.Len {
		return Frame{}, fmt.Errorf("%s sent %d bytes of %s for step %d phase %d tag %d, expected %d bytes of %s",
			peer, f.Len, f.DType, f.Step, f.Phase, f.Tag, want.Len, want.DType)
	}
	return f, nil
}

// FloatBytes is the memory of vals in the host's byte order: the payload of
// a frame of vals where the host is little-endian (LittleEndianHost), sent
// and received in place.
func FloatBytes[T float32 | float64](vals []T) []byte { return bytesOf(vals) }

// LittleEndianHost reports whether floats in memory are already in the
// frames' byte order, which the stream path needs to move them uncopied.
func LittleEndianHost() bool { return nativeLittle }

// DecodeFloat32s widens wire, the payload of n values of dtype dt (Float32,
// BFloat16 or Float16, little-endian), into dst[:n].
func DecodeFloat32s(dt DType, wire []byte, dst []float32) error {
	switch dt {
	case Float32:
		if len(wire) != 4*len(dst) {
			break
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(wire[4*i:]))
		}
		return nil
	case BFloat16, Float16:
		if len(wire) != 2*len(dst) {
			break
		}
		halves := loadHalves(wire)
		if !decodeHalvesSIMD(dt, halves, dst) {
			decodeHalves(dt, halves, dst)
		}
		return nil
	default:
		return fmt.Errorf("cannot decode %s values as float32", dt)
	}
	return fmt.Errorf("%d bytes of %s for %d values", len(wire), dt, len(dst))
}

// EncodeFloat32s rounds vals to dt (Float32, BFloat16 or Float16) into
// wire, which holds len(vals) values of dt.
func EncodeFloat32s(dt DType, vals []float32, wire []byte) error {
	if len(wire) != len(vals)*dt.Size() {
		return fmt.Errorf("%d bytes of %s for %d values", len(wire), dt, len(vals))
	}
	switch dt {
	case Float32:
		for i, v := range vals {
			binary.LittleEndian.PutUint32(wire[4*i:], math.Float32bits(v))
		}
	case BFloat16, Float16:
		halves := uint16View(wire)
		if !encodeHalvesSIMD(dt, vals, halves) {
			encodeHalves(dt, vals, halves)
		}
		storeHalves(wire, halves)
	default:
		return fmt.Errorf("cannot encode float32 values as %s", dt)
	}
	return nil
}
