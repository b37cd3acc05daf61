package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"time"
)

// Stream sockets: between processes of one host a ring stream need not
// cross the TCP stack. A listener that takes ring streams on a TCP address
// also listens on an abstract Unix socket of a random name and tells its
// ring neighbour that name in its handshake answer (Hello.StreamSocket).
// A dialer whose own address names the same host as the listener's (the
// host parts compared as written, as the hierarchical all-reduce groups
// replicas into hosts) opens its stream there; anywhere else, or where the
// socket cannot be reached, over TCP, as before.
//
// The socket is only another way in: a connection on it goes through the
// same steps as a stream on the TCP address (the preface, TLS, the token
// proof, the hello of the link's peer) in serveStream, and a stranger is
// refused the same way. Abstract sockets belong to a network namespace, so
// a process on another host (or in another namespace of this machine, as
// the tests' hosts are) cannot reach one even by name; they are Linux's,
// so elsewhere there is no stream socket and streams stay on TCP.

// streamSocketPrefix starts every stream socket's name; a dialer dials no
// other name a peer's hello gives.
const streamSocketPrefix = "@pipetrain-ring-"

// listenStreamSocket binds a fresh stream socket: its listener and name, or
// none where abstract sockets do not exist.
func listenStreamSocket() (net.Listener, string, error) {
	if runtime.GOOS != "linux" {
		return nil, "", nil
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, "", err
	}
	name := streamSocketPrefix + hex.EncodeToString(id[:])
	lis, err := net.Listen("unix", name)
	if err != nil {
		return nil, "", err
	}
	return lis, name, nil
}

// serveStreamSocket takes the ring streams that reach lis, the server's
// stream socket, until it is closed.
func (s *Server) serveStreamSocket(lis net.Listener) {
	for {
		c, err := lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		go s.routeStreamSocket(c)
	}
}

// routeStreamSocket hands a connection to the stream socket to serveStream
// once it has sent the stream preface; nothing else is served there.
func (s *Server) routeStreamSocket(c net.Conn) {
	head, err := readPreface(c, s.opts.ConnectTimeout)
	if err != nil || string(head) != streamPreface {
		s.opts.Logf("%s: closed a connection to its stream socket from %s that sent no ring stream preface", s.roles[0].self.name(), remoteName(c))
		c.Close()
		return
	}
	s.serveStream(c)
}

// readPreface reads a new connection's first bytes, as many as the stream
// preface has, waiting at most within: what came, and why no more did.
func readPreface(c net.Conn, within time.Duration) ([]byte, error) {
	var head [len(streamPreface)]byte
	c.SetReadDeadline(time.Now().Add(within))
	n, err := io.ReadFull(c, head[:])
	c.SetReadDeadline(time.Time{})
	return head[:n], err
}

// remoteName is how refusals name a connection's other end: its address,
// or for a Unix socket, whose dialers have none, the host.
func remoteName(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil || a.Network() == "unix" {
		return "a process on this host (Unix socket)"
	}
	return a.String()
}

// sameHost reports whether addresses a and b name the same host: both
// host:port with equal host parts, as written.
func sameHost(a, b string) bool {
	ha, _, errA := net.SplitHostPort(a)
	hb, _, errB := net.SplitHostPort(b)
	return errA == nil && errB == nil && ha == hb
}

// dialStreamConn connects a ring stream to the listener at addr: over its
// Unix socket for a "unix:" address; over its stream socket when it has one
// and is on this host; else, or when the stream socket cannot be reached
// (which is logged), over TCP. It returns the connection and what it was
// opened on.
func dialStreamConn(ctx context.Context, addr string, self, peer Hello, opts Options) (net.Conn, error) {
	var d net.Dialer
	if path, ok := UnixPath(addr); ok {
		return d.DialContext(ctx, "unix", path)
	}
	if useStreamSocket(addr, self, peer, opts) {
		c, err := d.DialContext(ctx, "unix", peer.StreamSocket)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		opts.Logf("%s: ring stream to %s: its stream socket on this host is unreachable (%v); the stream goes over TCP", self.who(), peer.name(), err)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// useStreamSocket reports whether a ring stream to the listener at addr,
// whose handshake answer was peer, should try its stream socket.
func useStreamSocket(addr string, self, peer Hello, opts Options) bool {
	return !opts.StreamsOverTCP && runtime.GOOS == "linux" &&
		strings.HasPrefix(peer.StreamSocket, streamSocketPrefix) && sameHost(addr, self.Address)
}

// Network is what the stream runs on: "tcp", or "unix" for a Unix socket
// (a "unix:" address or the listener's stream socket).
func (s *StreamOut) Network() string { return s.conn.LocalAddr().Network() }

// Network is what the stream runs on, as StreamOut's.
func (s *StreamIn) Network() string { return s.conn.LocalAddr().Network() }

// streamSocketError says why Listen went on without a stream socket.
func streamSocketError(who string, err error) string {
	return fmt.Sprintf("%s: no Unix stream socket (%v): ring streams from this host come over TCP", who, err)
}

// openStreamSocket gives a server that takes ring streams on a TCP address
// its stream socket, named in its replica ring role's hello. Without one
// (another OS, or the bind failed, which is logged) the streams come over
// TCP.
func (s *Server) openStreamSocket() {
	r := s.role(ReplicaGroup)
	if r == nil {
		return
	}
	if _, unix := UnixPath(s.Addr()); unix {
		return // the address itself is a Unix socket
	}
	lis, name, err := listenStreamSocket()
	if err != nil {
		s.opts.Logf("%s", streamSocketError(r.self.name(), err))
		return
	}
	if lis == nil {
		return
	}
	s.streamLis = lis
	r.self.StreamSocket = name
	go s.serveStreamSocket(lis)
}
