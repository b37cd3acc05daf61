package stages

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/ps"
	"github.com/pipetrain/pipetrain/runlog"
)

// A parameter server is seen as a stage is: an event log in the run
// directory (runlog.PSEventsFile: each update with its pushes' workers,
// bytes and staleness, each drop, pull and departure) and, with
// parameter_servers.metrics_addresses, Prometheus metrics (PSMetrics).

// psEventLog writes a server's events, one JSON line each. Its methods run
// under the server's lock, so they are never concurrent; each update is
// flushed, so a killed server loses at most the pulls since the last.
type psEventLog struct {
	server int
	f      *os.File
	w      *bufio.Writer
	e      *json.Encoder
	err    error // the first failed write: the log stops there
}

// openPSEventLog creates server i's event log in runDir, or appends to it
// when a resumed run continues it.
func openPSEventLog(runDir string, i int, resume bool) (*psEventLog, error) {
	path := runlog.PSEventsFile(runDir, i)
	if err := runlog.MkdirAll(filepath.Dir(path)); err != nil {
		return nil, err
	}
	f, err := openLog(path, resume)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	return &psEventLog{server: i, f: f, w: w, e: json.NewEncoder(w)}, nil
}

func (l *psEventLog) add(e runlog.PSEvent, flush bool) {
	if l.err != nil {
		return
	}
	e.Server = l.server
	if l.err = l.e.Encode(e); l.err == nil && flush {
		l.err = l.w.Flush()
	}
}

// event logs an update, a drop, a departure or a rejoin.
func (l *psEventLog) event(e ps.Event) {
	switch {
	case e.Departed:
		now := time.Now().UnixNano()
		l.add(runlog.PSEvent{Stage: e.Stage, Kind: runlog.PSDepart, Step: e.Step, Worker: e.Dropped, StartNS: now, EndNS: now}, true)
	case e.Rejoined:
		now := time.Now().UnixNano()
		l.add(runlog.PSEvent{Stage: e.Stage, Kind: runlog.PSRejoin, Step: e.Step, Worker: e.Dropped, StartNS: now, EndNS: now}, true)
	case e.Update == nil:
		now := time.Now().UnixNano()
		l.add(runlog.PSEvent{Stage: e.Stage, Kind: runlog.PSDrop, Step: e.Step, Worker: e.Dropped, StartNS: now, EndNS: now, BytesIn: e.Bytes}, false)
	default:
		l.add(runlog.PSEvent{Stage: e.Stage, Kind: runlog.PSUpdate, Step: e.Step, Workers: e.Update.Workers, Staleness: e.Update.Staleness,
			StartNS: e.Start.UnixNano(), EndNS: e.End.UnixNano(), BytesIn: e.Bytes}, true)
	}
}

// pull logs a pull answered.
func (l *psEventLog) pull(p ps.Pull) {
	l.add(runlog.PSEvent{Stage: p.Stage, Kind: runlog.PSPull, Step: p.Step, Worker: p.Worker,
		StartNS: p.Asked.UnixNano(), EndNS: p.Ready.UnixNano(), WaitNS: p.Waited.Nanoseconds(), BytesOut: p.Bytes}, false)
}

// close flushes the log and reports the first failed write, naming the file.
func (l *psEventLog) close() error {
	if l.err == nil {
		l.err = l.w.Flush()
	}
	if err := l.f.Close(); l.err == nil {
		l.err = err
	}
	if l.err != nil {
		return fmt.Errorf("%s: %w", l.f.Name(), l.err)
	}
	return nil
}

// StalenessBuckets are the upper bounds of the servers' staleness
// histogram (pipetrain_ps_push_staleness), in updates.
var StalenessBuckets = []int64{0, 1, 2, 4, 8, 16}

