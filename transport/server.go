package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Server listens for a process's upstream neighbours, one per Group it
// serves (its roles): the previous stage on the pipeline link, the previous
// replica on the replica ring. It serves one link per role: once a dialer of
// a group has passed the handshake, later dialers of that group are refused.
type Server struct {
	roles []*role // one per group, in Listen's order
	opts  Options
	lis   net.Listener
	// streamLis is the stream socket beside a TCP address (streamsock.go),
	// nil without one.
	streamLis net.Listener
	gs        *grpc.Server
	done      chan struct{} // closed by Close

	mu        sync.Mutex // guards the roles' connected
	handlers  handlers
	closeOnce sync.Once
}

// handlers admits a server's stream handlers until the server closes, and
// lets Close wait for those it admitted: a handler never starts on a server
// that Close has already waited out.
type handlers struct {
	mu      sync.Mutex
	closed  bool
	running sync.WaitGroup
}

// enter admits one handler, or refuses it (Unavailable) once closed; an
// admitted handler calls exit when it returns.
func (h *handlers) enter() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return status.Error(codes.Unavailable, "server closing")
	}
	h.running.Add(1)
	return nil
}

func (h *handlers) exit() { h.running.Done() }

// shut refuses every later handler.
func (h *handlers) shut() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

// wait returns once every admitted handler has.
func (h *handlers) wait() { h.running.Wait() }

// role is the part of a Server that serves one group's link.
type role struct {
	self Hello
	// results holds at most one handshake outcome for Accept. A link
	// replaces a stale error, so a good dialer is never lost behind a bad one.
	results   chan acceptResult
	connected bool // a link was established; later dialers are refused (guarded by Server.mu)
	// peer is the hello of the link's dialer once the link is up, and
	// streamed whether its ring stream came (Options.Streams; guarded by
	// Server.mu); streams holds the stream for AcceptStream.
	peer     *Hello
	streamed bool
	streams  chan streamResult
}

type acceptResult struct {
	link *streamLink
	err  error
}

// Listen binds addr now, so a taken port fails at startup naming the
// address, and serves the process's upstream neighbour in self's group: on a
// pipeline link stage self.Stage-1 (or the last stage for stage 0 when
// self.Ring), on the replica ring replica (self.Replica-1) mod self.Replicas
// of the same stage. Each hello in more adds a role for another group on the
// same address, so one listener serves both the pipeline link and the
// replica ring; the roles describe one process (same stage, stage count,
// replica and replica count), and no two share a group. Hellos with an
// empty Address get the bound address. Without a token or TLS in opts it
// listens on loopback addresses only.
func Listen(addr string, self Hello, opts Options, more ...Hello) (*Server, error) {
	opts = opts.withDefaults()
	roles := make([]*role, 0, 1+len(more))
	for _, h := range append([]Hello{self}, more...) {
		if err := h.validate(); err != nil {
			return nil, err
		}
		if h.upstream() < 0 {
			return nil, fmt.Errorf("stage %d has no upstream neighbour to listen for (Ring is false)", h.Stage)
		}
		for _, r := range roles {
			if r.self.Group == h.Group {
				return nil, fmt.Errorf("%s: two %s roles on one listener (a listener serves one link per group)", h.who(), h.Group)
			}
			if r.self.Stage != h.Stage || r.self.Stages != h.Stages || r.self.Replica != h.Replica || r.self.replicas() != h.replicas() {
				return nil, fmt.Errorf("the roles of one listener differ: stage %d of %d replica %d of %d (%s) and stage %d of %d replica %d of %d (%s); a listener is one process, one stage of one replica",
					r.self.Stage, r.self.Stages, r.self.Replica, r.self.replicas(), r.self.Group, h.Stage, h.Stages, h.Replica, h.replicas(), h.Group)
			}
		}
		r := &role{self: h.clone(), results: make(chan acceptResult, 1)}
		if opts.Streams {
			r.streams = make(chan streamResult, 1)
		}
		roles = append(roles, r)
	}
	who := roles[0].self.who()
	lis, err := bind(addr, opts, who)
	if err != nil {
		return nil, err
	}
	for _, r := range roles {
		if r.self.Address == "" {
			r.self.Address = listenAddr(lis)
		}
	}
	recv := 0
	for _, r := range roles {
		recv = max(recv, recvLimit(r.self))
	}
	s := &Server{
		roles: roles, opts: opts, lis: lis,
		gs: grpc.NewServer(append(listenOptions(opts, roles[0].self.name()),
			grpc.MaxRecvMsgSize(recv))...),
		done: make(chan struct{}),
	}
	s.gs.RegisterService(&serviceDesc, s)
	if opts.Streams {
		s.openStreamSocket()
		lis = newMuxListener(lis, opts.ConnectTimeout, s.serveStream)
	}
	go s.gs.Serve(lis) // returns when Close stops the server
	return s, nil
}

