package transport

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Ring streams: the replica ring's data path beside its gRPC link
// (all_reduce.transport: stream). gRPC copies every byte into its own
// buffers and cuts it into 16 KiB HTTP/2 frames, and on this machine it
// carries half to two thirds of what a raw socket does (docs/transport.md);
// a ring stream is the raw socket: frames (streamframe.go) written from
// the caller's buffers with one writev, read into the caller's buffers.
//
// A stream is opened only after the gRPC link between the same two
// processes has passed its handshake, on the listener's own address (TCP,
// or its Unix socket for processes of one host), or on its stream socket
// when the dialer is on the same host (streamsock.go): the listener's socket
// tells a stream from a gRPC connection by its first four bytes, the
// stream preface "PTRS". Then, in order:
//
//   - with TLS, the TLS handshake, each side presenting a certificate the
//     other's CA signed, as on every link;
//   - the dialer's token proof, 32 bytes: SHA-256 of the transport token
//     (zeros without one). The listener compares it in constant time and
//     refuses a stream without the right one before reading anything more;
//   - the dialer's hello (the handshake's binary format, a uint32 length
//     first, bounded by helloLimit), which must be the hello of the peer
//     whose gRPC link the listener accepted for that group;
//   - the listener's answer, one byte 0, or 1 and a uint32 length and the
//     refusal's text.
//
// After that the dialer only writes frames and the listener only reads
// them. A stranger is logged (Options.Logf) and never reported to
// AcceptStream, which keeps waiting for the real neighbour.
const (
	streamPreface = "PTRS"
	tokenProofLen = sha256.Size
	// maxStreamRefusal bounds the refusal text a dialer reads.
	maxStreamRefusal = 8 << 10
)

// tokenProof is what a dialer presents for token: its SHA-256, or zeros
// without a token.
func tokenProof(token string) [tokenProofLen]byte {
	if token == "" {
		return [tokenProofLen]byte{}
	}
	return sha256.Sum256([]byte(token))
}

// proofMatches compares a presented proof with the token's in constant time.
func proofMatches(got []byte, token string) bool {
	want := tokenProof(token)
	return subtle.ConstantTimeCompare(got, want[:]) == 1
}

// muxListener serves a Server's socket to gRPC and to ring streams: each
// accepted connection's first bytes decide which gets it. The peek runs on
// the connection's own goroutine, so a silent client holds up no other.
type muxListener struct {
	net.Listener
	grpcConns chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	peekFor   time.Duration
	// stream takes a connection that sent the stream preface (consumed).
	stream func(net.Conn)
}

func newMuxListener(lis net.Listener, peekFor time.Duration, stream func(net.Conn)) *muxListener {
	m := &muxListener{Listener: lis, grpcConns: make(chan net.Conn), done: make(chan struct{}), peekFor: peekFor, stream: stream}
	go m.acceptLoop()
	return m
}

func (m *muxListener) acceptLoop() {
	for {
		c, err := m.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.Close()
			return
		}
		go m.route(c)
	}
}

// route reads a new connection's first bytes and hands it on.
func (m *muxListener) route(c net.Conn) {
	head, err := readPreface(c, m.peekFor)
	if err == nil && string(head) == streamPreface {
		m.stream(c)
		return
	}
	if len(head) == 0 && err != nil {
		c.Close()
		return
	}
	// gRPC's own preface or TLS handshake, or garbage gRPC refuses.
	select {
	case m.grpcConns <- &prefixConn{Conn: c, prefix: head}:
	case <-m.done:
		c.Close()
	}
}

func (m *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.grpcConns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *muxListener) Close() error {
	var err error
	m.closeOnce.Do(func() {
		close(m.done)
		err = m.Listener.Close()
	})
	return err
}

// prefixConn replays the bytes the mux read before handing c to gRPC.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// streamResult is a stream for AcceptStream, or why the dialer of the
// role's peer was refused.
type streamResult struct {
	in  *StreamIn
	err error
}

