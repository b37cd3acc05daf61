package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// Stages on one host may talk over a Unix socket instead of TCP: an address
// "unix:PATH" names the socket file. Only processes on the host (with access to
// the file) can connect, so such a link needs no token to be safe, and the
// kernel moves the bytes without the TCP stack.

// UnixPath returns the socket path of a "unix:PATH" address.
func UnixPath(addr string) (string, bool) {
	path, ok := strings.CutPrefix(addr, "unix:")
	return path, ok && path != ""
}

// listen binds addr: a TCP host:port, or a Unix socket. A socket file left by a
// process that died (nobody accepts on it) is replaced; one in use is an error.
func listen(addr string) (net.Listener, error) {
	path, unix := UnixPath(addr)
	if !unix {
		return net.Listen("tcp", addr)
	}
	lis, err := net.Listen("unix", path)
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
		return lis, err
	}
	if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
		c.Close()
		return nil, err // a live listener owns it
	}
	if st, serr := os.Lstat(path); serr != nil || st.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%s exists and is not a socket: %w", path, err)
	}
	if rerr := os.Remove(path); rerr != nil {
		return nil, rerr
	}
	return net.Listen("unix", path)
}

// dialTarget is the gRPC target of addr: gRPC's unix resolver for a socket,
// passthrough (no DNS lookup) for host:port.
func dialTarget(addr string) string {
	if path, ok := UnixPath(addr); ok {
		return "unix:" + path
	}
	return "passthrough:///" + addr
}

// listenAddr is a listener's address as Dial takes it: host:port, or unix:PATH.
func listenAddr(lis net.Listener) string {
	if a, ok := lis.Addr().(*net.UnixAddr); ok {
		return "unix:" + a.Name
	}
	return lis.Addr().String()
}
