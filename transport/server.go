package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Server listens for a stage's upstream neighbour. It serves one link: once
// a dialer has passed the handshake, later dialers are refused.
type Server struct {
	self Hello
	opts Options
	lis  net.Listener
	gs   *grpc.Server

	// results holds at most one handshake outcome for Accept. A link
	// replaces a stale error, so a good dialer is never lost behind a bad one.
	results chan acceptResult
	done    chan struct{} // closed by Close

	mu        sync.Mutex
	closed    bool
	connected bool // a link was established; later dialers are refused
	handlers  sync.WaitGroup
	closeOnce sync.Once
}

type acceptResult struct {
	link *streamLink
	err  error
}

// Listen binds addr now, so a taken port fails at startup naming the
// address, and serves the stage's upstream neighbour (stage self.Stage-1, or
// the last stage for stage 0 when self.Ring). If self.Address is empty it is
// set to the bound address. Without a token or TLS in opts it listens on
// loopback addresses only.
func Listen(addr string, self Hello, opts Options) (*Server, error) {
	opts = opts.withDefaults()
	if err := self.validate(); err != nil {
		return nil, err
	}
	if self.upstream() < 0 {
		return nil, errors.New("stage 0 has no upstream neighbour to listen for (Ring is false)")
	}
	if err := checkExposure(addr, opts); err != nil {
		return nil, fmt.Errorf("stage %d: %w", self.Stage, err)
	}
	self = self.clone()
	lis, err := listen(addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
		return nil, fmt.Errorf("stage %d: cannot listen on %s: %w", self.Stage, addr, err)
	}
	if self.Address == "" {
		self.Address = listenAddr(lis)
	}
	s := &Server{
		self: self, opts: opts, lis: lis,
		gs:      grpc.NewServer(listenOptions(opts, self.name())...),
		results: make(chan acceptResult, 1),
		done:    make(chan struct{}),
	}
	s.gs.RegisterService(&serviceDesc, s)
	go s.gs.Serve(lis) // returns when Close stops the server
	return s, nil
}

// Addr is the bound address (useful after listening on 127.0.0.1:0).
func (s *Server) Addr() string { return listenAddr(s.lis) }

// Accept waits for the upstream neighbour to open its stream and pass the
// handshake, for at most ConnectTimeout. A refused handshake is returned as
// a *HandshakeError naming both stages.
func (s *Server) Accept(ctx context.Context) (Link, error) {
	closed := fmt.Errorf("stage %d: server closed", s.self.Stage)
	select {
	case <-s.done:
		return nil, closed
	default:
	}
	timer := time.NewTimer(s.opts.ConnectTimeout)
	defer timer.Stop()
	select {
	case r := <-s.results:
		if r.err != nil {
			return nil, r.err
		}
		return r.link, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("stage %d: waiting for upstream stage %d: %w", s.self.Stage, s.self.upstream(), ctx.Err())
	case <-timer.C:
		return nil, fmt.Errorf("stage %d: upstream stage %d did not connect to %s within %v",
			s.self.Stage, s.self.upstream(), s.Addr(), s.opts.ConnectTimeout)
	case <-s.done:
		return nil, closed
	}
}

// Close stops the gRPC server and releases the port. A link not yet taken by
// Accept is closed; accepted links break (their Recv fails) and should still
// be closed by their owner.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.done)
		s.mu.Unlock()
		select {
		case r := <-s.results:
			if r.link != nil {
				r.link.Close()
			}
		default:
		}
		// Graceful first, so replies already sent (a refusal) reach the peer;
		// bounded, because an accepted link its owner never closed would hold it.
		stopped := make(chan struct{})
		go func() {
			s.gs.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(time.Second):
			s.gs.Stop()
			<-stopped
		}
		s.handlers.Wait()
	})
	return nil
}

// report hands a handshake outcome to Accept without blocking the handler.
func (s *Server) report(r acceptResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.link != nil {
		select {
		case <-s.results: // drop a stale error; only one link is ever reported
		default:
		}
	}
	select {
	case s.results <- r:
	default: // an earlier error is still pending; keep it
	}
}

// serveLink is the stream handler. It checks the token, does the handshake,
// hands the link to Accept and then stays until the link is done, because
// returning ends the stream.
func (s *Server) serveLink(stream grpc.ServerStream) error {
	if err := s.authenticate(stream); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return status.Error(codes.Unavailable, "server closing")
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()

	var b []byte
	if err := stream.RecvMsg(&b); err != nil {
		return err // the dialer went away before its hello
	}
	var hs handshake
	if err := hs.unmarshal(b); err != nil {
		s.report(acceptResult{err: fmt.Errorf("stage %d: from a dialer: %w", s.self.Stage, err)})
		return status.Error(codes.InvalidArgument, err.Error())
	}
	err := CheckPeer(s.self, hs.Hello, false)
	mismatch := err != nil
	if !mismatch {
		s.mu.Lock()
		if s.connected { // a duplicate dialer is not Accept's concern
			err = &HandshakeError{fmt.Sprintf("%s refused %s: an upstream neighbour is already connected", s.self.name(), hs.Hello.name())}
		}
		s.connected = true
		s.mu.Unlock()
	}
	if err != nil {
		// The dialer hears of the refusal before Accept does: a stage that fails
		// at once on a refused handshake must not close the server before its
		// neighbour has the reason.
		stream.SendMsg(frame{(&handshake{Hello: s.self, Refused: err.Error()}).marshal()})
		if mismatch {
			s.report(acceptResult{err: err})
		}
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if err := stream.SendMsg(frame{(&handshake{Hello: s.self}).marshal()}); err != nil {
		s.mu.Lock()
		s.connected = false
		s.mu.Unlock()
		return err
	}

	l := newStreamLink(stream, s.self, hs.Hello, Gradient, s.opts)
	release, handlerDone := make(chan struct{}), make(chan struct{})
	defer close(handlerDone)
	l.shutdown = func(bool, time.Time) {
		// Returning from the handler ends the stream after the data already
		// sent; it also cancels the stream, which unblocks the reader and a
		// writer stuck on flow control.
		close(release)
		<-handlerDone
	}
	l.explain = func(err error) error {
		// A server stream only sees "context canceled", whatever the reason.
		select {
		case <-s.done:
			return fmt.Errorf("server closed: %w", err)
		default:
		}
		if status.Code(err) == codes.Canceled {
			// The listener's keep-alive pings end in the same cancel.
			return fmt.Errorf("peer disconnected or stopped answering keep-alive pings: %w", err)
		}
		return err
	}
	l.start()
	s.report(acceptResult{link: l})
	select {
	case <-l.writerDone: // flushed after Close, or the link failed
	case <-release: // Close gave up waiting for the flush
	}
	return nil
}

// authenticate refuses a stream without the token before anything is read
// from it, so no message of a stranger is ever decoded. The refusal is
// logged rather than reported to Accept, which keeps waiting for the real
// neighbour: a stranger must not be able to stop a run by knocking.
func (s *Server) authenticate(stream grpc.ServerStream) error {
	if s.opts.Token == "" || tokenMatches(stream.Context(), s.opts.Token) {
		return nil
	}
	s.opts.Logf("%s: refused a connection from %s: %s", s.self.name(), remoteAddr(stream.Context()), badTokenMsg)
	return status.Error(codes.Unauthenticated, badTokenMsg)
}
