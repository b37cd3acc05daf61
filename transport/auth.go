package transport

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// ErrUnauthenticated is wrapped by Dial's error when the listener refused the
// dialer's token, or its TLS certificate.
var ErrUnauthenticated = errors.New("refused the connection")

// tokenKey is the stream metadata that carries Options.Token. The "-bin"
// suffix makes gRPC base64 it on the wire, so a token may hold any bytes.
const tokenKey = "pipetrain-token-bin"

// badTokenMsg is the listener's whole answer to a bad token; it names the
// setting to fix and nothing about the expected value.
const badTokenMsg = "bad or missing token (transport.token or transport.token_file must be the same on every stage)"

// TLS is one stage's identity for mutual TLS: its certificate, used both to
// listen and to dial since every stage does both, and the CA that must have
// signed the certificate of every other stage.
type TLS struct {
	Cert tls.Certificate
	CA   *x509.CertPool
	// ServerName, when set, is the name a dialer requires in the
	// listener's certificate instead of the dialed host: for a job whose
	// addresses are given at run time, which certificates made beforehand
	// cannot name.
	ServerName string
}

// LoadTLS reads PEM files: the CA's certificate and this stage's certificate
// and private key. Errors name the file at fault.
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("certificate file: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	t, err := NewTLS(caPEM, certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("TLS files %s, %s, %s: %w", caFile, certFile, keyFile, err)
	}
	return t, nil
}

// NewTLS is LoadTLS from PEM bytes.
func NewTLS(caPEM, certPEM, keyPEM []byte) (*TLS, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the CA file holds no PEM certificate")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate and key: %w", err)
	}
	return &TLS{Cert: cert, CA: pool}, nil
}

// serverConfig makes the listener demand a certificate signed by the CA, so
// a process without one never gets as far as the gRPC service.
func (t *TLS) serverConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{t.Cert},
		ClientCAs:    t.CA,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13, // both ends are this program
	}
}

// clientConfig makes the dialer check the listener against the CA (and the
// dialed host against the certificate's names) and present its own
// certificate.
func (t *TLS) clientConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{t.Cert},
		RootCAs:      t.CA,
		ServerName:   t.ServerName,
		MinVersion:   tls.VersionTLS13,
	}
}

// authenticated reports whether o makes strangers unable to connect.
func (o Options) authenticated() bool { return o.Token != "" || o.TLS != nil }

// IsLoopback reports whether a listen host (an address without its port)
// reaches this machine only: 127.0.0.0/8, ::1 or localhost. An empty host
// means every interface.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkExposure refuses to listen beyond loopback without authentication:
// anyone on the network could otherwise open the stream and feed tensors.
func checkExposure(addr string, o Options) error {
	if o.authenticated() {
		return nil
	}
	if _, unix := UnixPath(addr); unix {
		return nil // only this host can reach a socket file
	}
	host, _, err := net.SplitHostPort(addr)
	if err == nil && IsLoopback(host) {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without authentication: other machines could connect; set a token or TLS (transport.token, transport.tls) or listen on a loopback address", addr)
}

// withToken attaches the token to a stream's context, as metadata sent with
// the stream's headers, before any message.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, tokenKey, token)
}

// tokenMatches compares the presented token with the expected one in
// constant time. Hashing first makes the time independent of the length too.
func tokenMatches(ctx context.Context, want string) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(tokenKey)
	if len(got) != 1 {
		return false
	}
	g, w := sha256.Sum256([]byte(got[0])), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// remoteAddr names the other end of a stream for logs.
func remoteAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "an unknown address"
}

// serverCreds is the listener's TLS, logging every refused handshake: a
// refusal happens below the gRPC service, where nothing else would see it.
type serverCreds struct {
	credentials.TransportCredentials
	logf func(format string, args ...any)
	who  string // the listening stage, for the log
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.logf("%s: refused a connection from %s: TLS handshake failed: %v", c.who, raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{c.TransportCredentials.Clone(), c.logf, c.who}
}

// clientCreds is the dialer's TLS. It remembers a failure that retrying
// cannot cure (the listener's certificate is not trusted, or the listener
// refused ours), which gRPC would otherwise report only as "unavailable",
// so that Dial stops at once with the reason.
type clientCreds struct {
	credentials.TransportCredentials
	refusal *tlsRefusal
}

type tlsRefusal struct {
	mu  sync.Mutex
	err error
}

func (r *tlsRefusal) set(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

func (r *tlsRefusal) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if permanentTLSError(err) {
			c.refusal.set(err)
		}
		return nil, nil, err
	}
	return &alertConn{Conn: conn, refusal: c.refusal}, info, nil
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	return &clientCreds{c.TransportCredentials.Clone(), c.refusal}
}