// serveStream authenticates a connection that sent the stream preface and
// hands it to the AcceptStream of its group. It runs on the connection's
// goroutine.
func (s *Server) serveStream(c net.Conn) {
	who := s.roles[0].self.name()
	remote := remoteName(c)
	deadline := time.Now().Add(s.opts.ConnectTimeout)
	c.SetDeadline(deadline)
	refuse := func(reason string) {
		s.opts.Logf("%s: refused a ring stream from %s: %s", who, remote, reason)
		writeStreamAnswer(c, reason)
		c.Close()
	}
	if s.opts.TLS != nil {
		tc := tls.Server(c, s.opts.TLS.serverConfig())
		if err := tc.Handshake(); err != nil {
			s.opts.Logf("%s: refused a ring stream from %s: TLS handshake failed: %v", who, remote, err)
			c.Close()
			return
		}
		c = tc
	}
	var proof [tokenProofLen]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		s.opts.Logf("%s: ring stream from %s ended before its token: %v", who, remote, err)
		c.Close()
		return
	}
	if s.opts.Token != "" && !proofMatches(proof[:], s.opts.Token) {
		refuse(badTokenMsg)
		return
	}
	hs, err := readStreamHello(c, s.helloLimit())
	if err != nil {
		refuse(err.Error())
		return
	}
	r := s.role(hs.Hello.Group)
	if r == nil || hs.Hello.Group != ReplicaGroup {
		refuse(fmt.Sprintf("a ring stream for a %s link reached a listener that takes them for replica ring links only (it serves %s)", hs.Hello.Group, s.serves()))
		return
	}
	if err := s.admitStream(r, hs.Hello); err != nil {
		refuse(err.Error())
		return
	}
	if err := writeStreamAnswer(c, ""); err != nil {
		s.releaseStream(r)
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	in := &StreamIn{conn: c, self: r.self, peer: hs.Hello.clone()}
	// admitStream lets one stream through per role, so the send never
	// waits; but one admitted as Close runs must not stay in the queue
	// Close has already drained.
	s.handlers.mu.Lock()
	defer s.handlers.mu.Unlock()
	if s.handlers.closed {
		c.Close()
		return
	}
	r.streams <- streamResult{in: in}
}

// admitStream accepts a stream's hello for role r: r's gRPC link must be
// up, and the stream must come from the process at its other end.
func (s *Server) admitStream(r *role, h Hello) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.peer == nil:
		return fmt.Errorf("%s refused a ring stream from %s: its %s link is not connected", r.self.name(), h.name(), r.self.Group)
	case r.streamed:
		return fmt.Errorf("%s refused a ring stream from %s: a ring stream is already open", r.self.name(), h.name())
	}
	if err := CheckPeer(r.self, h, false); err != nil {
		return err
	}
	if p := r.peer; h.Address != p.Address || h.Replica != p.Replica || h.Stage != p.Stage {
		return fmt.Errorf("%s refused a ring stream from %s: its %s link is with %s", r.self.name(), h.name(), r.self.Group, p.name())
	}
	r.streamed = true
	return nil
}

func (s *Server) releaseStream(r *role) {
	s.mu.Lock()
	r.streamed = false
	s.mu.Unlock()
}

// AcceptStream waits for the ring stream of group g's peer, whose gRPC link
// Accept or AcceptGroup returned, for at most ConnectTimeout. The listener
// must have been made with Options.Streams.
func (s *Server) AcceptStream(ctx context.Context, g Group) (*StreamIn, error) {
	r := s.role(g)
	if r == nil {
		return nil, fmt.Errorf("%s: the listener on %s serves no %s link (it serves %s)", s.roles[0].self.who(), s.Addr(), g, s.serves())
	}
	if r.streams == nil {
		return nil, fmt.Errorf("%s: the listener on %s takes no ring streams (Options.Streams)", r.self.who(), s.Addr())
	}
	timer := time.NewTimer(s.opts.ConnectTimeout)
	defer timer.Stop()
	up := r.self.neighbour(r.self.upstream())
	select {
	case res := <-r.streams:
		return res.in, res.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for the ring stream of %s: %w", r.self.who(), up, ctx.Err())
	case <-timer.C:
		return nil, fmt.Errorf("%s: %s opened no ring stream to %s within %v", r.self.who(), up, s.Addr(), s.opts.ConnectTimeout)
	case <-s.done:
		return nil, fmt.Errorf("%s: server closed", r.self.who())
	}
}

// readStreamHello reads a dialer's length-prefixed hello, refusing one
// longer than limit before reading it.
func readStreamHello(c net.Conn, limit int) (handshake, error) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return handshake{}, fmt.Errorf("ring stream ended before its hello: %w", err)
	}
	size := binary.LittleEndian.Uint32(n[:])
	if uint64(size) > uint64(limit) {
		return handshake{}, badHandshake("ring stream hello of %d bytes is longer than the %d bytes a hello can hold", size, limit)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		return handshake{}, fmt.Errorf("ring stream ended in its hello: %w", err)
	}
	var hs handshake
	if err := hs.unmarshal(b); err != nil {
		return handshake{}, err
	}
	return hs, nil
}

// writeStreamAnswer sends the listener's answer: 0, or 1 and the refusal.
func writeStreamAnswer(c net.Conn, refusal string) error {
	if refusal == "" {
		_, err := c.Write([]byte{0})
		return err
	}
	if len(refusal) > maxStreamRefusal {
		refusal = refusal[:maxStreamRefusal]
	}
	b := binary.LittleEndian.AppendUint32([]byte{1}, uint32(len(refusal)))
	_, err := c.Write(append(b, refusal...))
	return err
}

