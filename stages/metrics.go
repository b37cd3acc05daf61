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
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// Metrics is what a stage exposes to Prometheus while it trains: step time,
// busy and idle time within steps (the bubble), samples trained, action
// durations by kind, bytes moved on each link, queue depths of its links and
// stashed activations. The runtime updates it; an HTTP handler renders it.
type Metrics struct {
	mu          sync.Mutex
	stage       int
	steps       int64
	lastStep    time.Duration
	stepTime    time.Duration // summed over the finished steps
	busy, idle  time.Duration // summed over the finished steps
	samples     int64
	actionSum   map[string]time.Duration
	actionCount map[string]int64
	// stepBusy and stepOther accumulate the step in progress: compute
	// actions, and the optimizer (neither busy nor idle: the pipeline's
	// bubble is measured on its pipelined phase, as the profile does).
	stepBusy, stepOther time.Duration
	sent, recv          map[string]int64 // by link: "prev", "next", "replicas"
	stashed             int
	links               map[string]transport.Link // "prev", "next"
	// A worker's steps under parameter servers: their pushes' and pulls'
	// times, summed, and the last push's staleness.
	serverSteps    int64
	pushed, pulled time.Duration
	lastStaleness  int64
}

// linkOrder is the order links are listed in: the pipeline's, then the
// replicas' ring.
var linkOrder = []string{"prev", "next", "replicas", "servers"}

func newMetrics(stage int) *Metrics {
	return &Metrics{stage: stage, actionSum: map[string]time.Duration{}, actionCount: map[string]int64{},
		sent: map[string]int64{}, recv: map[string]int64{}, links: map[string]transport.Link{}}
}

// addLink lists the link to a neighbour, name "prev" or "next", with zero
// bytes until it moves some, so a dashboard sees every link from the first
// scrape on; l (nil in tests) reports its queues.
func (m *Metrics) addLink(name string, l transport.Link) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent[name], m.recv[name] = m.sent[name], m.recv[name]
	if l != nil {
		m.links[name] = l
	}
}

// action records an action of kind that took d, of which blocked went by
// waiting for room in a send queue, the neighbour's hold-up rather than this
// stage's work.
func (m *Metrics) action(kind string, d, blocked time.Duration, stashed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.actionSum[kind] += d
	m.actionCount[kind]++
	m.stashed = stashed
	switch kind {
	case runlog.Forward, runlog.Backward, runlog.Input, runlog.Weight, runlog.Recompute:
		m.stepBusy += max(d-blocked, 0)
	case runlog.Optimizer:
		m.stepOther += d
	}
}

// sentOn and receivedOn count tensor payload bytes moved on a link.
func (m *Metrics) sentOn(link string, n int64) {
	m.mu.Lock()
	m.sent[link] += n
	m.mu.Unlock()
}

func (m *Metrics) receivedOn(link string, n int64) {
	m.mu.Lock()
	m.recv[link] += n
	m.mu.Unlock()
}

// serversStep records a worker stage's push and pull of a step, and its
// push's staleness.
func (m *Metrics) serversStep(push, pull time.Duration, staleness int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.serverSteps++
	m.pushed += push
	m.pulled += pull
	m.lastStaleness = staleness
}

// stepCompute is the time the step in progress has spent computing
// forward and backward passes so far.
func (m *Metrics) stepCompute() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stepBusy
}

