package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Service is a small gRPC service of another package (the cluster's
// rendezvous) that travels like a link: the raw-bytes codec, the same
// keep-alives, and above all the same security, so that whatever guards
// the links (Options.Token, Options.TLS, loopback-only listening without
// either) guards the service too, with no second implementation to drift.
// It has one bidirectional stream method whose messages are byte slices;
// what they mean is the caller's business.
type Service struct {
	// Name is the gRPC service name, "pipetrain.cluster.Rendezvous". It
	// must differ from the links' service, so that a link dialer that
	// reaches the service (or the reverse) is told the address is wrong.
	Name string
	// Noun names the server in logs and errors, followed by " at ADDR":
	// "rendezvous".
	Noun string
}

const (
	serviceMethod = "Stream"
	// serviceMaxMsg bounds one message either way. Services carry control
	// messages, not tensors, so a peer (even one that holds the token) gets
	// no chance to make the other side buffer the links' 1 GiB.
	serviceMaxMsg = 16 << 20
)

func (sv Service) fullMethod() string { return "/" + sv.Name + "/" + serviceMethod }

func (sv Service) who(addr string) string { return sv.Noun + " at " + addr }

func (sv Service) check() error {
	if sv.Name == "" || sv.Name == serviceName {
		return fmt.Errorf("transport: a service needs a gRPC name of its own, not %q", sv.Name)
	}
	return nil
}

// ServiceStream is one call of a Service, at either end.
type ServiceStream struct {
	s interface {
		Context() context.Context
		SendMsg(any) error
		RecvMsg(any) error
	}
	peer  string
	heard func() // the dialer's record that the server answered
}

// Context ends when the call does: the peer went away, the server closed,
// or (at the dialer) the context given to Call ended.
func (c *ServiceStream) Context() context.Context { return c.s.Context() }

// Peer names the other end for messages: the dialer's address at the
// server, the dialed address at the dialer.
func (c *ServiceStream) Peer() string { return c.peer }

// Send sends one message. msg must not change until the call ends: it is
// written without copying. At the dialer, a stream the server has already
// ended (a refusal) takes the message silently, and the next Recv says why.
func (c *ServiceStream) Send(msg []byte) error {
	err := c.s.SendMsg(frame{msg})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// Recv returns the next message; io.EOF when the other end finished
// without error.
func (c *ServiceStream) Recv() ([]byte, error) {
	var b []byte
	if err := c.s.RecvMsg(&b); err != nil {
		return nil, err
	}
	if c.heard != nil {
		c.heard()
	}
	return b, nil
}

// ServiceServer serves a Service; Close stops it.
type ServiceServer struct {
	sv     Service
	who    string
	opts   Options
	lis    net.Listener
	gs     *grpc.Server
	handle func(*ServiceStream) error

	handlers  handlers
	closeOnce sync.Once
}

// serviceHandler is the gRPC handler type of every Service.
type serviceHandler interface {
	serveStream(grpc.ServerStream) error
}

// Serve binds addr (or serves o.Listener, as Listen does) and runs handle
// once per call, on the call's own goroutine; handle's return ends the call
// (an error reaches the dialer as the call's status). It guards the service
// as Listen guards links: without o.Token or o.TLS it listens on loopback
// addresses only; with TLS a dialer without a certificate signed by the CA
// never gets past the handshake; with a token, a call without it is refused
// before anything is read from it. Refusals are logged to o.Logf and never
// reach handle, so a stranger cannot disturb the service by knocking.
// handle must return once the stream's Context ends.
func (sv Service) Serve(addr string, o Options, handle func(*ServiceStream) error) (*ServiceServer, error) {
	if err := sv.check(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	lis, err := bind(addr, o, sv.who(addr))
	if err != nil {
		return nil, err
	}
	s := &ServiceServer{sv: sv, who: sv.who(listenAddr(lis)), opts: o, lis: lis, handle: handle}
	s.gs = grpc.NewServer(append(listenOptions(o, s.who),
		grpc.MaxRecvMsgSize(serviceMaxMsg), grpc.MaxSendMsgSize(serviceMaxMsg))...)
	s.gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: sv.Name,
		HandlerType: (*serviceHandler)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    serviceMethod,
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(srv any, stream grpc.ServerStream) error {
				return srv.(serviceHandler).serveStream(stream)
			},
		}},
	}, s)
	go s.gs.Serve(lis) // returns when Close stops the server
	return s, nil
}