// Addr is the bound address (useful after listening on 127.0.0.1:0).
func (s *Server) Addr() string { return listenAddr(s.lis) }

// role returns the role serving group g, or nil.
func (s *Server) role(g Group) *role {
	for _, r := range s.roles {
		if r.self.Group == g {
			return r
		}
	}
	return nil
}

// serves lists the groups s serves, for messages: "pipeline and replica ring".
func (s *Server) serves() string {
	var b strings.Builder
	for i, r := range s.roles {
		if i > 0 {
			b.WriteString(" and ")
		}
		b.WriteString(r.self.Group.String())
	}
	return b.String()
}

// Accept waits for the upstream neighbour of the first role (Listen's self)
// to open its stream and pass the handshake, for at most ConnectTimeout. A
// refused handshake is returned as a *HandshakeError naming both sides.
func (s *Server) Accept(ctx context.Context) (Link, error) {
	return s.accept(ctx, s.roles[0])
}

// AcceptGroup is Accept for the role of group g: the pipeline link's
// upstream stage or the replica ring's upstream replica, whichever order
// they connect in.
func (s *Server) AcceptGroup(ctx context.Context, g Group) (Link, error) {
	r := s.role(g)
	if r == nil {
		return nil, fmt.Errorf("%s: the listener on %s serves no %s link (it serves %s)", s.roles[0].self.who(), s.Addr(), g, s.serves())
	}
	return s.accept(ctx, r)
}

func (s *Server) accept(ctx context.Context, r *role) (Link, error) {
	self := r.self
	closed := fmt.Errorf("%s: server closed", self.who())
	select {
	case <-s.done:
		return nil, closed
	default:
	}
	timer := time.NewTimer(s.opts.ConnectTimeout)
	defer timer.Stop()
	select {
	case res := <-r.results:
		if res.err != nil {
			return nil, res.err
		}
		return res.link, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for upstream %s: %w", self.who(), self.neighbour(self.upstream()), ctx.Err())
	case <-timer.C:
		return nil, fmt.Errorf("%s: upstream %s did not connect to %s within %v",
			self.who(), self.neighbour(self.upstream()), s.Addr(), s.opts.ConnectTimeout)
	case <-s.done:
		return nil, closed
	}
}

// Close stops the gRPC server and releases the port. A link not yet taken by
// Accept is closed; accepted links break (their Recv fails) and should still
// be closed by their owner.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.handlers.shut()
		close(s.done)
		for _, r := range s.roles {
			select {
			case res := <-r.results:
				if res.link != nil {
					res.link.Close()
				}
			default:
			}
			select {
			case res := <-r.streams:
				if res.in != nil {
					res.in.Close()
				}
			default:
			}
		}
		if s.streamLis != nil {
			s.streamLis.Close()
		}
		stopGracefully(s.gs)
		s.handlers.wait()
	})
	return nil
}

// report hands a handshake outcome to r's Accept without blocking the
// handler.
func (s *Server) report(r *role, res acceptResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if res.link != nil {
		select {
		case <-r.results: // drop a stale error; only one link is ever reported
		default:
		}
	}
	select {
	case r.results <- res:
	default: // an earlier error is still pending; keep it
	}
}

// reportAll hands an error that belongs to no role (a dialer whose group
// this server does not serve, or whose hello could not be read) to every
// role's Accept: whichever link the process waits for, the misconfigured
// run stops with the reason.
func (s *Server) reportAll(err error) {
	for _, r := range s.roles {
		s.report(r, acceptResult{err: err})
	}
}

