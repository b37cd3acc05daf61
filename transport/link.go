package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Link is one stage's end of the stream to one neighbour.
type Link interface {
	// Send enqueues t for the neighbour and returns at once unless the
	// bounded send queue is full (backpressure); a background goroutine
	// writes to the stream, so sends overlap with compute. t (including
	// Data) must not be modified after Send: it is written without copying,
	// possibly after Send returns. t must match the link: the dialer (upstream)
	// sends Activation, the listener Gradient, with the handshake's dtype and
	// the shape of its chunk, Shapes[t.Chunk] (a chunk outside Shapes is
	// refused).
	Send(ctx context.Context, t *Tensor) error
	// Recv returns the next tensor from the neighbour in arrival order,
	// checked against the handshake as Send checks outgoing ones (kind,
	// chunk, dtype, shape); the caller owns it (its Data is a fresh buffer,
	// so Float32s views of it may be modified). A background goroutine reads
	// ahead into a bounded queue.
	// Errors name the peer: "stage 2 (127.0.0.1:7102): stream closed:
	// <cause>"; a clean close by the peer wraps io.EOF.
	Recv(ctx context.Context) (*Tensor, error)
	// Peer is the neighbour's handshake (a copy).
	Peer() Hello
	// Close flushes queued sends (bounded by Options.CloseTimeout), closes
	// the stream and stops the link's goroutines. Idempotent.
	Close() error
}

// Options tune Listen, Accept and Dial. Zero values take the defaults.
type Options struct {
	ConnectTimeout time.Duration // how long Dial keeps retrying / Accept waits; default 30s
	QueueDepth     int           // send and receive queue bound; default 4
	CloseTimeout   time.Duration // how long Close waits to flush and for the peer; default 5s

	// Heartbeat is the keep-alive ping interval on a link with nothing to
	// read, and PeerTimeout how long a ping may go unanswered before the
	// link fails; defaults 10s and 5s. The listener pings at Heartbeat (at
	// least 1s), so it notices a hung or vanished dialer within about
	// Heartbeat+PeerTimeout; gRPC lets a dialer ping no more often than every
	// 10s, so the dialer notices a hung listener within max(Heartbeat,
	// 10s)+PeerTimeout.
	Heartbeat   time.Duration
	PeerTimeout time.Duration

	// Token, if set, is a shared secret: Dial presents it and the listener
	// refuses a stream without it before reading anything from it. Without
	// TLS it travels in clear text, so it keeps strangers out but not
	// eavesdroppers.
	Token string
	// TLS, if set, turns on mutual TLS: each side must present a certificate
	// signed by TLS.CA. Both ends of a link need it. Token and TLS may be
	// combined.
	TLS *TLS
	// Listener, if set, is a socket already bound to Listen's address, which
	// Listen serves instead of binding: a process that must publish its
	// address before it knows its links (a rendezvous) binds first, then
	// listens. Listen's exposure rules still apply to the address.
	Listener net.Listener
	// Streams makes Listen also take the replica ring's byte streams
	// (AcceptStream, all_reduce.transport: stream) on its address, told
	// from gRPC connections by their first bytes.
	Streams bool
	// StreamsOverTCP makes DialStream use TCP even to a listener on this
	// host, which it would otherwise reach over the listener's Unix stream
	// socket (streamsock.go): for measuring one against the other.
	StreamsOverTCP bool
	// Logf receives the listener's refusals of unauthenticated connections
	// (which Accept does not report: it keeps waiting for the real
	// neighbour); default log.Printf.
	Logf func(format string, args ...any)
}

func (o Options) withDefaults() Options {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 30 * time.Second
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = 4
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 5 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = defaultHeartbeat
	}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = defaultPeerTimeout
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	return o
}

var (
	// ErrClosed is returned (wrapped) by Send and Recv after Close.
	ErrClosed = errors.New("link closed")
	// ErrPeerClosed is the cause when the neighbour closed its end cleanly.
	ErrPeerClosed = fmt.Errorf("peer closed the link: %w", io.EOF)
)

