package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pipetrain/pipetrain/internal/certs"
)

// dialOptions and serverOptions are the plain-text, default-setting gRPC
// options that the tests' raw clients and servers use.
func dialOptions() []grpc.DialOption {
	return append(clientOptions(Options{}.withDefaults()), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func serverOptions() []grpc.ServerOption {
	return listenOptions(Options{}.withDefaults(), "test server")
}

// logRecorder is an Options.Logf that keeps what it is given.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// waitFor returns the lines once n of them contain all of want, or fails.
func (r *logRecorder) waitFor(t *testing.T, n int, want ...string) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		var hits []string
		for _, l := range r.lines {
			if containsAll(l, want) {
				hits = append(hits, l)
			}
		}
		all := append([]string(nil), r.lines...)
		r.mu.Unlock()
		if len(hits) >= n {
			return hits
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d log lines containing %q, got %q", n, want, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

type acceptResultT struct {
	l   Link
	err error
}

// acceptAsync runs Accept in the background; the link it returns, if any, is
// closed at cleanup.
func acceptAsync(t *testing.T, srv *Server, d time.Duration) <-chan acceptResultT {
	ch := make(chan acceptResultT, 1)
	go func() {
		l, err := srv.Accept(ctxT(t, d))
		ch <- acceptResultT{l, err}
	}()
	return ch
}

// TestTokenRefused: a dialer without the token, or with a wrong one, is
// refused at once with a clear error; the listener logs each refusal and
// keeps waiting, and the real neighbour then connects.
func TestTokenRefused(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(4)
	var rec logRecorder
	srv, err := Listen("127.0.0.1:0", down, Options{Token: "s3cret", Logf: rec.logf})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	accepted := acceptAsync(t, srv, 20*time.Second)

	for _, token := range []string{"", "wrong", "s3cret "} {
		start := time.Now()
		_, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{Token: token, ConnectTimeout: 10 * time.Second})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s refused the connection: bad or missing token (transport.token", srv.Addr())
		if !errors.Is(err, ErrUnauthenticated) || !strings.HasPrefix(fmt.Sprint(err), want) {
			t.Errorf("token %q: got %v, want ErrUnauthenticated starting %q", token, err, want)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("token %q: refusal took %v; it must not be retried", token, d)
		}
	}
	rec.waitFor(t, 3, fmt.Sprintf("stage 2 (%s): refused a connection from 127.0.0.1:", srv.Addr()), "bad or missing token")

	select {
	case r := <-accepted:
		t.Fatalf("Accept returned after refusals: %v, %v", r.l, r.err)
	default:
	}
	ul, dl := join(t, accepted, srv.Addr(), up, Options{Token: "s3cret"})
	exchange(t, ul, dl, 10, []int{4})
}

// TestStrangerTensorsNeverDelivered: a client without the token that opens
// the stream and sends a hello and tensors is refused before any of it is
// read. Accept does not return its link, and the neighbour that connects
// afterwards delivers its own tensors only.
func TestStrangerTensorsNeverDelivered(t *testing.T) {
	checkLeaks(t)
	shape := []int{4}
	up, down := hellos(shape...)
	var rec logRecorder
	opts := Options{Token: "s3cret", Logf: rec.logf}
	srv, err := Listen("127.0.0.1:0", down, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	cs := rawStream(t, srv)
	ctx := ctxT(t, 10*time.Second)
	hs := (&handshake{Hello: up}).marshal()
	for i, msg := range []frame{{hs}, strangerFrame(t, shape, 0), strangerFrame(t, shape, 1)} {
		if err := cs.SendMsg(msg); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	var reply []byte
	if err := cs.RecvMsg(&reply); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stranger got %v, want code Unauthenticated", err)
	}
	rec.waitFor(t, 1, "refused a connection from 127.0.0.1:", "bad or missing token")

	// Accept neither returns the stranger's link nor fails because of it.
	_, err = srv.Accept(ctxT(t, 300*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept after the stranger: %v, want a timeout", err)
	}

	accepted := acceptAsync(t, srv, 10*time.Second)
	ul, dl := join(t, accepted, srv.Addr(), up, opts)
	for mb := range 3 {
		if err := ul.Send(ctx, pattern(Activation, 1, int32(mb), shape)); err != nil {
			t.Fatal(err)
		}
	}
	for mb := range 3 {
		got, err := dl.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameTensor(pattern(Activation, 1, int32(mb), shape), got); err != nil {
			t.Fatalf("tensor %d: %v", mb, err)
		}
	}
	if got, err := dl.Recv(ctxT(t, 200*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an extra tensor arrived: %+v, %v", got, err)
	}
}

// strangerFrame is an activation a stranger sends; step 99 marks it.
func strangerFrame(t *testing.T, shape []int, mb int32) frame {
	t.Helper()
	x := pattern(Activation, 99, mb, shape)
	hdr, err := x.header()
	if err != nil {
		t.Fatal(err)
	}
	return frame{hdr, x.Data}
}

// issue makes a TLS identity for a stage on 127.0.0.1 signed by ca, trusting
// trust.
func issue(t *testing.T, ca, trust *certs.CA, name string) *TLS {
	t.Helper()
	p, err := ca.Issue(name, []string{"127.0.0.1", "::1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	trustPEM, err := trust.PEM()
	if err != nil {
		t.Fatal(err)
	}
	id, err := NewTLS(trustPEM.Cert, p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func newCA(t *testing.T, name string) *certs.CA {
	t.Helper()
	ca, err := certs.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestMutualTLS(t *testing.T) {
	checkLeaks(t)
	ca, other := newCA(t, "run CA"), newCA(t, "other CA")
	up, down := hellos(8)

	t.Run("good pair", func(t *testing.T) {
		_, ul, dl := connect(t, up, down, Options{TLS: issue(t, ca, ca, "stage 2")})
		exchange(t, ul, dl, 20, []int{8})
	})
	t.Run("good pair with a token", func(t *testing.T) {
		var rec logRecorder
		srv, err := Listen("127.0.0.1:0", down, Options{TLS: issue(t, ca, ca, "stage 2"), Token: "s3cret", Logf: rec.logf})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		accepted := acceptAsync(t, srv, 10*time.Second)
		_, err = Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{TLS: issue(t, ca, ca, "stage 1")})
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "bad or missing token") {
			t.Errorf("TLS without the token: %v", err)
		}
		rec.waitFor(t, 1, "bad or missing token")
		ul, dl := join(t, accepted, srv.Addr(), up, Options{TLS: issue(t, ca, ca, "stage 1"), Token: "s3cret"})
		exchange(t, ul, dl, 5, []int{8})
	})
	t.Run("dialer certificate from another CA", func(t *testing.T) {
		srv, rec := tlsServer(t, down, issue(t, ca, ca, "stage 2"))
		start := time.Now()
		_, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{TLS: issue(t, other, ca, "stage 1")})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s refused the connection: TLS: remote error: tls:", srv.Addr())
		if !errors.Is(err, ErrUnauthenticated) || !strings.HasPrefix(fmt.Sprint(err), want) {
			t.Errorf("got %v, want ErrUnauthenticated starting %q", err, want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("refusal took %v; it must not be retried until the timeout", d)
		}
		t.Log(err)
		// Go's TLS client sends no certificate that the listener's CA did
		// not sign, so the listener sees none.
		rec.waitFor(t, 1, fmt.Sprintf("stage 2 (%s): refused a connection from 127.0.0.1:", srv.Addr()), "TLS handshake failed")
		expectNoLink(t, srv)
	})
	t.Run("dialer without a certificate", func(t *testing.T) {
		srv, rec := tlsServer(t, down, issue(t, ca, ca, "stage 2"))
		caPEM, _ := ca.PEM()
		id, _ := NewTLS(caPEM.Cert, nil, nil)
		if id != nil {
			t.Fatal("NewTLS accepted a missing certificate")
		}
		trust := issue(t, ca, ca, "unused").CA
		creds := credentials.NewTLS(&tls.Config{RootCAs: trust, MinVersion: tls.VersionTLS13})
		conn, err := grpc.NewClient("passthrough:///"+srv.Addr(), append(clientOptions(Options{}.withDefaults()), grpc.WithTransportCredentials(creds))...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx := ctxT(t, 3*time.Second)
		cs, err := conn.NewStream(ctx, &streamDesc, fullMethod)
		if err == nil {
			err = cs.SendMsg(frame{(&handshake{Hello: up}).marshal()})
		}
		if err == nil {
			var reply []byte
			err = cs.RecvMsg(&reply)
		}
		if err == nil {
			t.Fatal("a client without a certificate got a reply")
		}
		rec.waitFor(t, 1, "refused a connection from 127.0.0.1:", "TLS handshake failed", "certificate")
		expectNoLink(t, srv)
	})
	t.Run("listener certificate from another CA", func(t *testing.T) {
		srv, _ := tlsServer(t, down, issue(t, other, other, "stage 2"))
		_, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{TLS: issue(t, ca, ca, "stage 1"), ConnectTimeout: 10 * time.Second})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s: its TLS certificate is not trusted:", srv.Addr())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
		t.Log(err)
	})
	t.Run("listener named by the job, not its host", func(t *testing.T) {
		// A job whose addresses are given at run time: the certificate
		// names the job, and the dialer checks that name.
		p, err := ca.Issue("stage 2", []string{certs.JobName}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		caPEM, _ := ca.PEM()
		id, err := NewTLS(caPEM.Cert, p.Cert, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		srv, _ := tlsServer(t, down, id)
		_, err = Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{TLS: issue(t, ca, ca, "stage 1"), ConnectTimeout: 10 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "its TLS certificate is not trusted") {
			t.Fatalf("checking the dialed host: %v", err)
		}
		byName := issue(t, ca, ca, "stage 1")
		byName.ServerName = certs.JobName
		accepted := acceptAsync(t, srv, 10*time.Second)
		ul, dl := join(t, accepted, srv.Addr(), up, Options{TLS: byName})
		exchange(t, ul, dl, 3, []int{8})
	})
	t.Run("TLS dialer, plain-text listener", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", down, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		_, err = Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{TLS: issue(t, ca, ca, "stage 1"), ConnectTimeout: 10 * time.Second})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s: TLS handshake failed:", srv.Addr())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
		t.Log(err)
	})
	t.Run("plain-text dialer", func(t *testing.T) {
		srv, rec := tlsServer(t, down, issue(t, ca, ca, "stage 2"))
		// A long connect timeout: the dialer must not spend it retrying.
		_, err := Dial(ctxT(t, 60*time.Second), srv.Addr(), up, Options{ConnectTimeout: 30 * time.Second})
		if err == nil {
			t.Fatal("a plain-text dialer connected to a TLS listener")
		}
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s: the listener closed the connection without sending a byte: it expects TLS, probably", srv.Addr())
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
		t.Log(err)
		rec.waitFor(t, 1, "refused a connection from 127.0.0.1:", "TLS handshake failed")
		expectNoLink(t, srv)
	})
}

func tlsServer(t *testing.T, down Hello, id *TLS) (*Server, *logRecorder) {
	t.Helper()
	rec := &logRecorder{}
	srv, err := Listen("127.0.0.1:0", down, Options{TLS: id, Logf: rec.logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, rec
}

// expectNoLink checks that Accept has nothing for the caller: a refused
// client neither produces a link nor fails Accept.
func expectNoLink(t *testing.T, srv *Server) {
	t.Helper()
	if l, err := srv.Accept(ctxT(t, 200*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accept: %v, %v; want a timeout", l, err)
	}
}

func TestListenBeyondLoopbackNeedsAuth(t *testing.T) {
	checkLeaks(t)
	_, down := hellos(2)
	_, err := Listen("0.0.0.0:0", down, Options{})
	want := "stage 2: refusing to listen on 0.0.0.0:0 without authentication"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want prefix %q", err, want)
	}
	srv, err := Listen("0.0.0.0:0", down, Options{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	for host, want := range map[string]bool{"127.0.0.1": true, "127.3.4.5": true, "::1": true, "localhost": true, "0.0.0.0": false, "": false, "::": false, "10.0.0.1": false, "example.com": false} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %t", host, got)
		}
	}
}

// freezeProxy forwards TCP connections to target until freeze, after which it
// forwards nothing, as a hung (stopped) peer would answer nothing.
type freezeProxy struct {
	lis    net.Listener
	target string
	frozen chan struct{}
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{lis: lis, target: target, frozen: make(chan struct{}), done: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) addr() string { return p.lis.Addr().String() }

func (p *freezeProxy) freeze() { close(p.frozen) }

func (p *freezeProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			<-p.done
			return
		default:
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *freezeProxy) close() {
	p.once.Do(func() {
		close(p.done)
		p.lis.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}

// TestHeartbeatDetectsHungDialer: with a 1s heartbeat and a 1s peer timeout,
// the listener's link fails within a few seconds of the dialer going silent,
// although its TCP connection stays open.
func TestHeartbeatDetectsHungDialer(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	opts := Options{Heartbeat: time.Second, PeerTimeout: time.Second, CloseTimeout: 500 * time.Millisecond}
	srv, err := Listen("127.0.0.1:0", down, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	proxy := startProxy(t, srv.Addr())
	accepted := acceptAsync(t, srv, 10*time.Second)
	ul, dl := join(t, accepted, proxy.addr(), up, opts)
	defer proxy.close() // before the links close, so the dialer sees its connection end
	exchange(t, ul, dl, 2, []int{2})

	proxy.freeze()
	start := time.Now()
	_, err = dl.Recv(ctxT(t, 8*time.Second))
	elapsed := time.Since(start)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv after the dialer hung: %v after %v; want the link to fail", err, elapsed)
	}
	if elapsed > 5*time.Second {
		t.Errorf("hung dialer noticed after %v, want about heartbeat+peer timeout (2s)", elapsed)
	}
	t.Logf("noticed after %v: %v", elapsed.Round(10*time.Millisecond), err)
}