// serveLink is the stream handler. It checks the token, does the handshake,
// hands the link to the Accept of the dialer's group and then stays until
// the link is done, because returning ends the stream.
func (s *Server) serveLink(stream grpc.ServerStream) error {
	if err := s.authenticate(stream); err != nil {
		return err
	}
	if err := s.handlers.enter(); err != nil {
		return err
	}
	defer s.handlers.exit()

	hb := helloBytes{limit: s.helloLimit()}
	if err := stream.RecvMsg(&hb); err != nil {
		switch {
		case hb.err != nil:
			return s.badHello(hb.err)
		case status.Code(err) == codes.ResourceExhausted: // gRPC refused it by its length prefix
			return s.badHello(badHandshake("%s", status.Convert(err).Message()))
		}
		return err // the dialer went away before its hello
	}
	// The head names the dialer and its group: enough to refuse a dialer
	// that could never be accepted before decoding its shapes.
	var hs handshake
	shapes, err := hs.unmarshalHead(hb.b)
	if err != nil {
		return s.badHello(err)
	}
	r := s.role(hs.Hello.Group)
	if r == nil {
		first := s.roles[0].self
		err := &HandshakeError{fmt.Sprintf("%s refused %s: a %s dialer reached a listener that serves only %s links", first.name(), hs.Hello.name(), hs.Hello.Group, s.serves())}
		stream.SendMsg(frame{(&handshake{Hello: first, Refused: err.Error()}).marshal()})
		s.reportAll(err)
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if limit := helloLimit(r.self); len(hb.b) > limit {
		return s.badHello(badHandshake("%d bytes is longer than the %d bytes a %s hello for %s can hold", len(hb.b), limit, r.self.Group, r.self.who()))
	}
	if s.isConnected(r) {
		return s.refuseDuplicate(stream, r, hs.Hello)
	}
	if err := hs.unmarshalShapes(shapes); err != nil {
		return s.badHello(err)
	}
	err = CheckPeer(r.self, hs.Hello, false)
	mismatch := err != nil
	if !mismatch {
		s.mu.Lock()
		if r.connected { // a duplicate dialer is not Accept's concern
			err = duplicateDialer(r, hs.Hello)
		} else {
			// Set before the dialer hears the answer, after which it may
			// open its ring stream at once.
			peer := hs.Hello.clone()
			r.peer = &peer
		}
		r.connected = true
		s.mu.Unlock()
	}
	if err != nil {
		// The dialer hears of the refusal before Accept does: a stage that fails
		// at once on a refused handshake must not close the server before its
		// neighbour has the reason.
		stream.SendMsg(frame{(&handshake{Hello: r.self, Refused: err.Error()}).marshal()})
		if mismatch {
			s.report(r, acceptResult{err: err})
		}
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if err := stream.SendMsg(frame{(&handshake{Hello: r.self}).marshal()}); err != nil {
		s.mu.Lock()
		r.connected, r.peer = false, nil
		s.mu.Unlock()
		return err
	}

	l := newStreamLink(stream, r.self, hs.Hello, Gradient, s.opts)
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
	s.report(r, acceptResult{link: l})
	select {
	case <-l.writerDone: // flushed after Close, or the link failed
	case <-release: // Close gave up waiting for the flush
	}
	return nil
}

// helloLimit is the longest hello any of s's roles accepts, the limit on
// the first message of a stream.
func (s *Server) helloLimit() int {
	n := 0
	for _, r := range s.roles {
		n = max(n, helloLimit(r.self))
	}
	return n
}

// badHello refuses a stream whose hello is malformed or too long, and tells
// every role's Accept why.
func (s *Server) badHello(err error) error {
	s.reportAll(fmt.Errorf("%s: from a dialer: %w", s.roles[0].self.who(), err))
	return status.Error(codes.InvalidArgument, err.Error())
}

// isConnected says whether r already has its link.
func (s *Server) isConnected(r *role) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.connected
}

// duplicateDialer is the refusal of a dialer that arrives once r has its link.
func duplicateDialer(r *role, dialer Hello) error {
	return &HandshakeError{fmt.Sprintf("%s refused %s: an upstream neighbour is already connected", r.self.name(), dialer.name())}
}

// refuseDuplicate refuses a dialer for r's group once r has its link, from
// the hello's head alone; Accept is not told, since its link is fine.
func (s *Server) refuseDuplicate(stream grpc.ServerStream, r *role, dialer Hello) error {
	err := duplicateDialer(r, dialer)
	stream.SendMsg(frame{(&handshake{Hello: r.self, Refused: err.Error()}).marshal()})
	return status.Error(codes.FailedPrecondition, err.Error())
}

// authenticate refuses a stream without the token before anything is read
// from it, so no message of a stranger is ever decoded. The refusal is
// logged rather than reported to Accept, which keeps waiting for the real
// neighbour: a stranger must not be able to stop a run by knocking.
func (s *Server) authenticate(stream grpc.ServerStream) error {
	return authenticate(stream.Context(), s.opts, s.roles[0].self.name())
}

// authenticate refuses, and logs as who's refusal, a stream without the
// token opts require; it reads nothing from the stream.
func authenticate(ctx context.Context, opts Options, who string) error {
	if opts.Token == "" || tokenMatches(ctx, opts.Token) {
		return nil
	}
	opts.Logf("%s: refused a connection from %s: %s", who, remoteAddr(ctx), badTokenMsg)
	return status.Error(codes.Unauthenticated, badTokenMsg)
}

// stopGracefully stops gs gracefully first, so replies already sent (a
// refusal) reach the peer; bounded, because a stream its owner never closed
// would hold it.
func stopGracefully(gs *grpc.Server) {
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(time.Second):
		gs.Stop()
		<-stopped
	}
}

// bind is the socket a server serves: o.Listener if given, else addr bound,
// which without a token or TLS must be a loopback address (checkExposure).
// Errors start with who.
func bind(addr string, o Options, who string) (net.Listener, error) {
	if err := checkExposure(addr, o); err != nil {
		return nil, fmt.Errorf("%s: %w", who, err)
	}
	if o.Listener != nil {
		return o.Listener, nil
	}
	lis, err := listen(addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
		return nil, fmt.Errorf("%s: cannot listen on %s: %w", who, addr, err)
	}
	return lis, nil
}