// checkOutgoing validates a tensor against the link before it is queued, so
// a wrong tensor fails at the Send that made it rather than at the peer.
func checkOutgoing(self, peer Hello, out Kind, t *Tensor) error {
	if err := t.check(); err != nil {
		return fmt.Errorf("send to %s: %w", peer.name(), err)
	}
	if t.Kind != out {
		return fmt.Errorf("send to %s: %s sends %s tensors on this link, not %s", peer.name(), self.who(), out, t.Kind)
	}
	if t.Chunk < 0 || int64(t.Chunk) >= int64(len(self.Shapes)) {
		return fmt.Errorf("send to %s: chunk %d is out of range: the link carries %d chunk(s), 0..%d", peer.name(), t.Chunk, len(self.Shapes), len(self.Shapes)-1)
	}
	if want := self.Shapes[t.Chunk]; t.DType != self.DType || !slices.Equal(t.Shape, want) {
		return fmt.Errorf("send to %s: chunk %d tensor shape %v %s does not match the link's %v %s", peer.name(), t.Chunk, t.Shape, t.DType, want, self.DType)
	}
	if len(t.Data)+fixedHeader+8*len(t.Shape) > maxMsgSize {
		return fmt.Errorf("send to %s: tensor of %d bytes exceeds the %d-byte message limit", peer.name(), len(t.Data), maxMsgSize)
	}
	return nil
}

// checkIncoming validates a received tensor against what the handshake
// agreed, as checkOutgoing does before a send, so that whatever a neighbour
// sends (another build, a bug) reaches the caller only as the kind, chunk,
// dtype and shape the link carries. in is the kind the link receives.
func checkIncoming(self, peer Hello, in Kind, t *Tensor) error {
	if t.Kind != in {
		return fmt.Errorf("%s sent %s tensors on a link that carries %s from it", peer.name(), t.Kind, in)
	}
	if t.Chunk < 0 || int64(t.Chunk) >= int64(len(self.Shapes)) {
		return fmt.Errorf("%s sent %s for chunk %d; this link carries chunks 0-%d", peer.name(), t.Kind, t.Chunk, len(self.Shapes)-1)
	}
	if want := self.Shapes[t.Chunk]; t.DType != self.DType || !slices.Equal(t.Shape, want) {
		return fmt.Errorf("%s sent %s %v %s for chunk %d; the handshake agreed %v %s", peer.name(), t.Kind, t.Shape, t.DType, t.Chunk, want, self.DType)
	}
	return nil
}

// opposite is the kind a link receives when it sends out.
func opposite(out Kind) Kind {
	if out == Activation {
		return Gradient
	}
	return Activation
}

// msgStream is the part of a gRPC client or server stream a link uses.
type msgStream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// streamLink is a Link over a gRPC stream, the same for both sides. One
// writer goroutine owns SendMsg and one reader goroutine owns RecvMsg, as
// gRPC allows; the queues between them and the caller give backpressure and
// read-ahead.
type streamLink struct {
	self, peer   Hello
	out          Kind
	stream       msgStream
	closeTimeout time.Duration
	// shutdown ends the stream once the writer stopped or the flush timed
	// out (the side-specific part of Close); it must make RecvMsg and
	// SendMsg return.
	shutdown func(writerExited bool, deadline time.Time)
	// explain, if set, rewords a stream error from the reader.
	explain func(error) error

	sendQ, recvQ chan *Tensor
	closing      chan struct{} // closed by Close
	dead         chan struct{} // closed on the first failure
	writerDone   chan struct{}
	readerDone   chan struct{}

	failOnce  sync.Once
	err       error // first failure; read after dead is closed
	readErr   error // why the reader stopped; read after recvQ is closed
	closeOnce sync.Once
	closeErr  error
}

func newStreamLink(stream msgStream, self, peer Hello, out Kind, opts Options) *streamLink {
	return &streamLink{
		self: self, peer: peer, out: out, stream: stream, closeTimeout: opts.CloseTimeout,
		sendQ:      make(chan *Tensor, opts.QueueDepth),
		recvQ:      make(chan *Tensor, opts.QueueDepth),
		closing:    make(chan struct{}),
		dead:       make(chan struct{}),
		writerDone: make(chan struct{}),
		readerDone: make(chan struct{}),
	}
}

// start launches the goroutines; shutdown must be set first.
func (l *streamLink) start() {
	go l.writeLoop()
	go l.readLoop()
}

func (l *streamLink) fail(err error) {
	l.failOnce.Do(func() {
		l.err = err
		close(l.dead)
	})
}

func (l *streamLink) streamErr(cause error) error {
	return fmt.Errorf("%s: stream closed: %w", l.peer.name(), cause)
}

func (l *streamLink) closedErr() error { return fmt.Errorf("%s: %w", l.peer.name(), ErrClosed) }

