package stages

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/certs"
	"github.com/pipetrain/pipetrain/internal/testenv"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// scrape reads url with client, adding the bearer token if not "", and returns
// the status and body.
func scrape(t *testing.T, client *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func servedMetrics(t *testing.T, addr string, auth MetricsAuth) string {
	t.Helper()
	m := newMetrics(3)
	m.step(time.Second, 32)
	stop, bound, err := ServeMetricsAuth(addr, m, auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return auth.Scheme() + "://" + bound + "/metrics"
}

const stepsLine = `pipetrain_steps_total{stage="3"} 1`

// TestMetricsRequireToken scrapes the metrics as Prometheus does with
// authorization: {credentials: TOKEN}: only the run's token is let in.
func TestMetricsRequireToken(t *testing.T) {
	url := servedMetrics(t, "127.0.0.1:0", MetricsAuth{Token: "s3cret"})
	for _, token := range []string{"", "wrong", "s3cre", "s3cret2"} {
		code, body := scrape(t, http.DefaultClient, url, token)
		if code != http.StatusUnauthorized || strings.Contains(body, stepsLine) {
			t.Errorf("token %q: status %d, body %q; want 401 and no metrics", token, code, body)
		}
	}
	// The token alone, without the Bearer scheme, is not let in either.
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "s3cret")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("Authorization without Bearer: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, body := scrape(t, http.DefaultClient, url, "s3cret"); code != http.StatusOK || !strings.Contains(body, stepsLine) {
		t.Errorf("with the token: status %d, body %q", code, body)
	}
}

// TestMetricsRequireClientCertificate scrapes over TLS as Prometheus does with
// tls_config {ca_file, cert_file, key_file}: only a client certificate signed
// by the run's CA is let in.
func TestMetricsRequireClientCertificate(t *testing.T) {
	ca, err := certs.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string) certs.Pair {
		p, err := ca.Issue(name, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	stage, scraper := issue("stage 0"), issue("prometheus")
	id, err := transport.NewTLS(caPEM.Cert, stage.Cert, stage.Key)
	if err != nil {
		t.Fatal(err)
	}
	url := servedMetrics(t, "127.0.0.1:0", MetricsAuth{TLS: id})
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("url %s", url)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM.Cert)
	client := func(pair *certs.Pair) *http.Client {
		cfg := &tls.Config{RootCAs: roots}
		if pair != nil {
			cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	if code, body := scrape(t, client(&scraper), url, ""); code != http.StatusOK || !strings.Contains(body, stepsLine) {
		t.Errorf("with a client certificate: status %d, body %q", code, body)
	}
	if resp, err := client(nil).Get(url); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), stepsLine) {
			t.Errorf("without a client certificate: status %d, metrics served", resp.StatusCode)
		}
	}
	if code, body := scrape(t, http.DefaultClient, "http"+strings.TrimPrefix(url, "https"), ""); strings.Contains(body, stepsLine) {
		t.Errorf("plain HTTP: status %d, metrics served", code)
	}
}

// TestMetricsBeyondLoopbackNeedAuth: like a stage's port, the metrics port
// opens beyond loopback only with authentication.
func TestMetricsBeyondLoopbackNeedAuth(t *testing.T) {
	m := newMetrics(0)
	if stop, _, err := ServeMetrics("0.0.0.0:0", m); err == nil || !strings.Contains(err.Error(), "refusing to serve metrics on 0.0.0.0:0 without authentication") {
		if stop != nil {
			stop()
		}
		t.Errorf("unauthenticated on every interface: %v", err)
	}
	stop, _, err := ServeMetricsAuth("0.0.0.0:0", m, MetricsAuth{Token: "s3cret"})
	if err != nil {
		t.Fatalf("with a token: %v", err)
	}
	stop()
}

// TestMetricsAuthFor takes the links' secrets from the config.
func TestMetricsAuthFor(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &configs.Config{Path: filepath.Join(dir, "run.yaml"), Transport: configs.Transport{TokenFile: "token"}}
	auth, err := MetricsAuthFor(c, 0)
	if err != nil || auth.Token != "from-file" || auth.TLS != nil || auth.Scheme() != "http" {
		t.Errorf("MetricsAuthFor = %+v, %v", auth, err)
	}
	c.Transport.TokenFile = "absent"
	if _, err := MetricsAuthFor(c, 0); err == nil || !strings.Contains(err.Error(), "transport.token_file") {
		t.Errorf("missing token file: %v", err)
	}
}

// exposition parses text, Prometheus's text format, into its samples' values by
// series ("name{labels}"), failing on a sample of no family declared before
// it with HELP and TYPE, or of a type whose names it may not take.
func exposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	types, helped := map[string]string{}, map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(f, " ")
			helped[name] = help != ""
			continue
		}
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			types[name] = typ
			continue
		}
		series, value, ok := strings.Cut(line, " ")
		v, err := strconv.ParseFloat(value, 64)
		if !ok || err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		name, _, _ := strings.Cut(series, "{")
		family, typ := name, types[name]
		if typ == "" {
			for _, suffix := range []string{"_sum", "_count"} {
				if f, ok := strings.CutSuffix(name, suffix); ok && types[f] == "summary" {
					family, typ = f, "summary"
				}
			}
		}
		switch {
		case typ == "" || !helped[family]:
			t.Errorf("%s: no HELP and TYPE before it", line)
		case typ == "counter" && !strings.HasSuffix(name, "_total"):
			t.Errorf("%s: a counter's name must end in _total", line)
		case typ != "counter" && strings.HasSuffix(name, "_total"):
			t.Errorf("%s: a %s named like a counter", line, typ)
		}
		if _, dup := out[series]; dup {
			t.Errorf("%s: series given twice", line)
		}
		out[series] = v
	}
	return out
}

