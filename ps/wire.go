package ps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/transport"
)

// The servers' stream protocol. A message is a header (op, worker,
// stage, step, and the names, dtypes and shapes of the tensors it
// carries), followed by the tensors' data, in order, cut into frames of
// at most frameBytes: a transport.Service message is bounded (16 MiB), a
// stage's tensors are not. Every request gets one answer:
//
//	hello (worker's initial weights) -> ok (version)
//	hello, rejoin (at step)          -> ok (version; final: the run is over)
//	push (step's gradients)          -> ok (version, dropped)
//	pull (step about to be computed) -> weights (version, tensors)
//	leave (the worker's last push)   -> ok
//	bye                              -> ok
//
// A final pull (after leave) waits for every worker to leave: in async
// mode the others' pushes still change the weights after one's last.
const (
	opHello byte = iota + 1
	opPush
	opPull
	opBye
	opLeave
	opOK
	opWeights
)

const frameBytes = 4 << 20

// header is a message's first part.
type header struct {
	op            byte
	worker, stage int
	step          int64 // a push's or pull's step; an answer's version
	dropped       bool  // an ok to a push that came too late
	final         bool  // a pull of the run's final weights; an ok to a rejoin: the run's training is over
	rejoin        bool  // a hello of a worker restarted after it left, at step (async)
	tensors       []engine.Weight
	// half is the 16-bit wire dtype (transport.Float16 or BFloat16) the
	// message's float32 tensors travel in, 0 for none (transport
	// compression); in a pull, the dtype its answer is to use.
	half transport.DType
	// losses are a push's micro-batch losses (from the stage that computes
	// the loss), and in a pull's answer those of the update's workers, in
	// worker order.
	losses []float64
}

func (h header) marshal() []byte {
	b := []byte{h.op}
	b = binary.LittleEndian.AppendUint32(b, uint32(h.worker))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.stage))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.step))
	flag := byte(0)
	if h.dropped {
		flag |= 1
	}
	if h.final {
		flag |= 2
	}
	if h.rejoin {
		flag |= 4
	}
	b = append(b, flag, byte(h.half))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.tensors)))
	for _, t := range h.tensors {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(t.Name)))
		b = append(b, t.Name...)
		b = append(b, byte(h.wireSize(t.Value)))
		shape := t.Value.Shape()
		b = append(b, byte(len(shape)))
		for _, d := range shape {
			b = binary.LittleEndian.AppendUint32(b, uint32(d))
		}
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.losses)))
	for _, l := range h.losses {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(l))
	}
	return b
}

var errShort = errors.New("ps: message cut short")