// alertConn records a TLS alert from the listener. With TLS 1.3 the dialer's
// handshake is over before the listener checks the dialer's certificate, so
// a refusal arrives as an alert on the first read.
type alertConn struct {
	net.Conn
	refusal *tlsRefusal
}

func (c *alertConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && isRemoteAlert(err) {
		c.refusal.set(err)
	}
	return n, err
}

// permanentTLSError tells a TLS failure that will recur on every attempt from
// a network error that a retry may cure (a listener restarting).
func permanentTLSError(err error) bool {
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError // the listener does not speak TLS
	return errors.As(err, &verify) || errors.As(err, &header) || isRemoteAlert(err)
}

// isRemoteAlert reports whether err is a TLS alert sent by the peer: crypto/tls
// reports those as a net.OpError with Op "remote error".
func isRemoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// explainTLSRefusal words a recorded TLS failure for Dial's error.
func explainTLSRefusal(who string, err error) error {
	var verify *tls.CertificateVerificationError
	switch {
	case errors.Is(err, errSilentListener):
		return fmt.Errorf("%s: %v: it expects TLS, probably (set the same transport.tls on every stage)", who, err)
	case errors.As(err, &verify):
		return fmt.Errorf("%s: its TLS certificate is not trusted: %v (transport.tls.ca must be the CA that signed every stage's certificate, and the certificate must name the host dialed)", who, err)
	case isRemoteAlert(err):
		return fmt.Errorf("%s %w: TLS: %v (is this stage's certificate signed by the CA in the other stage's transport.tls.ca?)", who, ErrUnauthenticated, err)
	}
	return fmt.Errorf("%s: TLS handshake failed: %v (does the other stage use transport.tls too?)", who, err)
}

// clientTransport is a dialer's transport security, and the record of a
// refusal no retry can cure.
func clientTransport(o Options) (grpc.DialOption, *tlsRefusal) {
	r := &tlsRefusal{}
	if o.TLS == nil {
		return grpc.WithTransportCredentials(&plainCreds{insecure.NewCredentials(), r}), r
	}
	return grpc.WithTransportCredentials(&clientCreds{credentials.NewTLS(o.TLS.clientConfig()), r}), r
}

// errSilentListener is what a plain-text dialer records when the listener
// hangs up without sending a byte. A gRPC listener speaks first (its HTTP/2
// settings), so one that only hangs up expects something else: TLS, as a
// rule, whose listener drops a connection whose first record is not a TLS
// handshake.
var errSilentListener = errors.New("the listener closed the connection without sending a byte")

// plainCreds are a plain-text dialer's credentials, which watch each
// connection for a listener that hangs up without a word (errSilentListener).
type plainCreds struct {
	credentials.TransportCredentials
	refusal *tlsRefusal
}

func (c *plainCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return &silenceConn{Conn: conn, refusal: c.refusal}, info, nil
}

func (c *plainCreds) Clone() credentials.TransportCredentials {
	return &plainCreds{c.TransportCredentials.Clone(), c.refusal}
}

// silenceConn records errSilentListener when the connection ends before its
// first byte arrives. gRPC reads a connection from one goroutine.
type silenceConn struct {
	net.Conn
	refusal *tlsRefusal
	heard   bool
}

func (c *silenceConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.heard = true
	}
	if err != nil && !c.heard && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		c.refusal.set(errSilentListener)
	}
	return n, err
}

// serverTransport is a listener's transport security; who names the
// listening stage in the log of refused handshakes.
func serverTransport(o Options, who string) grpc.ServerOption {
	if o.TLS == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(&serverCreds{credentials.NewTLS(o.TLS.serverConfig()), o.Logf, who})
}