func renderMetrics(t *testing.T, m *Metrics) string {
	t.Helper()
	var b bytes.Buffer
	n, err := m.WriteTo(&b)
	if err != nil || n != int64(b.Len()) {
		t.Fatalf("WriteTo = %d, %v; wrote %d bytes", n, err, b.Len())
	}
	return b.String()
}

func sameSeconds(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestMetricsBubble: a step's compute actions are busy time, less what their
// sends waited for room; the rest of the step but the optimizer is idle, so
// idle / (idle + busy) is the stage's bubble.
func TestMetricsBubble(t *testing.T) {
	ms := time.Millisecond
	m := newMetrics(2)
	m.action(runlog.Forward, 30*ms, 0, 1)
	m.action(runlog.Backward, 50*ms, 20*ms, 0) // 20 ms of it blocked sending
	m.action(runlog.AllReduce, 5*ms, 0, 0)     // a wait for the replicas: idle
	m.action(runlog.Optimizer, 10*ms, 0, 0)
	m.step(100*ms, 64)
	// A step that only waited (a stage starved by its neighbour).
	m.action(runlog.Optimizer, 10*ms, 0, 0)
	m.step(50*ms, 64)
	got := exposition(t, renderMetrics(t, m))
	want := map[string]float64{
		`pipetrain_steps_total{stage="2"}`:                     2,
		`pipetrain_step_seconds{stage="2"}`:                    0.05,
		`pipetrain_train_seconds_total{stage="2"}`:             0.15,
		`pipetrain_busy_seconds_total{stage="2"}`:              0.06,
		`pipetrain_idle_seconds_total{stage="2"}`:              0.03 + 0.04,
		`pipetrain_samples_total{stage="2"}`:                   128,
		`pipetrain_action_seconds_sum{stage="2",kind="B"}`:     0.05,
		`pipetrain_action_seconds_count{stage="2",kind="OPT"}`: 2,
	}
	for series, v := range want {
		if g, ok := got[series]; !ok || !sameSeconds(g, v) {
			t.Errorf("%s = %v (present %v), want %v", series, g, ok, v)
		}
	}
	busy, idle := got[`pipetrain_busy_seconds_total{stage="2"}`], got[`pipetrain_idle_seconds_total{stage="2"}`]
	if b := idle / (idle + busy); b < 0 || b > 1 {
		t.Errorf("bubble %v", b)
	}
}

// TestMetricsBusyNeverExceedsStep: clocks read apart can make actions add up
// to more than their step; busy then fills the step and idle stays at 0.
func TestMetricsBusyNeverExceedsStep(t *testing.T) {
	m := newMetrics(0)
	m.action(runlog.Forward, 80*time.Millisecond, 0, 0)
	m.action(runlog.Weight, 40*time.Millisecond, 0, 0)
	m.step(100*time.Millisecond, 8)
	got := exposition(t, renderMetrics(t, m))
	if b, i := got[`pipetrain_busy_seconds_total{stage="0"}`], got[`pipetrain_idle_seconds_total{stage="0"}`]; !sameSeconds(b, 0.1) || i != 0 {
		t.Errorf("busy %v idle %v, want 0.1 and 0", b, i)
	}
}

// TestMetricsBytesByLink: bytes are counted per link, every link listed from
// the start; the replicas' ring counts what the stage sent on it.
func TestMetricsBytesByLink(t *testing.T) {
	m := newMetrics(1)
	for series := range exposition(t, renderMetrics(t, m)) {
		if strings.Contains(series, "_bytes_total") {
			t.Errorf("a stage without links shows %s", series)
		}
	}
	m.addLink("prev", nil)
	m.addLink("next", nil)
	m.sentOn("replicas", 0)
	m.sentOn("next", 1000)
	m.sentOn("next", 24)
	m.receivedOn("prev", 512)
	m.sentOn("replicas", 4096)
	got := exposition(t, renderMetrics(t, m))
	want := map[string]float64{
		`pipetrain_sent_bytes_total{stage="1",link="prev"}`:     0,
		`pipetrain_sent_bytes_total{stage="1",link="next"}`:     1024,
		`pipetrain_sent_bytes_total{stage="1",link="replicas"}`: 4096,
		`pipetrain_received_bytes_total{stage="1",link="prev"}`: 512,
		`pipetrain_received_bytes_total{stage="1",link="next"}`: 0,
	}
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", series, g, ok, v)
		}
	}
	if _, ok := got[`pipetrain_received_bytes_total{stage="1",link="replicas"}`]; ok {
		t.Error("received bytes on the replicas' ring, which are not counted, are shown")
	}
}

// TestMetricsPassPromtool lints a busy stage's metrics as Prometheus's own
// linter does (skipped where it is not installed; the e2e test lints a live
// run's too).
func TestMetricsPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.RequireOrSkip(t, "promtool (Debian package prometheus, which .ci/run installs)", err.Error())
	}
	m := newMetrics(0)
	m.addLink("next", nil)
	m.action(runlog.Forward, time.Millisecond, 0, 1)
	m.sentOn("next", 100)
	m.step(2*time.Millisecond, 4)
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(renderMetrics(t, m))
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