// PSMetrics is what a parameter server exposes to Prometheus, per stage
// whose tensors it holds: updates and their time, pushes applied and
// dropped and pulls per worker, bytes each way, the pulls' wait, workers
// departed, and a histogram of the applied pushes' staleness.
type PSMetrics struct {
	mu     sync.Mutex
	server int
	stages map[int]*psStageMetrics
}

type psStageMetrics struct {
	updates, departed            int64
	busy, pullWait               time.Duration
	applied, dropped, pulls      []int64 // by worker
	received, sent               int64
	staleness                    map[int64]int64 // applied pushes by staleness
	stalenessSum, stalenessCount int64
}

// NewPSMetrics makes server's metrics with every series of stages and
// workers at zero, so a dashboard sees them from the first scrape.
func NewPSMetrics(server int, stages []int, workers int) *PSMetrics {
	m := &PSMetrics{server: server, stages: map[int]*psStageMetrics{}}
	for _, s := range stages {
		m.stages[s] = &psStageMetrics{applied: make([]int64, workers), dropped: make([]int64, workers), pulls: make([]int64, workers), staleness: map[int64]int64{}}
	}
	return m
}

func (m *PSMetrics) stage(s int) *psStageMetrics {
	st, ok := m.stages[s]
	if !ok {
		// A stage the server was not told of: count it all the same.
		st = &psStageMetrics{staleness: map[int64]int64{}}
		m.stages[s] = st
	}
	return st
}

// grow makes xs long enough to index w.
func grow(xs []int64, w int) []int64 {
	for len(xs) <= w {
		xs = append(xs, 0)
	}
	return xs
}

// event counts an update, a drop or a departure; a rejoin counts nothing.
func (m *PSMetrics) event(e ps.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stage(e.Stage)
	switch {
	case e.Rejoined:
	case e.Departed:
		st.departed++
	case e.Update == nil:
		st.dropped = grow(st.dropped, e.Dropped)
		st.dropped[e.Dropped]++
		st.received += e.Bytes
	default:
		st.updates++
		st.busy += e.End.Sub(e.Start)
		st.received += e.Bytes
		for k, w := range e.Update.Workers {
			st.applied = grow(st.applied, w)
			st.applied[w]++
			stale := e.Update.Staleness[k]
			st.staleness[stale]++
			st.stalenessSum += stale
			st.stalenessCount++
		}
	}
}

// pull counts a pull answered.
func (m *PSMetrics) pull(p ps.Pull) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.stage(p.Stage)
	st.pulls = grow(st.pulls, p.Worker)
	st.pulls[p.Worker]++
	st.pullWait += p.Waited
	st.sent += p.Bytes
}

// ServeHTTP writes the metrics in Prometheus's text exposition format.
func (m *PSMetrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	m.WriteTo(w)
}