// readStreamAnswer reads the listener's answer; a refusal is returned as an
// error with its text.
func readStreamAnswer(c net.Conn) (refusal string, err error) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return "", err
	}
	switch b[0] {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("protocol error: ring stream answer %d", b[0])
	}
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return "", err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxStreamRefusal {
		return "", fmt.Errorf("protocol error: ring stream refusal of %d bytes", size)
	}
	text := make([]byte, size)
	if _, err := io.ReadFull(c, text); err != nil {
		return "", err
	}
	return string(text), nil
}

// DialStream opens the ring stream to the listener at addr, whose gRPC link
// this process (self) has already dialed and whose hello that link agreed
// (peer). It presents opts' token and TLS certificate, and self, which the
// listener matches against its link's peer. A refused token wraps
// ErrUnauthenticated. A listener on this host is reached over its stream
// socket (peer.StreamSocket) unless opts.StreamsOverTCP.
func DialStream(ctx context.Context, addr string, self, peer Hello, opts Options) (*StreamOut, error) {
	opts = opts.withDefaults()
	who := fmt.Sprintf("%s: ring stream to %s", self.who(), peer.name())
	ctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	c, err := dialStreamConn(ctx, addr, self, peer, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write([]byte(streamPreface)); err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	if opts.TLS != nil {
		cfg := opts.TLS.clientConfig()
		if cfg.ServerName == "" {
			// The name gRPC's dialer checks on the same address: the host,
			// or "localhost" for a Unix socket (its unix resolver's
			// authority). A TCP address's host, even when the stream comes
			// through the listener's stream socket: the certificate is
			// checked as on the link.
			cfg.ServerName = "localhost"
			if _, unix := UnixPath(addr); !unix {
				cfg.ServerName, _, _ = net.SplitHostPort(addr)
			}
		}
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, explainTLSRefusal(who, err)
		}
		c = tc
	}
	proof := tokenProof(opts.Token)
	hello := (&handshake{Hello: self}).marshal()
	msg := append(proof[:], binary.LittleEndian.AppendUint32(nil, uint32(len(hello)))...)
	if _, err := c.Write(append(msg, hello...)); err != nil {
		// TLS 1.3: a listener that refuses this side's certificate
		// sends its alert and closes; on a Unix socket the write can
		// then fail (broken pipe) before the alert is read: read it.
		if opts.TLS != nil {
			if _, rerr := readStreamAnswer(c); isRemoteAlert(rerr) {
				return nil, explainTLSRefusal(who, rerr)
			}
		}
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	refusal, err := readStreamAnswer(c)
	if err != nil {
		if isRemoteAlert(err) {
			// TLS 1.3: the listener checks this side's certificate after
			// the handshake, so its refusal comes as an alert here.
			return nil, explainTLSRefusal(who, err)
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("%s: no answer: %w", who, err)
	}
	if refusal == badTokenMsg {
		return nil, fmt.Errorf("%s %w: %s", who, ErrUnauthenticated, refusal)
	}
	if refusal != "" {
		return nil, &HandshakeError{refusal}
	}
	if !stop() {
		return nil, fmt.Errorf("%s: %w", who, ctx.Err())
	}
	c.SetDeadline(time.Time{})
	ok = true
	return newStreamOut(c, self, peer, opts), nil
}

// outFrame is a queued frame: its header and payload, written by one writev.
type outFrame struct {
	hdr  [FrameHeaderSize]byte
	data []byte
}

// StreamOut is the sending end of a ring stream. Send queues a frame and
// returns; one writer goroutine writes the frames in order, each header and
// payload together with one writev from the caller's memory.
type StreamOut struct {
	conn         net.Conn
	self, peer   Hello
	closeTimeout time.Duration

	q          chan outFrame
	closing    chan struct{}
	dead       chan struct{}
	writerDone chan struct{}
	failOnce   sync.Once
	err        error // read after dead is closed
	closeOnce  sync.Once
	closeErr   error
}

func newStreamOut(c net.Conn, self, peer Hello, opts Options) *StreamOut {
	s := &StreamOut{conn: c, self: self.clone(), peer: peer.clone(), closeTimeout: opts.CloseTimeout,
		q: make(chan outFrame, max(opts.QueueDepth, 4)), closing: make(chan struct{}), dead: make(chan struct{}), writerDone: make(chan struct{})}
	go s.writeLoop()
	return s
}

// Peer is the hello of the stream's listener, as its gRPC link agreed it.
func (s *StreamOut) Peer() Hello { return s.peer.clone() }

func (s *StreamOut) fail(err error) {
	s.failOnce.Do(func() {
		s.err = err
		close(s.dead)
	})
}

// Send queues frame f with payload data, which must not change until the
// peer has read it (as a Link's Send). It blocks only while the queue is
// full.
func (s *StreamOut) Send(ctx context.Context, f Frame, data []byte) error {
	f.Len = len(data)
	if err := f.check(); err != nil {
		return fmt.Errorf("ring stream to %s: %w", s.peer.name(), err)
	}
	select {
	case <-s.closing:
		return fmt.Errorf("ring stream to %s: %w", s.peer.name(), ErrClosed)
	case <-s.dead:
		return fmt.Errorf("ring stream to %s: %w", s.peer.name(), s.err)
	default:
	}
	var o outFrame
	f.appendHeader(o.hdr[:0])
	o.data = data
	select {
	case s.q <- o:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return fmt.Errorf("ring stream to %s: %w", s.peer.name(), ErrClosed)
	case <-s.dead:
		return fmt.Errorf("ring stream to %s: %w", s.peer.name(), s.err)
	}
}

func (s *StreamOut) writeLoop() {
	defer close(s.writerDone)
	var vec [2][]byte
	for {
		var o outFrame
		select {
		case o = <-s.q:
		case <-s.dead:
			return
		case <-s.closing:
			select {
			case o = <-s.q:
			default:
				return
			}
		}
		vec[0], vec[1] = o.hdr[:], o.data
		bufs := net.Buffers(vec[:])
		if _, err := bufs.WriteTo(s.conn); err != nil {
			s.fail(err)
			return
		}
	}
}

// Close flushes the queued frames (bounded by Options.CloseTimeout) and
// closes the stream. Idempotent.
func (s *StreamOut) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		timer := time.NewTimer(s.closeTimeout)
		defer timer.Stop()
		select {
		case <-s.writerDone:
		case <-timer.C:
			s.closeErr = fmt.Errorf("ring stream to %s: close: queued frames not delivered within %v", s.peer.name(), s.closeTimeout)
		}
		s.conn.Close()
		<-s.writerDone
	})
	return s.closeErr
}