func (l *streamLink) Peer() Hello { return l.peer.clone() }

func (l *streamLink) Send(ctx context.Context, t *Tensor) error {
	if err := checkOutgoing(l.self, l.peer, l.out, t); err != nil {
		return err
	}
	// Checked first so a closed or broken link never accepts a tensor just
	// because the queue has room.
	select {
	case <-l.closing:
		return l.closedErr()
	case <-l.dead:
		return l.streamErr(l.err)
	default:
	}
	select {
	case l.sendQ <- t:
		// Let the writer goroutine (and gRPC's, after it) run now. A stage
		// with one core has GOMAXPROCS 1, and its compute goroutine would
		// otherwise keep the only P until it blocks or is preempted, leaving
		// the tensor in the queue for milliseconds while the neighbour waits
		// for it. Yielding hands the bytes to the kernel first: 1F1B with a
		// core per stage went from 0.77 to 0.92 of its simulated makespan
		// (docs/benchmarks.md). With spare Ps the yield costs a microsecond.
		runtime.Gosched()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.closing:
		return l.closedErr()
	case <-l.dead:
		return l.streamErr(l.err)
	}
}

func (l *streamLink) Recv(ctx context.Context) (*Tensor, error) {
	select {
	case <-l.closing:
		return nil, l.closedErr()
	default:
	}
	select {
	case t, ok := <-l.recvQ:
		if !ok {
			return nil, l.streamErr(l.readErr)
		}
		if err := checkIncoming(l.self, l.peer, opposite(l.out), t); err != nil {
			t.Release()
			return nil, err
		}
		return t, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closing:
		return nil, l.closedErr()
	}
}

// writeLoop sends queued tensors until Close has drained the queue or the
// link fails.
func (l *streamLink) writeLoop() {
	defer close(l.writerDone)
	for {
		var t *Tensor
		select {
		case t = <-l.sendQ:
		case <-l.dead:
			return
		case <-l.closing:
			select {
			case t = <-l.sendQ:
			default:
				return
			}
		}
		hdr, err := t.header()
		if err == nil {
			err = l.stream.SendMsg(frame{hdr, t.Data})
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// gRPC client streams report the real cause to RecvMsg.
				err = errors.New("stream ended by peer while sending")
			}
			l.fail(err)
			return
		}
	}
}

// readLoop reads ahead into recvQ until the stream ends. After Close it keeps
// reading (and drops tensors) so the peer's final messages and end of stream
// are consumed while Close waits for them.
func (l *streamLink) readLoop() {
	defer close(l.readerDone)
	defer close(l.recvQ)
	for {
		var m received
		err := l.stream.RecvMsg(&m)
		t := new(Tensor)
		if err == nil {
			if err = t.decode(*m.buf); err != nil {
				recvBuffers.put(m.buf)
				err = fmt.Errorf("protocol error: %w", err)
			} else {
				t.pooled = m.buf
			}
		} else if errors.Is(err, io.EOF) {
			err = ErrPeerClosed
		} else if l.explain != nil {
			err = l.explain(err)
		}
		if err != nil {
			l.readErr = err
			l.fail(err)
			return
		}
		select {
		case l.recvQ <- t:
		case <-l.closing:
			t.Release()
		}
	}
}

func (l *streamLink) Close() error {
	l.closeOnce.Do(func() {
		deadline := time.Now().Add(l.closeTimeout)
		close(l.closing)
		timer := time.NewTimer(l.closeTimeout)
		defer timer.Stop()
		exited := true
		select {
		case <-l.writerDone:
		case <-timer.C:
			exited = false
		}
		l.shutdown(exited, deadline)
		<-l.writerDone
		<-l.readerDone
		if !exited {
			l.closeErr = fmt.Errorf("%s: close: queued tensors not delivered within %v", l.peer.name(), l.closeTimeout)
		}
	})
	return l.closeErr
}

// isDead reports whether the link has failed.
func (l *streamLink) isDead() bool {
	select {
	case <-l.dead:
		return true
	default:
		return false
	}
}

// Queues reports how many tensors wait in the link's send queue (not yet written
// to the stream) and receive queue (read ahead, not yet taken by Recv): the
// backpressure a stage's metrics show.
func (l *streamLink) Queues() (send, recv int) { return len(l.sendQ), len(l.recvQ) }

// QueueReporter is implemented by links that can report their queue depths.
type QueueReporter interface {
	Queues() (send, recv int)
}