// WriteTo renders the metrics in Prometheus's text exposition format.
func (m *PSMetrics) WriteTo(w io.Writer) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := &expositionWriter{w: w}
	p, family := e.printf, e.family
	stages := slices.Sorted(maps.Keys(m.stages))
	each := func(name, typ, help string, value func(*psStageMetrics) string) {
		family(name, typ, help)
		for _, s := range stages {
			p("%s{server=\"%d\",stage=\"%d\"} %s\n", name, m.server, s, value(m.stages[s]))
		}
	}
	perWorker := func(name, help string, counts func(*psStageMetrics) []int64) {
		family(name, "counter", help)
		for _, s := range stages {
			for wk, c := range counts(m.stages[s]) {
				p("%s{server=\"%d\",stage=\"%d\",worker=\"%d\"} %d\n", name, m.server, s, wk, c)
			}
		}
	}
	each("pipetrain_ps_updates_total", "counter", "Optimizer updates the server made of the stage's tensors it holds.",
		func(st *psStageMetrics) string { return fmt.Sprint(st.updates) })
	each("pipetrain_ps_update_seconds_total", "counter", "Time the server spent making updates: summing the pushes and stepping the optimizer (its busy time).",
		func(st *psStageMetrics) string { return fmt.Sprint(st.busy.Seconds()) })
	perWorker("pipetrain_ps_pushes_total", "Pushes of gradients applied, by worker.", func(st *psStageMetrics) []int64 { return st.applied })
	perWorker("pipetrain_ps_dropped_pushes_total", "Pushes that came after their step's update and were dropped (backup workers), by worker.", func(st *psStageMetrics) []int64 { return st.dropped })
	perWorker("pipetrain_ps_pulls_total", "Pulls of the weights answered, by worker.", func(st *psStageMetrics) []int64 { return st.pulls })
	each("pipetrain_ps_pull_wait_seconds_total", "counter", "Time the pulls waited for the updates their workers need, summed over workers.",
		func(st *psStageMetrics) string { return fmt.Sprint(st.pullWait.Seconds()) })
	each("pipetrain_ps_received_bytes_total", "counter", "Gradient bytes pushed to the server, as they travel (dropped pushes included).",
		func(st *psStageMetrics) string { return fmt.Sprint(st.received) })
	each("pipetrain_ps_sent_bytes_total", "counter", "Weight bytes the server's pulls sent, as they travel.",
		func(st *psStageMetrics) string { return fmt.Sprint(st.sent) })
	each("pipetrain_ps_departed_workers_total", "counter", "Worker stages whose stream ended without a goodbye (killed, or their connection lost).",
		func(st *psStageMetrics) string { return fmt.Sprint(st.departed) })
	family("pipetrain_ps_push_staleness", "histogram", "Applied pushes by staleness: how many updates were made between the weights a push was computed from and its own update.")
	for _, s := range stages {
		st := m.stages[s]
		for _, le := range StalenessBuckets {
			var below int64
			for v, c := range st.staleness {
				if v <= le {
					below += c
				}
			}
			p("pipetrain_ps_push_staleness_bucket{server=\"%d\",stage=\"%d\",le=\"%d\"} %d\n", m.server, s, le, below)
		}
		p("pipetrain_ps_push_staleness_bucket{server=\"%d\",stage=\"%d\",le=\"+Inf\"} %d\n", m.server, s, st.stalenessCount)
		p("pipetrain_ps_push_staleness_sum{server=\"%d\",stage=\"%d\"} %d\n", m.server, s, st.stalenessSum)
		p("pipetrain_ps_push_staleness_count{server=\"%d\",stage=\"%d\"} %d\n", m.server, s, st.stalenessCount)
	}
	return e.n, e.err
}

// recordServer has srv's updates, drops, departures and pulls logged in
// l and counted in m (either may be nil), after whatever srv.Observe did
// already.
func recordServer(srv *ps.Server, l *psEventLog, m *PSMetrics) {
	before := srv.Observe
	srv.Observe = func(e ps.Event) {
		if before != nil {
			before(e)
		}
		if l != nil {
			l.event(e)
		}
		if m != nil {
			m.event(e)
		}
	}
	srv.ObservePull = func(p ps.Pull) {
		if l != nil {
			l.pull(p)
		}
		if m != nil {
			m.pull(p)
		}
	}
}

// servePSMetrics serves server i's metrics at its
// parameter_servers.metrics_addresses entry, if any, guarded as a stage's
// are; stop is a no-op without one.
func servePSMetrics(c *configs.Config, i int, m *PSMetrics, log io.Writer) (stop func(), err error) {
	addr := c.PSMetricsAddress(i)
	if addr == "" {
		return func() {}, nil
	}
	auth, err := MetricsAuthFor(c, 0)
	if err != nil {
		return nil, err
	}
	stop, _, err = ServeMetricsAuth(addr, m, auth)
	if err != nil {
		return nil, fmt.Errorf("parameter_servers.metrics_addresses[%d]: %w", i, err)
	}
	fmt.Fprintf(log, "%s: Prometheus metrics on %s://%s/metrics\n", configs.PSName(i), auth.Scheme(), addr)
	return stop, nil
}