// StreamIn is the receiving end of a ring stream, read by its caller's
// goroutine: Recv reads the next frame's header, checks it, and lets the
// caller read the payload straight into its own memory.
type StreamIn struct {
	conn       net.Conn
	self, peer Hello
	hdr        [FrameHeaderSize]byte
	err        error // the first failure: the stream is then unusable
	closeOnce  sync.Once
}

// Peer is the hello of the stream's dialer.
func (s *StreamIn) Peer() Hello { return s.peer.clone() }

// Recv reads the next frame, which must be want (its step, phase, tag,
// dtype and length; anything else is refused naming the peer), and calls
// read with a reader of exactly its payload, which read must consume. ctx
// bounds the whole frame.
func (s *StreamIn) Recv(ctx context.Context, want Frame, read func(payload io.Reader) error) error {
	if s.err != nil {
		return s.err
	}
	err := s.recv(ctx, want, read)
	if err != nil {
		s.err = err
	}
	return err
}

func (s *StreamIn) recv(ctx context.Context, want Frame, read func(payload io.Reader) error) error {
	peer := s.peer.name()
	// The read ends when ctx does, by a deadline in the past: set only
	// then, so a timed-out read always finds ctx done and reports its cause.
	stop := context.AfterFunc(ctx, func() { s.conn.SetReadDeadline(time.Unix(1, 0)) })
	stopped := false
	defer func() {
		if !stopped && stop() {
			s.conn.SetReadDeadline(time.Time{})
		}
	}()
	explain := func(err error) error {
		if ctx.Err() != nil {
			if c := context.Cause(ctx); c != nil {
				return fmt.Errorf("ring stream from %s: %w", peer, c)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("ring stream from %s: %w", peer, ErrPeerClosed)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("ring stream from %s: %w", peer, err)
		}
		return fmt.Errorf("ring stream from %s: stream closed: %w", peer, err)
	}
	if _, err := io.ReadFull(s.conn, s.hdr[:]); err != nil {
		return explain(err)
	}
	f, err := decodeFrameHeader(s.hdr[:], want, peer)
	if err != nil {
		return err
	}
	lr := &io.LimitedReader{R: s.conn, N: int64(f.Len)}
	if err := read(lr); err != nil {
		if lr.N > 0 && ctx.Err() == nil {
			var ne net.Error
			if !errors.As(err, &ne) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				return err
			}
		}
		return explain(err)
	}
	if lr.N != 0 {
		return fmt.Errorf("ring stream from %s: %d bytes of a frame's payload left unread", peer, lr.N)
	}
	// ctx ending just now has set, or is setting, a deadline in the past
	// that would fail the next frame's read: the stream ends here instead.
	stopped = true
	if !stop() {
		return explain(ctx.Err())
	}
	s.conn.SetReadDeadline(time.Time{})
	return nil
}

// Close closes the stream. Idempotent.
func (s *StreamIn) Close() error {
	var err error
	s.closeOnce.Do(func() { err = s.conn.Close() })
	return err
}
