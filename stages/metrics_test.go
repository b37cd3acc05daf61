package stages

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/certs"
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
	m.step(time.Second)
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
