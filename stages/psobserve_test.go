package stages

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/ps"
	"github.com/pipetrain/pipetrain/runlog"
)

// startRecordedServers starts c's servers as startServers does, each
// logging its events in dir and counting them in its metrics, as ServePS
// has them do; closeLogs flushes the logs.
func startRecordedServers(t *testing.T, c *configs.Config, dir string) (metrics []*PSMetrics, closeLogs func()) {
	t.Helper()
	var logs []*psEventLog
	startServersWith(t, c, func(i int, srv *ps.Server) {
		l, err := openPSEventLog(dir, i, false)
		if err != nil {
			t.Fatal(err)
		}
		// The stages each server holds, as PSServedStages finds them
		// once the addresses are known; every stage here.
		stages := make([]int, len(c.Stages))
		for s := range stages {
			stages[s] = s
		}
		m := NewPSMetrics(i, stages, c.Replicas())
		recordServer(srv, l, m)
		logs, metrics = append(logs, l), append(metrics, m)
	})
	return metrics, func() {
		for _, l := range logs {
			if err := l.close(); err != nil {
				t.Error(err)
			}
		}
	}
}

// psPush keys a worker stage's push of a step.
type psPush struct{ worker, stage, step int }

// TestServersSeen: the servers' event logs, the workers' events, the
// servers' Prometheus metrics and the profile agree on a real run of 3
// workers of a 2-stage pipeline and 2 servers, in sync mode and async with
// max_staleness 2: every push one update on each of its servers (one per
// step in sync, with every worker's push), each pull logged, the bytes
// the workers pushed and pulled those the servers took in and sent out,
// and each step's staleness on the worker the most of its servers'.
func TestServersSeen(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		staleness int
	}{{"sync", 0}, {"async", 2}} {
		t.Run(tc.mode, func(t *testing.T) {
			c := psConfig(3, 2, "adam")
			c.ParameterServers.Mode, c.ParameterServers.MaxStaleness = tc.mode, tc.staleness
			dir := t.TempDir()
			metrics, closeLogs := startRecordedServers(t, c, dir)
			runWorkersIn(t, c, dir, nil)
			closeLogs()

			info, events, err := profile.ReadRun(dir)
			if err != nil {
				t.Fatal(err)
			}
			if info.ParameterServers != 2 {
				t.Fatalf("run.json: parameter_servers %d, want 2", info.ParameterServers)
			}
			replicas, err := profile.ReadReplicas(dir, info)
			if err != nil {
				t.Fatal(err)
			}
			servers, err := profile.ReadServers(dir, info)
			if err != nil {
				t.Fatal(err)
			}
			checkServerLogs(t, c, replicas, servers)
			checkServerMetrics(t, c, metrics, servers)

			r, err := profile.Analyse(info, events, 1)
			if err != nil {
				t.Fatal(err)
			}
			r.AddParameterServers(replicas, servers)
			checkPSProfile(t, c, r)
		})
	}
}

// checkServerLogs compares the servers' logs with the workers'.
func checkServerLogs(t *testing.T, c *configs.Config, replicas []profile.Replica, servers [][]profile.PSEvent) {
	t.Helper()
	steps, workers := c.Train.Steps, c.Replicas()
	async := c.ParameterServers.Mode == "async"
	stale := map[psPush]int64{}                 // the most of the push's servers' staleness
	updates := map[psPush]int{}                 // servers that applied the push
	in, out := map[int]int64{}, map[int]int64{} // bytes by stage, as the servers count them
	pulls := map[[3]int]int{}                   // by server, stage and worker
	for i, events := range servers {
		for _, e := range events {
			switch e.Kind {
			case runlog.PSUpdate:
				in[e.Stage] += e.BytesIn
				if !async && len(e.Workers) != workers {
					t.Errorf("server %d stage %d: sync update of step %d sums workers %v, want all %d", i, e.Stage, e.Step+1, e.Workers, workers)
				}
				if async && len(e.Workers) != 1 {
					t.Errorf("server %d stage %d: async update of step %d sums workers %v, want one push", i, e.Stage, e.Step+1, e.Workers)
				}
				for k, w := range e.Workers {
					p := psPush{w, e.Stage, int(e.Step)}
					updates[p]++
					stale[p] = max(stale[p], e.Staleness[k])
				}
			case runlog.PSPull:
				out[e.Stage] += e.BytesOut
				pulls[[3]int{i, e.Stage, e.Worker}]++
			default:
				t.Errorf("server %d: unexpected %s event %+v", i, e.Kind, e)
			}
		}
	}
	sent, pulled := map[int]int64{}, map[int]int64{}
	for w, rep := range replicas {
		for s, events := range rep.Events {
			n := 0
			for _, e := range events {
				if e.Kind != runlog.Optimizer {
					continue
				}
				n++
				p := psPush{w, s, e.Step}
				if e.Servers < 1 || updates[p] != e.Servers {
					t.Errorf("worker %d stage %d step %d: applied by %d servers, pushed to %d", w, s, e.StepNumber(), updates[p], e.Servers)
				}
				if e.Staleness != stale[p] {
					t.Errorf("worker %d stage %d step %d: staleness %d, its servers' most %d", w, s, e.StepNumber(), e.Staleness, stale[p])
				}
				if e.PushNS <= 0 || e.BytesPulled <= 0 {
					t.Errorf("worker %d stage %d step %d: push %d ns, %d bytes pulled", w, s, e.StepNumber(), e.PushNS, e.BytesPulled)
				}
				sent[s] += e.BytesSent
				pulled[s] += e.BytesPulled
			}
			if n != steps {
				t.Errorf("worker %d stage %d logged %d pushes, want %d", w, s, n, steps)
			}
		}
	}
	for s := range c.Stages {
		if sent[s] == 0 || in[s] != sent[s] || out[s] != pulled[s] {
			t.Errorf("stage %d: workers pushed %d bytes and pulled %d; servers took in %d and sent %d", s, sent[s], pulled[s], in[s], out[s])
		}
	}
	for key, n := range pulls {
		// One pull before each step after the first, and the final one.
		if n != steps {
			t.Errorf("server %d stage %d: %d pulls of worker %d, want %d", key[0], key[1], n, key[2], steps)
		}
	}
}

