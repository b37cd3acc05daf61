package stages

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/transport"
)

// Metrics is what a stage exposes to Prometheus while it trains: step time, action
// durations by kind, bytes moved, queue depths of its links and stashed
// activations. The runtime updates it; an HTTP handler renders it.
type Metrics struct {
	mu          sync.Mutex
	stage       int
	steps       int64
	lastStep    time.Duration
	actionSum   map[string]time.Duration
	actionCount map[string]int64
	bytesSent   int64
	bytesRecv   int64
	stashed     int
	links       map[string]transport.Link // "prev", "next"
}

func newMetrics(stage int) *Metrics {
	return &Metrics{stage: stage, actionSum: map[string]time.Duration{}, actionCount: map[string]int64{}, links: map[string]transport.Link{}}
}

func (m *Metrics) action(kind string, d time.Duration, sent int64, stashed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.actionSum[kind] += d
	m.actionCount[kind]++
	m.bytesSent += sent
	m.stashed = stashed
}

func (m *Metrics) received(n int64) {
	m.mu.Lock()
	m.bytesRecv += n
	m.mu.Unlock()
}

func (m *Metrics) step(d time.Duration) {
	m.mu.Lock()
	m.steps++
	m.lastStep = d
	m.mu.Unlock()
}

// ServeHTTP writes the metrics in Prometheus's text exposition format.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	m.WriteTo(w)
}

// WriteTo renders the metrics in Prometheus's text exposition format.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	p := func(format string, args ...any) {
		k, _ := fmt.Fprintf(w, format, args...)
		n += int64(k)
	}
	s := m.stage
	p("# HELP pipetrain_steps_total Training steps this stage has finished.\n# TYPE pipetrain_steps_total counter\n")
	p("pipetrain_steps_total{stage=\"%d\"} %d\n", s, m.steps)
	p("# HELP pipetrain_step_seconds Wall time of the stage's last step.\n# TYPE pipetrain_step_seconds gauge\n")
	p("pipetrain_step_seconds{stage=\"%d\"} %g\n", s, m.lastStep.Seconds())
	p("# HELP pipetrain_action_seconds Time spent computing actions, by kind (F, B, I, W, OPT).\n# TYPE pipetrain_action_seconds summary\n")
	kinds := make([]string, 0, len(m.actionSum))
	for k := range m.actionSum {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		p("pipetrain_action_seconds_sum{stage=\"%d\",kind=%q} %g\n", s, k, m.actionSum[k].Seconds())
		p("pipetrain_action_seconds_count{stage=\"%d\",kind=%q} %d\n", s, k, m.actionCount[k])
	}
	p("# HELP pipetrain_sent_bytes_total Tensor payload bytes sent to neighbours.\n# TYPE pipetrain_sent_bytes_total counter\n")
	p("pipetrain_sent_bytes_total{stage=\"%d\"} %d\n", s, m.bytesSent)
	p("# HELP pipetrain_received_bytes_total Tensor payload bytes received from neighbours.\n# TYPE pipetrain_received_bytes_total counter\n")
	p("pipetrain_received_bytes_total{stage=\"%d\"} %d\n", s, m.bytesRecv)
	p("# HELP pipetrain_stashed_microbatches Micro-batches whose activations the stage holds.\n# TYPE pipetrain_stashed_microbatches gauge\n")
	p("pipetrain_stashed_microbatches{stage=\"%d\"} %d\n", s, m.stashed)
	p("# HELP pipetrain_queue_depth Tensors waiting in a link's queue.\n# TYPE pipetrain_queue_depth gauge\n")
	for _, name := range []string{"prev", "next"} {
		if q, ok := m.links[name].(transport.QueueReporter); ok {
			send, recv := q.Queues()
			p("pipetrain_queue_depth{stage=\"%d\",link=%q,queue=\"send\"} %d\n", s, name, send)
			p("pipetrain_queue_depth{stage=\"%d\",link=%q,queue=\"recv\"} %d\n", s, name, recv)
		}
	}
	return n, nil
}

// MetricsAuth is what a scraper must present to read a stage's metrics, the
// same secrets its links require: Token as "Authorization: Bearer <Token>",
// and with TLS set, HTTPS with a client certificate signed by the run's CA.
// Both are required when both are set. The zero MetricsAuth requires nothing,
// and then the metrics may be served on loopback only, as the links may.
type MetricsAuth struct {
	Token string
	TLS   *transport.TLS
}

// MetricsAuthFor is stage i's MetricsAuth: the token and the TLS identity of
// its links (transport.token or token_file, transport.tls).
func MetricsAuthFor(c *configs.Config, i int) (MetricsAuth, error) {
	opts, err := LinkOptions(c, i)
	if err != nil {
		return MetricsAuth{}, err
	}
	return MetricsAuth{Token: opts.Token, TLS: opts.TLS}, nil
}

// Scheme is the URL scheme the metrics are served with: https with TLS.
func (a MetricsAuth) Scheme() string {
	if a.TLS != nil {
		return "https"
	}
	return "http"
}

func (a MetricsAuth) authenticated() bool { return a.Token != "" || a.TLS != nil }

// ServeMetrics serves m on addr at /metrics, without authentication, so on a
// loopback address only; see ServeMetricsAuth.
func ServeMetrics(addr string, m *Metrics) (stop func(), bound string, err error) {
	return ServeMetricsAuth(addr, m, MetricsAuth{})
}

// ServeMetricsAuth serves m on addr at /metrics until the returned stop is
// called, and returns the address it bound (addr may name port 0). A request
// without what auth requires is refused. Without authentication it refuses to
// listen beyond loopback: anyone on the network could read the run's metrics.
func ServeMetricsAuth(addr string, m *Metrics, auth MetricsAuth) (stop func(), bound string, err error) {
	if !auth.authenticated() {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || !transport.IsLoopback(host) {
			return nil, "", fmt.Errorf("refusing to serve metrics on %s without authentication: other machines could read them; set transport.token (or token_file) or transport.tls, or use a loopback address", addr)
		}
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("metrics on %s: %w", addr, err)
	}
	var h http.Handler = m
	if auth.Token != "" {
		h = requireBearer(auth.Token, h)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	serve := func() error { return srv.Serve(lis) }
	if auth.TLS != nil {
		srv.TLSConfig = &tls.Config{
			Certificates: []tls.Certificate{auth.TLS.Cert},
			ClientCAs:    auth.TLS.CA,
			ClientAuth:   tls.RequireAndVerifyClientCert,
			// Scrapers are not this program: TLS 1.2 lets older ones in.
			MinVersion: tls.VersionTLS12,
		}
		serve = func() error { return srv.ServeTLS(lis, "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener is ours; Serve ends only when Close is called
		}
	}()
	return func() { srv.Close() }, lis.Addr().String(), nil
}

// requireBearer passes on the requests that carry "Authorization: Bearer
// token", compared in constant time, and answers the others 401.
func requireBearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		g := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(g[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pipetrain metrics"`)
			http.Error(w, "bad or missing bearer token (the run's transport.token)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
