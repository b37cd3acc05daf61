package collective

import (
	"context"
	"fmt"
	"io"
	"unsafe"

	"github.com/pipetrain/pipetrain/transport"
)

// The ring over streams (Ring.Out and Ring.In, all_reduce.transport:
// stream). The messages, their order and the additions are AllReduce's
// over links; only the way the bytes move differs. A chunk goes out from
// vals' own memory (a frame header and the chunk's bytes in one writev)
// where its values are already the wire's bytes (float32 or float64 on a
// little-endian host); the chunk that comes in is read into a small
// scratch block by block and each block added into vals in place, or, in
// the all-gather, read straight into vals. So the only copies are the
// kernel's, and each element is still summed as acc += incoming, in the
// plan's order: the same bits as over links.

// recvBlock is how many bytes of an incoming chunk are read before they are
// added: small enough to stay in the cache between the read and the add,
// large enough that the reads cost few system calls.
const recvBlock = 256 << 10

// streams reports whether AllReduce's messages travel on r's streams.
func (r *Ring) streams() bool { return r.Out != nil && r.In != nil }

// sendStream sends vals as the frame of (step, phase, tag).
func sendStream[T float32 | float64](ctx context.Context, r *Ring, step int64, phase, tag int, vals []T) error {
	data, err := r.wireBytes(vals)
	if err != nil {
		return err
	}
	f := transport.Frame{Step: step, Phase: int32(phase), Tag: int32(tag), DType: r.DType}
	if err := r.Out.Send(ctx, f, data); err != nil {
		return fmt.Errorf("to %s: %w", r.name(r.Rank+1), err)
	}
	r.Sent += int64(len(data))
	return nil
}

// wireBytes is vals as the frame's payload: vals' own memory where the wire
// holds its values as they are in memory, else a rounded copy (16-bit
// compression, or a big-endian host).
func (r *Ring) wireBytes(vals any) ([]byte, error) {
	switch v := vals.(type) {
	case []float64:
		if r.DType != transport.Float64 {
			return nil, fmt.Errorf("all-reduce of float64 values over a %s ring", r.DType)
		}
		if transport.LittleEndianHost() {
			return transport.FloatBytes(v), nil
		}
		t, err := transport.FromFloat64s(transport.Activation, 0, 0, []int{len(v)}, v)
		if err != nil {
			return nil, err
		}
		return t.Data, nil
	case []float32:
		if r.DType == transport.Float32 && transport.LittleEndianHost() {
			return transport.FloatBytes(v), nil
		}
		out := make([]byte, len(v)*r.DType.Size())
		return out, transport.EncodeFloat32s(r.DType, v, out)
	}
	return nil, fmt.Errorf("all-reduce of %T", vals)
}

// recvStream reads the frame of (step, phase, tag) and combines it into
// dst: added (add) or stored (set).
func recvStream[T float32 | float64](ctx context.Context, r *Ring, step int64, phase, tag int, dst []T, summing bool) error {
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, r.Timeout, fmt.Errorf("%s sent nothing for %v", r.name(r.Rank-1), r.Timeout))
		defer cancel()
	}
	size := r.DType.Size()
	f := transport.Frame{Step: step, Phase: int32(phase), Tag: int32(tag), DType: r.DType, Len: len(dst) * size}
	err := r.In.Recv(ctx, f, func(payload io.Reader) error {
		if inPlace[T](r.DType) {
			if !summing {
				_, err := io.ReadFull(payload, transport.FloatBytes(dst))
				return err
			}
			return readAdding(payload, dst, r.scratchFor(len(dst)*size))
		}
		return readWidening(payload, r.DType, dst, r.scratchFor(len(dst)*size), summing)
	})
	if err != nil {
		return fmt.Errorf("from %s: %w", r.name(r.Rank-1), err)
	}
	return nil
}

// inPlace reports whether values of type T are the wire's bytes in memory.
func inPlace[T float32 | float64](dt transport.DType) bool {
	var zero T
	switch any(zero).(type) {
	case float32:
		return dt == transport.Float32 && transport.LittleEndianHost()
	case float64:
		return dt == transport.Float64 && transport.LittleEndianHost()
	}
	return false
}

// scratchFor is the ring's receive block, at most recvBlock bytes, kept
// between calls (a Ring is used by one goroutine at a time).
func (r *Ring) scratchFor(n int) []byte {
	n = min(n, recvBlock)
	if cap(r.scratch) < n {
		r.scratch = alignedBytes(recvBlock)
	}
	return r.scratch
}

// alignedBytes is n bytes aligned for float64s.
func alignedBytes(n int) []byte {
	w := make([]float64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)[:n]
}

// readAdding reads len(dst) values from payload block by block into
// scratch and adds each block into dst in place.
func readAdding[T float32 | float64](payload io.Reader, dst []T, scratch []byte) error {
	var zero T
	size := int(unsafe.Sizeof(zero))
	per := len(scratch) / size
	block := unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(scratch))), per)
	for lo := 0; lo < len(dst); lo += per {
		hi := min(len(dst), lo+per)
		in := block[:hi-lo]
		if _, err := io.ReadFull(payload, transport.FloatBytes(in)); err != nil {
			return err
		}
		add(dst[lo:hi], in)
	}
	return nil
}

// readWidening is readAdding (or, not summing, a plain store) for a wire
// dtype that is not T's memory: each block is decoded first.
func readWidening[T float32 | float64](payload io.Reader, dt transport.DType, dst []T, scratch []byte, summing bool) error {
	size := dt.Size()
	per := len(scratch) / size
	switch d := any(dst).(type) {
	case []float32:
		vals := make([]float32, min(per, len(d)))
		for lo := 0; lo < len(d); lo += per {
			hi := min(len(d), lo+per)
			wire := scratch[:(hi-lo)*size]
			if _, err := io.ReadFull(payload, wire); err != nil {
				return err
			}
			in := vals[:hi-lo]
			if err := transport.DecodeFloat32s(dt, wire, in); err != nil {
				return err
			}
			if summing {
				add(d[lo:hi], in)
			} else {
				copy(d[lo:hi], in)
			}
		}
		return nil
	case []float64:
		wire := make([]byte, 8*len(d))
		if _, err := io.ReadFull(payload, wire); err != nil {
			return err
		}
		t := &transport.Tensor{DType: transport.Float64, Shape: []int{len(d)}, Data: wire}
		in := t.Float64s()
		if summing {
			add(d, in)
		} else {
			copy(d, in)
		}
		return nil
	}
	return fmt.Errorf("all-reduce of %T", dst)
}

// moveOnlyStreams is moveOnly over r's streams: what arrives is read into
// a sink and dropped.
func moveOnlyStreams(ctx context.Context, r *Ring, step int64, p Plan, vals []float32) error {
	sink := make([]float32, p.BucketElems/r.Size+1)
	for b := range p.Buckets {
		for t := range 2 * (r.Size - 1) {
			v, tag := bucketChunk(r, 0, p, b, r.Rank-t, vals)
			if err := sendStream(ctx, r, step, t, tag, v); err != nil {
				return err
			}
			in, want := bucketChunk(r, 0, p, b, r.Rank-t-1, vals)
			if err := recvStream(ctx, r, step, t, want, sink[:len(in)], false); err != nil {
				return err
			}
		}
	}
	return nil
}