// unmarshalHeader reads a header, allocating its tensors (zeroed) for the
// data frames that follow.
func unmarshalHeader(b []byte) (header, error) {
	var h header
	if len(b) < 23 {
		return h, errShort
	}
	h.op = b[0]
	h.worker = int(binary.LittleEndian.Uint32(b[1:]))
	h.stage = int(binary.LittleEndian.Uint32(b[5:]))
	h.step = int64(binary.LittleEndian.Uint64(b[9:]))
	h.dropped, h.final, h.rejoin = b[17]&1 != 0, b[17]&2 != 0, b[17]&4 != 0
	h.half = transport.DType(b[18])
	if h.half != 0 && h.half != transport.Float16 && h.half != transport.BFloat16 {
		return h, fmt.Errorf("ps: wire dtype %d", b[18])
	}
	n := int(binary.LittleEndian.Uint32(b[19:]))
	b = b[23:]
	if n > len(b) {
		return h, errShort
	}
	for range n {
		if len(b) < 2 {
			return h, errShort
		}
		l := int(binary.LittleEndian.Uint16(b))
		if len(b) < 4+l {
			return h, errShort
		}
		name, size, dims := string(b[2:2+l]), int(b[2+l]), int(b[3+l])
		b = b[4+l:]
		if len(b) < 4*dims {
			return h, errShort
		}
		shape := make([]int, dims)
		total := 1
		for i := range shape {
			shape[i] = int(binary.LittleEndian.Uint32(b[4*i:]))
			total *= shape[i]
		}
		b = b[4*dims:]
		if total > 1<<31 {
			return h, fmt.Errorf("ps: tensor %s of %v elements", name, shape)
		}
		if size == 2 && h.half == 0 {
			return h, fmt.Errorf("ps: tensor %s has 2-byte elements in an uncompressed message", name)
		}
		var dt tensor.Dtype
		switch size {
		case 4, 2:
			dt = tensor.Float32
		case 8:
			dt = tensor.Float64
		default:
			return h, fmt.Errorf("ps: tensor %s has %d-byte elements", name, size)
		}
		h.tensors = append(h.tensors, engine.Weight{Name: name, Value: tensor.New(tensor.Of(dt), tensor.WithShape(shape...))})
	}
	if len(b) < 4 {
		return h, errShort
	}
	n = int(binary.LittleEndian.Uint32(b))
	if b = b[4:]; len(b) != 8*n {
		return h, errShort
	}
	for i := range n {
		h.losses = append(h.losses, math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
	}
	return h, nil
}

// wireSize is the bytes each of t's elements takes on the wire: 2 for a
// float32 tensor of a compressed message.
func (h header) wireSize(t *tensor.Dense) int {
	switch {
	case t.Dtype() == tensor.Float64:
		return 8
	case h.half != 0:
		return 2
	}
	return 4
}

// payload is what h's tensors' data take on the wire.
func (h header) payload() int64 {
	var n int64
	for _, t := range h.tensors {
		n += int64(t.Value.Shape().TotalSize()) * int64(h.wireSize(t.Value))
	}
	return n
}

// wireBytes is t's data as it travels: its bytes, or its float32 values
// rounded to h.half.
func (h header) wireBytes(t *tensor.Dense) []byte {
	if v, ok := t.Data().([]float32); ok && h.half != 0 {
		tt, err := transport.FromFloat32sAs(h.half, transport.Gradient, 0, 0, []int{len(v)}, v)
		if err == nil {
			return tt.Data
		}
	}
	return bytesOf(t)
}

// bytesOf is t's data as bytes, in the host's order: the processes of a
// run share one architecture, as the pipeline links assume too.
func bytesOf(t *tensor.Dense) []byte {
	switch v := t.Data().(type) {
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
	case []float64:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 8*len(v))
	}
	return nil
}

// send writes h and its tensors' data on s. The frames are copies: a
// stream may still hold a message after Send returns.
func send(s *transport.ServiceStream, h header) error {
	if err := s.Send(h.marshal()); err != nil {
		return err
	}
	var frame []byte
	flush := func() error {
		if len(frame) == 0 {
			return nil
		}
		err := s.Send(frame)
		frame = nil
		return err
	}
	for _, t := range h.tensors {
		data := h.wireBytes(t.Value)
		for len(data) > 0 {
			if frame == nil {
				frame = make([]byte, 0, frameBytes)
			}
			n := copy(frame[len(frame):cap(frame)], data)
			frame, data = frame[:len(frame)+n], data[n:]
			if len(frame) == cap(frame) {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	return flush()
}

// recv reads a message: its header and its tensors' data.
func recv(s *transport.ServiceStream) (header, error) {
	b, err := s.Recv()
	if err != nil {
		return header{}, err
	}
	h, err := unmarshalHeader(b)
	if err != nil {
		return h, err
	}
	var frame []byte
	for _, t := range h.tensors {
		dst := bytesOf(t.Value)
		half := h.wireSize(t.Value) == 2
		if half {
			dst = make([]byte, len(dst)/2)
		}
		raw := dst
		for len(dst) > 0 {
			if len(frame) == 0 {
				if frame, err = s.Recv(); err != nil {
					return h, err
				}
			}
			n := copy(dst, frame)
			dst, frame = dst[n:], frame[n:]
		}
		if half {
			wide := (&transport.Tensor{DType: h.half, Data: raw}).AsFloat32s()
			copy(t.Value.Data().([]float32), wide)
		}
	}
	if len(frame) > 0 {
		return h, fmt.Errorf("ps: %d bytes beyond the tensors of a message", len(frame))
	}
	return h, nil
}
