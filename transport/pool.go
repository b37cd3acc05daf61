package transport

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/mem"
)

// framePool is the buffer pool gRPC reads DATA frames into. gRPC's default
// pool zeroes every buffer it hands out; a frame buffer is filled whole by
// the read that follows (io.ReadFull of exactly its length), so zeroing it is
// pure cost: about a fifth of the receiver's CPU time with 4 MiB tensors.
// Sizes up to one HTTP/2 frame share one free list; anything else (rare:
// gRPC's own small temporaries) is allocated fresh.
type framePool struct{ frames sync.Pool }

// maxFrame is gRPC's largest DATA frame payload (http2MaxFrameLen).
const maxFrame = 16 << 10

var wirePool = &framePool{frames: sync.Pool{New: func() any {
	b := make([]byte, maxFrame)
	return &b
}}}

func (p *framePool) Get(size int) *[]byte {
	if size > maxFrame {
		b := make([]byte, size)
		return &b
	}
	b := p.frames.Get().(*[]byte)
	*b = (*b)[:size]
	return b
}

func (p *framePool) Put(b *[]byte) {
	if cap(*b) != maxFrame {
		return
	}
	*b = (*b)[:maxFrame]
	p.frames.Put(b)
}

var _ mem.BufferPool = (*framePool)(nil)

// recvBuffers recycles the buffers received tensors are decoded into, so a
// stage that hands its tensors back (Tensor.Release) receives into warm
// memory instead of a fresh, zeroed allocation per message. Buffers come in
// power-of-two classes; a tensor never released is simply collected.
var recvBuffers payloadPool

// Every message up to 1 GiB (the largest a link accepts) is pooled, small
// ones too: they cost the pool little, and it means the tests' small tensors
// go through the same reuse as a real run's.
const (
	minPooledClass = 0
	maxPooledClass = 30 // 1 GiB
)

type payloadPool struct {
	classes [maxPooledClass + 1]sync.Pool
}

// sizeClass is the smallest c with 1<<c >= n.
func sizeClass(n int) int { return bits.Len(uint(n - 1)) }

// get returns a buffer of length n whose contents are undefined: the caller
// overwrites all of it.
func (p *payloadPool) get(n int) *[]byte {
	c := sizeClass(n)
	if c < minPooledClass || c > maxPooledClass {
		b := make([]byte, n)
		return &b
	}
	if v, ok := p.classes[c].Get().(*[]byte); ok {
		*v = (*v)[:n]
		return v
	}
	b := make([]byte, n, 1<<c)
	return &b
}

func (p *payloadPool) put(b *[]byte) {
	c := sizeClass(cap(*b))
	if c < minPooledClass || c > maxPooledClass || cap(*b) != 1<<c {
		return
	}
	if poisonReleased.Load() {
		poison(*b)
	}
	p.classes[c].Put(b)
}

// poisonReleased makes Release overwrite a tensor's memory with 0xff bytes
// (NaN as float32 or float64), so a use after Release shows up in the
// results instead of depending on when the buffer happens to be reused.
var poisonReleased atomic.Bool

// PoisonReleased turns that checking mode on or off (tests turn it on).
func PoisonReleased(on bool) { poisonReleased.Store(on) }

func poison(b []byte) {
	for i := range b {
		b[i] = 0xff
	}
}
