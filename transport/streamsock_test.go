package transport

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// streamSocketNetwork is what a stream between two processes of this host
// runs on: the listener's Unix stream socket where abstract sockets exist.
func streamSocketNetwork() string {
	if runtime.GOOS == "linux" {
		return "unix"
	}
	return "tcp"
}

func needStreamSockets(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("stream sockets are abstract Unix sockets, which only Linux has")
	}
}

// TestStreamSocketRefusesStrangers: on the listener's stream socket, as on
// its TCP address, a connection without the token is refused on its
// 32-byte proof before anything more is read, and closed; one that sends no
// stream preface is closed unanswered; a dialer with a missing or wrong
// token gets ErrUnauthenticated; all are logged and none reaches
// AcceptStream; then the real neighbour's stream comes through the socket.
func TestStreamSocketRefusesStrangers(t *testing.T) {
	needStreamSockets(t)
	checkLeaks(t)
	rl := newRingLink(t, "127.0.0.1:0", Options{Token: "s3cret"}, Options{Token: "s3cret"})
	sock := rl.link.Peer().StreamSocket
	if !strings.HasPrefix(sock, streamSocketPrefix) {
		t.Fatalf("the listener's answer names stream socket %q", sock)
	}
	accepted := acceptStreamAsync(t, rl.srv, 20*time.Second)

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proof := tokenProof("guess")
	if _, err := c.Write(append([]byte(streamPreface), proof[:]...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	refusal, err := readStreamAnswer(c)
	if err != nil || refusal != badTokenMsg {
		t.Fatalf("stranger's answer: %q, %v; want the token refusal", refusal, err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the listener kept the stranger's connection open: %d, %v", n, err)
	}

	// The socket serves ring streams only: a gRPC client's preface is not one.
	g, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Write([]byte("PRI * HTTP/2.0\r\n")); err != nil {
		t.Fatal(err)
	}
	g.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := g.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the stream socket answered a connection that sent no stream preface: %d, %v", n, err)
	}

	for _, token := range []string{"", "wrong"} {
		_, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{Token: token})
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "bad or missing token") {
			t.Errorf("token %q: %v, want ErrUnauthenticated", token, err)
		}
	}
	rl.rec.waitFor(t, 3, "refused a ring stream from a process on this host (Unix socket)", "bad or missing token")
	rl.rec.waitFor(t, 1, "closed a connection to its stream socket", "sent no ring stream preface")
	select {
	case r := <-accepted:
		t.Fatalf("AcceptStream returned after refusals: %v, %v", r.in, r.err)
	default:
	}

	out, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	if out.Network() != "unix" || res.in.Network() != "unix" {
		t.Errorf("the neighbour's stream runs on %s / %s, want its stream socket", out.Network(), res.in.Network())
	}
	sendAndCheck(t, out, res.in, 3)
}

// TestStreamSocketTLSRefusesForeignCertificate: under mutual TLS a dialer
// on the stream socket whose certificate another CA signed is refused
// with ErrUnauthenticated and never reaches AcceptStream.
func TestStreamSocketTLSRefusesForeignCertificate(t *testing.T) {
	needStreamSockets(t)
	checkLeaks(t)
	ca, other := newCA(t, "run CA"), newCA(t, "other CA")
	rl := newRingLink(t, "127.0.0.1:0", Options{TLS: issue(t, ca, ca, "replica 1")}, Options{TLS: issue(t, ca, ca, "replica 0")})
	accepted := acceptStreamAsync(t, rl.srv, 20*time.Second)
	_, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{TLS: issue(t, other, ca, "replica 0")})
	if !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("foreign certificate: %v, want ErrUnauthenticated", err)
	}
	rl.rec.waitFor(t, 1, "refused a ring stream from a process on this host (Unix socket)", "TLS handshake failed")
	select {
	case r := <-accepted:
		t.Fatalf("AcceptStream returned a stranger: %v, %v", r.in, r.err)
	default:
	}
}

// TestStreamSocketFallsBackToTCP: a stream socket that cannot be reached
// (here one nobody listens on) leaves the stream on TCP, logged.
func TestStreamSocketFallsBackToTCP(t *testing.T) {
	needStreamSockets(t)
	checkLeaks(t)
	rl := newRingLink(t, "127.0.0.1:0", Options{}, Options{})
	accepted := acceptStreamAsync(t, rl.srv, 20*time.Second)
	peer := rl.link.Peer()
	peer.StreamSocket = streamSocketPrefix + "gone"
	rec := &logRecorder{}
	out, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, peer, Options{Logf: rec.logf})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	if out.Network() != "tcp" {
		t.Errorf("stream on %s, want tcp", out.Network())
	}
	rec.waitFor(t, 1, "its stream socket on this host is unreachable", "the stream goes over TCP")
	sendAndCheck(t, out, res.in, 2)
}

// A dialer tries a peer's stream socket only on the same host, only for a
// name this package makes, and not when told to stay on TCP.
func TestUseStreamSocket(t *testing.T) {
	needStreamSockets(t)
	self := Hello{Address: "10.0.0.1:7000"}
	peer := Hello{StreamSocket: streamSocketPrefix + "00"}
	for _, c := range []struct {
		addr string
		peer Hello
		opts Options
		want bool
	}{
		{"10.0.0.1:7001", peer, Options{}, true},
		{"10.0.0.2:7001", peer, Options{}, false},
		{"host0:7001", peer, Options{}, false},
		{"10.0.0.1:7001", peer, Options{StreamsOverTCP: true}, false},
		{"10.0.0.1:7001", Hello{}, Options{}, false},
		{"10.0.0.1:7001", Hello{StreamSocket: "/run/other.sock"}, Options{}, false},
		{"10.0.0.1:7001", Hello{StreamSocket: "@other"}, Options{}, false},
	} {
		if got := useStreamSocket(c.addr, self, c.peer, c.opts); got != c.want {
			t.Errorf("to %s, peer socket %q, %+v: %v, want %v", c.addr, c.peer.StreamSocket, c.opts, got, c.want)
		}
	}
}