// checkServerMetrics compares each server's metrics with its log.
func checkServerMetrics(t *testing.T, c *configs.Config, metrics []*PSMetrics, servers [][]profile.PSEvent) {
	t.Helper()
	for i, m := range metrics {
		n := map[int]int{}
		pushes := map[int]int{}
		for _, e := range servers[i] {
			if e.Kind == runlog.PSUpdate {
				n[e.Stage]++
				pushes[e.Stage] += len(e.Workers)
			}
		}
		var b strings.Builder
		if _, err := m.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		for s := range c.Stages {
			for _, want := range []string{
				fmt.Sprintf("pipetrain_ps_updates_total{server=\"%d\",stage=\"%d\"} %d\n", i, s, n[s]),
				fmt.Sprintf("pipetrain_ps_push_staleness_count{server=\"%d\",stage=\"%d\"} %d\n", i, s, pushes[s]),
				fmt.Sprintf("pipetrain_ps_push_staleness_bucket{server=\"%d\",stage=\"%d\",le=\"+Inf\"} %d\n", i, s, pushes[s]),
				fmt.Sprintf("pipetrain_ps_dropped_pushes_total{server=\"%d\",stage=\"%d\",worker=\"2\"} 0\n", i, s),
			} {
				if !strings.Contains(b.String(), want) {
					t.Errorf("server %d metrics lack %q:\n%s", i, want, b.String())
				}
			}
		}
	}
}

// checkPSProfile checks the profile's tables against the run.
func checkPSProfile(t *testing.T, c *configs.Config, r *profile.Report) {
	t.Helper()
	if len(r.Workers) != c.Replicas()*len(c.Stages) {
		t.Fatalf("profile: %d worker stages, want %d", len(r.Workers), c.Replicas()*len(c.Stages))
	}
	for _, w := range r.Workers {
		if w.Steps != len(r.Steps) || w.Pushed == 0 || w.Pulled == 0 || w.Push <= 0 || w.Step <= 0 {
			t.Errorf("profile: worker %d stage %d: %+v over %d analysed steps", w.Worker, w.Stage, w, len(r.Steps))
		}
	}
	updates := 0
	for _, s := range r.Servers {
		pushes := 0
		for _, n := range s.Staleness {
			pushes += n
		}
		if pushes != s.Pushes || s.Pulls == 0 || s.Busy <= 0 {
			t.Errorf("profile: server %d stage %d: %+v", s.Server, s.Stage, s)
		}
		updates += s.Updates
	}
	// One update a step for each server's stage; one a push in async mode.
	want := c.Train.Steps * len(r.Servers)
	if c.ParameterServers.Mode == "async" {
		want *= c.Replicas()
	}
	if updates != want {
		t.Errorf("profile: the servers made %d updates, want %d", updates, want)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"each worker stage's push and pull", "each server's work on each stage's tensors", "staleness (pushes)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("profile lacks %q:\n%s", want, b.String())
		}
	}
}

// TestServerMetricsServed: a server's metrics are served over HTTP with
// the links' token, and refused without it.
func TestServerMetricsServed(t *testing.T) {
	m := NewPSMetrics(1, []int{0, 1}, 3)
	m.pull(ps.Pull{Stage: 1, Worker: 2, Bytes: 40})
	stop, addr, err := ServeMetricsAuth("127.0.0.1:0", m, MetricsAuth{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("without the token: status %d", code)
	}
	code, body := get("tok")
	for _, want := range []string{
		"pipetrain_ps_pulls_total{server=\"1\",stage=\"1\",worker=\"2\"} 1\n",
		"pipetrain_ps_sent_bytes_total{server=\"1\",stage=\"1\"} 40\n",
		"pipetrain_ps_updates_total{server=\"1\",stage=\"0\"} 0\n",
		"# TYPE pipetrain_ps_push_staleness histogram\n",
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("status %d, body lacks %q:\n%s", code, want, body)
		}
	}
}

// TestServerMetricsAtItsAddress: a server serves its metrics at its
// parameter_servers.metrics_addresses entry, with the links' token, and
// says where; a server without an entry serves none.
func TestServerMetricsAtItsAddress(t *testing.T) {
	c := psConfig(2, 2, "sgd")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c.ParameterServers.MetricsAddresses = []string{addr}
	var log strings.Builder
	stop, err := servePSMetrics(c, 0, NewPSMetrics(0, []int{0}, 2), &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if want := "parameter server 0: Prometheus metrics on http://" + addr + "/metrics\n"; log.String() != want {
		t.Errorf("logged %q, want %q", log.String(), want)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+c.Transport.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "pipetrain_ps_updates_total{server=\"0\",stage=\"0\"} 0\n"; resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		t.Errorf("status %d, body lacks %q:\n%s", resp.StatusCode, want, body)
	}
	log.Reset()
	stop1, err := servePSMetrics(c, 1, NewPSMetrics(1, []int{0}, 2), &log)
	if err != nil || log.Len() > 0 {
		t.Errorf("server 1, with no metrics address: %v, logged %q", err, log.String())
	}
	stop1()
}
