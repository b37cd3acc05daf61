package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// clientOptions are the gRPC options of a dialer with o's keep-alives; the
// caller adds the transport security.
func clientOptions(o Options) []grpc.DialOption {
	return []grpc.DialOption{
		experimental.WithBufferPool(wirePool),
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithWriteBufferSize(bufferSize),
		grpc.WithReadBufferSize(bufferSize),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: max(o.Heartbeat, minClientPing), Timeout: o.PeerTimeout, PermitWithoutStream: true}),
		// Stages start in any order, so the downstream one may not listen
		// yet: reconnect quickly rather than with gRPC's 1s..120s backoff.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(
			grpc.CallContentSubtype(codecName),
			grpc.MaxCallRecvMsgSize(maxMsgSize),
			grpc.MaxCallSendMsgSize(maxMsgSize),
		),
	}
}

// Dial connects to the downstream neighbour's address in self's group
// (pipeline: stage self.Stage+1, or stage 0 from the last stage when
// self.Ring; replica ring: replica (self.Replica+1) mod self.Replicas of the
// same stage), retrying until ConnectTimeout, sends its hello, waits for the
// reply hello and checks it.
// A refusal by either side is a *HandshakeError naming both sides; a
// listener that refuses the token or the TLS certificate makes Dial fail at
// once, with an error wrapping ErrUnauthenticated for a refusal the listener
// sent.
func Dial(ctx context.Context, addr string, self Hello, opts Options) (Link, error) {
	opts = opts.withDefaults()
	if err := self.validate(); err != nil {
		return nil, err
	}
	if self.downstream() < 0 {
		return nil, fmt.Errorf("stage %d is the last stage: it has no downstream neighbour to dial (Ring is false)", self.Stage)
	}
	self = self.clone()
	security, refusal := clientTransport(opts)
	conn, err := grpc.NewClient(dialTarget(addr), append(clientOptions(opts), security)...)
	if err != nil {
		return nil, fmt.Errorf("%s: downstream %s at %s: %w", self.who(), self.neighbour(self.downstream()), addr, err)
	}
	l, err := dialLink(ctx, conn, addr, self, opts, refusal)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return l, nil
}

// dialLink opens the stream and runs the handshake, retrying while the
// listener is unreachable. refusal, if not nil, records a TLS failure that no
// retry can cure.
func dialLink(ctx context.Context, conn *grpc.ClientConn, addr string, self Hello, opts Options, refusal *tlsRefusal) (*streamLink, error) {
	who := fmt.Sprintf("%s: downstream %s at %s", self.who(), self.neighbour(self.downstream()), addr)
	dctx, cancelDial := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancelDial()
	var lastErr error
	wait := 50 * time.Millisecond
	for {
		// The stream outlives ctx, so it gets its own context, tied to
		// dctx only until the handshake is done.
		sctx, cancel := context.WithCancel(withToken(context.Background(), opts.Token))
		detach := context.AfterFunc(dctx, cancel)
		abort := func(err error) (*streamLink, error) {
			detach()
			cancel()
			return nil, err
		}
		cs, err := conn.NewStream(sctx, &streamDesc, fullMethod, grpc.MaxCallRecvMsgSize(recvLimit(self)))
		if err == nil {
			err = cs.SendMsg(frame{(&handshake{Hello: self}).marshal()})
			if errors.Is(err, io.EOF) {
				err = nil // the listener ended the stream (a refusal): RecvMsg says why
			}
		}
		reply := helloBytes{limit: helloLimit(self)}
		if err == nil {
			err = cs.RecvMsg(&reply)
		}
		if reply.err != nil {
			return abort(fmt.Errorf("%s: %w", who, reply.err))
		}
		if err == nil {
			var hs handshake
			if err := hs.unmarshal(reply.b); err != nil {
				return abort(fmt.Errorf("%s: %w", who, err))
			}
			if hs.Refused != "" {
				return abort(&HandshakeError{hs.Refused})
			}
			if err := CheckPeer(self, hs.Hello, true); err != nil {
				return abort(err)
			}
			if !detach() { // dctx expired just now and cancelled the stream
				return abort(fmt.Errorf("%s: handshake not done within %v", who, opts.ConnectTimeout))
			}
			l := newStreamLink(cs, self, hs.Hello, Activation, opts)
			l.shutdown = func(writerExited bool, deadline time.Time) {
				// After a clean flush, half-close and wait (bounded) for the
				// listener to end the stream, so that the data still queued
				// in gRPC is delivered rather than discarded by the cancel.
				if writerExited && !l.isDead() && cs.CloseSend() == nil {
					timer := time.NewTimer(time.Until(deadline))
					select {
					case <-l.readerDone:
					case <-timer.C:
					}
					timer.Stop()
				}
				cancel()
				conn.Close()
			}
			l.start()
			return l, nil
		}
		abort(nil)

		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", who, ctx.Err())
		}
		if status.Code(err) == codes.Unauthenticated {
			return nil, fmt.Errorf("%s %w: %s", who, ErrUnauthenticated, status.Convert(err).Message())
		}
		if refusal != nil && status.Code(err) == codes.Unavailable {
			if tlsErr := refusal.get(); tlsErr != nil {
				return nil, explainTLSRefusal(who, tlsErr)
			}
		}
		timedOut := dctx.Err() != nil
		if !timedOut && status.Code(err) != codes.Unavailable {
			return nil, fmt.Errorf("%s: %w", who, err) // not a connection problem: retrying will not help
		}
		if lastErr == nil || !timedOut { // an error caused by the deadline itself says less
			lastErr = err
		}
		if timedOut {
			return nil, fmt.Errorf("%s not reachable within %v: %v", who, opts.ConnectTimeout, lastErr)
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-dctx.Done():
		}
		timer.Stop()
		wait = min(2*wait, 500*time.Millisecond)
	}
}