// step ends a training step that took d and trained samples examples: its
// compute actions count as busy, the rest but the optimizer as idle.
func (m *Metrics) step(d time.Duration, samples int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.steps++
	m.lastStep = d
	m.stepTime += d
	m.samples += int64(samples)
	busy := min(m.stepBusy, d)
	m.busy += busy
	m.idle += max(d-busy-m.stepOther, 0)
	m.stepBusy, m.stepOther = 0, 0
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
	e := &expositionWriter{w: w}
	p, family := e.printf, e.family
	s := m.stage
	family("pipetrain_steps_total", "counter", "Training steps this stage has finished.")
	p("pipetrain_steps_total{stage=\"%d\"} %d\n", s, m.steps)
	family("pipetrain_step_seconds", "gauge", "Wall time of the stage's last step.")
	p("pipetrain_step_seconds{stage=\"%d\"} %g\n", s, m.lastStep.Seconds())
	family("pipetrain_train_seconds_total", "counter", "Wall time of the training steps this stage has finished, summed; over pipetrain_steps_total, the mean step time.")
	p("pipetrain_train_seconds_total{stage=\"%d\"} %g\n", s, m.stepTime.Seconds())
	family("pipetrain_busy_seconds_total", "counter", "Time within finished steps spent computing forward and backward passes (F, B, I, W), less sends blocked on a full queue.")
	p("pipetrain_busy_seconds_total{stage=\"%d\"} %g\n", s, m.busy.Seconds())
	family("pipetrain_idle_seconds_total", "counter", "Time within finished steps spent neither computing nor in the optimizer: waiting for neighbours, replicas or room to send. idle / (idle + busy) is the stage's bubble.")
	p("pipetrain_idle_seconds_total{stage=\"%d\"} %g\n", s, m.idle.Seconds())
	family("pipetrain_samples_total", "counter", "Training examples (sequences, for text) in the steps this stage has finished: its replica's share of each batch.")
	p("pipetrain_samples_total{stage=\"%d\"} %d\n", s, m.samples)
	family("pipetrain_action_seconds", "summary", "Time spent computing actions, by kind (F, B, I, W, OPT, AR).")
	kinds := make([]string, 0, len(m.actionSum))
	for k := range m.actionSum {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		p("pipetrain_action_seconds_sum{stage=\"%d\",kind=%q} %g\n", s, k, m.actionSum[k].Seconds())
		p("pipetrain_action_seconds_count{stage=\"%d\",kind=%q} %d\n", s, k, m.actionCount[k])
	}
	family("pipetrain_sent_bytes_total", "counter", "Tensor payload bytes sent, by link: prev and next (the neighbouring stages), replicas (the all-reduce ring), servers (gradients pushed to parameter servers).")
	for _, l := range linkOrder {
		if v, ok := m.sent[l]; ok {
			p("pipetrain_sent_bytes_total{stage=\"%d\",link=%q} %d\n", s, l, v)
		}
	}
	family("pipetrain_received_bytes_total", "counter", "Tensor payload bytes received from the neighbouring stages, by link (prev, next), and weights pulled from parameter servers (servers).")
	for _, l := range linkOrder {
		if v, ok := m.recv[l]; ok && l != "replicas" {
			p("pipetrain_received_bytes_total{stage=\"%d\",link=%q} %d\n", s, l, v)
		}
	}
	family("pipetrain_stashed_microbatches", "gauge", "Micro-batches whose activations the stage holds.")
	p("pipetrain_stashed_microbatches{stage=\"%d\"} %d\n", s, m.stashed)
	if m.serverSteps > 0 {
		family("pipetrain_ps_push_seconds_total", "counter", "Time this worker stage spent pushing its gradients to the parameter servers, until every server answered.")
		p("pipetrain_ps_push_seconds_total{stage=\"%d\"} %g\n", s, m.pushed.Seconds())
		family("pipetrain_ps_pull_seconds_total", "counter", "Time this worker stage spent pulling the weights of its next step: the wait for the other workers' pushes and the update, and the transfer.")
		p("pipetrain_ps_pull_seconds_total{stage=\"%d\"} %g\n", s, m.pulled.Seconds())
		family("pipetrain_ps_staleness", "gauge", "Updates the servers made between the weights this worker stage computed its last step with and its push's own update (0 in sync mode).")
		p("pipetrain_ps_staleness{stage=\"%d\"} %d\n", s, m.lastStaleness)
	}
	family("pipetrain_queue_depth", "gauge", "Tensors waiting in a link's queue.")
	for _, name := range []string{"prev", "next"} {
		if q, ok := m.links[name].(transport.QueueReporter); ok {
			send, recv := q.Queues()
			p("pipetrain_queue_depth{stage=\"%d\",link=%q,queue=\"send\"} %d\n", s, name, send)
			p("pipetrain_queue_depth{stage=\"%d\",link=%q,queue=\"recv\"} %d\n", s, name, recv)
		}
	}
	return e.n, e.err
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
func ServeMetrics(addr string, m http.Handler) (stop func(), bound string, err error) {
	return ServeMetricsAuth(addr, m, MetricsAuth{})
}

// ServeMetricsAuth serves m (a stage's Metrics or a server's PSMetrics) on
// addr at /metrics until the returned stop is called, and returns the
// address it bound (addr may name port 0). A request without what auth
// requires is refused. Without authentication it refuses to
// listen beyond loopback: anyone on the network could read the run's metrics.
func ServeMetricsAuth(addr string, m http.Handler, auth MetricsAuth) (stop func(), bound string, err error) {
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
	h := m
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

// expositionWriter writes Prometheus's text exposition format, counting the bytes
// and keeping the first error, as an io.WriterTo reports them.
type expositionWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (e *expositionWriter) printf(format string, args ...any) {
	k, err := fmt.Fprintf(e.w, format, args...)
	e.n += int64(k)
	if e.err == nil {
		e.err = err
	}
}

// family announces a metric family: its help text and type.
func (e *expositionWriter) family(name, typ, help string) {
	e.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}