// Addr is the bound address (useful after listening on 127.0.0.1:0).
func (s *ServiceServer) Addr() string { return listenAddr(s.lis) }

func (s *ServiceServer) serveStream(stream grpc.ServerStream) error {
	ctx := stream.Context()
	if err := authenticate(ctx, s.opts, s.who); err != nil {
		return err
	}
	if err := s.handlers.enter(); err != nil {
		return err
	}
	defer s.handlers.exit()
	return s.handle(&ServiceStream{s: stream, peer: remoteAddr(ctx)})
}

// Close stops serving and releases the port, and returns once every handle
// has. Replies already sent still reach their dialers: calls get a moment
// to finish before the remaining ones are cut off.
func (s *ServiceServer) Close() error {
	s.closeOnce.Do(func() {
		s.handlers.shut()
		stopGracefully(s.gs)
		s.handlers.wait()
	})
	return nil
}

// Call opens a call to the service at addr with o's security (as Dial) and
// runs call on it. While the server is unreachable (not started yet,
// restarting, or the connection dropped) Call retries, running call again
// on a fresh stream, until ctx ends: call must be safe to repeat. A refused
// token or TLS certificate ends it at once with an error wrapping
// ErrUnauthenticated, or naming the TLS failure; an address that serves
// something else ends it too. call's own errors are returned as they are.
func (sv Service) Call(ctx context.Context, addr string, o Options, call func(*ServiceStream) error) error {
	if err := sv.check(); err != nil {
		return err
	}
	o = o.withDefaults()
	who := sv.who(addr)
	security, refusal := clientTransport(o)
	conn, err := grpc.NewClient(dialTarget(addr), append(clientOptions(o), security)...)
	if err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	defer conn.Close()
	var mu sync.Mutex
	heard := false
	markHeard := func() {
		mu.Lock()
		heard = true
		mu.Unlock()
	}
	desc := &grpc.StreamDesc{StreamName: serviceMethod, ServerStreams: true, ClientStreams: true}
	var lastErr error
	wait := 50 * time.Millisecond
	for {
		// The stream ends when ctx does, but does not carry ctx's deadline:
		// sent along, it would let the server cut the stream off a moment
		// before ctx reports the deadline, and the call would fail with a
		// bare gRPC status instead of ctx's error.
		sctx, cancel := context.WithCancel(withToken(context.WithoutCancel(ctx), o.Token))
		stop := context.AfterFunc(ctx, cancel)
		cs, err := conn.NewStream(sctx, desc, sv.fullMethod(),
			grpc.MaxCallRecvMsgSize(serviceMaxMsg), grpc.MaxCallSendMsgSize(serviceMaxMsg))
		if err == nil {
			err = call(&ServiceStream{s: cs, peer: addr, heard: markHeard})
		}
		stop()
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			mu.Lock()
			unreachable := !heard && lastErr != nil
			mu.Unlock()
			if unreachable {
				return fmt.Errorf("%s not reachable: %s: %w", who, status.Convert(lastErr).Message(), ctx.Err())
			}
			return fmt.Errorf("%s: %w", who, ctx.Err())
		}
		st, isStatus := status.FromError(err)
		if !isStatus {
			return err
		}
		switch st.Code() {
		case codes.Unavailable:
			if tlsErr := refusal.get(); tlsErr != nil {
				return explainTLSRefusal(who, tlsErr)
			}
		case codes.Unauthenticated:
			return fmt.Errorf("%s %w: %s", who, ErrUnauthenticated, st.Message())
		case codes.Unimplemented:
			return fmt.Errorf("%s: the address serves no %s (%s): is it the %s's address?", who, sv.Name, st.Message(), sv.Noun)
		default:
			return fmt.Errorf("%s: %w", who, err)
		}
		lastErr = err
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		wait = min(2*wait, 500*time.Millisecond)
	}
}
