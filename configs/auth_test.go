package configs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// authConfig is the good config with a transport section and stage addresses
// given by the test, written as run.yaml in dir (which may hold other files).
func authConfig(t *testing.T, dir, transport, addr0, addr1 string) string {
	t.Helper()
	text := strings.NewReplacer("127.0.0.1:7001", `"`+addr0+`"`, "127.0.0.1:7002", `"`+addr1+`"`).Replace(good)
	if transport != "" {
		text += "transport:\n" + transport
	}
	p := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeFiles(t *testing.T, dir string, contents map[string]string) {
	t.Helper()
	for name, text := range contents {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// wantProblems loads path and checks that every want is one of the problems
// reported, exactly.
func wantProblems(t *testing.T, path string, want ...string) {
	t.Helper()
	_, err := Load(path)
	var p *Problems
	if !errors.As(err, &p) {
		t.Fatalf("got %v, want problems %q", err, want)
	}
	for _, w := range want {
		found := false
		for _, item := range p.Items {
			found = found || item == w
		}
		if !found {
			t.Errorf("problem %q not reported; got %q", w, p.Items)
		}
	}
}

func TestLoopbackNeedsNoAuth(t *testing.T) {
	for _, addrs := range [][2]string{{"127.0.0.1:7001", "127.0.0.1:7002"}, {"localhost:7001", "[::1]:7002"}, {"127.0.1.1:7001", "LOCALHOST:7002"}} {
		if _, err := Load(authConfig(t, t.TempDir(), "", addrs[0], addrs[1])); err != nil {
			t.Errorf("%v: %v", addrs, err)
		}
	}
}

func TestBeyondLoopbackNeedsAuth(t *testing.T) {
	dir := t.TempDir()
	wantProblems(t, authConfig(t, dir, "", "127.0.0.1:7001", "0.0.0.0:7002"),
		"stages[1].address: 0.0.0.0:7002 listens beyond loopback; set transport.token (or token_file) or transport.tls so strangers cannot connect")
	wantProblems(t, authConfig(t, dir, "", "gpu-node-1:7001", "10.0.0.2:7002"),
		"stages[0].address: gpu-node-1:7001 listens beyond loopback; set transport.token (or token_file) or transport.tls so strangers cannot connect",
		"stages[1].address: 10.0.0.2:7002 listens beyond loopback; set transport.token (or token_file) or transport.tls so strangers cannot connect")

	c, err := Load(authConfig(t, dir, "  token: s3cret\n", "0.0.0.0:7001", "10.0.0.2:7002"))
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := c.AuthToken(); err != nil || tok != "s3cret" {
		t.Errorf("AuthToken = %q, %v", tok, err)
	}

	// A token from the environment counts too, and stays out of the digest.
	p := authConfig(t, dir, "", "0.0.0.0:7001", "10.0.0.2:7002")
	t.Setenv("PIPETRAIN_TRANSPORT_TOKEN", "from-env")
	c, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport.Token != "from-env" {
		t.Errorf("token %q", c.Transport.Token)
	}
	noToken := *c
	noToken.Transport.Token = ""
	if c.Digest() != noToken.Digest() {
		t.Error("the token changes the config digest")
	}
}

// TestMetricsBeyondLoopbackNeedsAuth: a metrics address follows the rule of
// stage addresses.
func TestMetricsBeyondLoopbackNeedsAuth(t *testing.T) {
	dir := t.TempDir()
	withMetrics := func(transport, metrics string) string {
		p := authConfig(t, dir, transport, "127.0.0.1:7001", "127.0.0.1:7002")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Replace(string(b), `"127.0.0.1:7002"}`, `"127.0.0.1:7002", metrics_address: "`+metrics+`"}`, 1)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wantProblems(t, withMetrics("", "0.0.0.0:9101"),
		"stages[1].metrics_address: 0.0.0.0:9101 listens beyond loopback; set transport.token (or token_file) or transport.tls, which the metrics server then requires, so strangers cannot read it")
	for _, tc := range []struct{ transport, metrics string }{{"", "127.0.0.1:9101"}, {"", "localhost:9101"}, {"  token: s3cret\n", "0.0.0.0:9101"}} {
		if _, err := Load(withMetrics(tc.transport, tc.metrics)); err != nil {
			t.Errorf("%q with %q: %v", tc.metrics, tc.transport, err)
		}
	}
}

func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	wantProblems(t, authConfig(t, dir, "  token: a\n  token_file: secret\n", "127.0.0.1:7001", "127.0.0.1:7002"),
		"transport.token_file: set either transport.token or transport.token_file, not both")

	missing := filepath.Join(dir, "secrets", "token")
	wantProblems(t, authConfig(t, dir, "  token_file: secrets/token\n", "0.0.0.0:7001", "127.0.0.1:7002"),
		"transport.token_file: "+missing+": no such file or directory")

	writeFiles(t, dir, map[string]string{"secrets/token": " \n\n"})
	wantProblems(t, authConfig(t, dir, "  token_file: secrets/token\n", "127.0.0.1:7001", "127.0.0.1:7002"),
		"transport.token_file: "+missing+" is empty; write the shared secret on its first line")

	writeFiles(t, dir, map[string]string{"secrets/token": "\n  s3cret  \nsecond line\n"})
	c, err := Load(authConfig(t, dir, "  token_file: secrets/token\n", "0.0.0.0:7001", "127.0.0.1:7002"))
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := c.AuthToken(); err != nil || tok != "s3cret" {
		t.Errorf("AuthToken = %q, %v; want the trimmed first line", tok, err)
	}
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	const tlsAll = "  tls: {ca: pki/ca.pem, cert: \"pki/stage-{stage}.pem\", key: \"pki/stage-{stage}-key.pem\"}\n"

	wantProblems(t, authConfig(t, dir, "  tls: {ca: pki/ca.pem}\n", "127.0.0.1:7001", "127.0.0.1:7002"),
		"transport.tls.cert: missing; transport.tls needs ca, cert and key together",
		"transport.tls.key: missing; transport.tls needs ca, cert and key together")

	writeFiles(t, dir, map[string]string{"pki/ca.pem": "ca", "pki/stage-0.pem": "c0", "pki/stage-0-key.pem": "k0", "pki/stage-1.pem": "c1"})
	p := authConfig(t, dir, tlsAll, "0.0.0.0:7001", "10.0.0.2:7002")
	wantProblems(t, p, "transport.tls.key: "+filepath.Join(dir, "pki/stage-1-key.pem")+" (stage 1): no such file or directory")

	writeFiles(t, dir, map[string]string{"pki/stage-1-key.pem": "k1"})
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	ca, cert, key := c.TLSFiles(1)
	if want := filepath.Join(dir, "pki"); ca != want+"/ca.pem" || cert != want+"/stage-1.pem" || key != want+"/stage-1-key.pem" {
		t.Errorf("TLSFiles(1) = %s, %s, %s", ca, cert, key)
	}

	// Absolute paths stay as they are, and a directory is not a file.
	abs := "  tls: {ca: " + dir + "/pki/ca.pem, cert: " + dir + "/pki, key: \"" + dir + "/pki/stage-{stage}-key.pem\"}\n"
	wantProblems(t, authConfig(t, t.TempDir(), abs, "127.0.0.1:7001", "127.0.0.1:7002"),
		"transport.tls.cert: "+dir+"/pki: not a regular file")
}

func TestLoadUnchecked(t *testing.T) {
	p := authConfig(t, t.TempDir(), "  tls: {ca: pki/ca.pem, cert: \"pki/stage-{stage}.pem\", key: \"pki/stage-{stage}-key.pem\"}\n", "0.0.0.0:7001", "10.0.0.2:7002")
	pki := filepath.Join(filepath.Dir(p), "pki")
	wantProblems(t, p, "transport.tls.ca: "+pki+"/ca.pem: no such file or directory",
		"transport.tls.key: "+pki+"/stage-1-key.pem (stage 1): no such file or directory")
	c, err := LoadUnchecked(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path != p || len(c.Stages) != 2 || c.Stages[1].Address != "10.0.0.2:7002" || c.Transport.Heartbeat.Seconds() != 10 {
		t.Errorf("LoadUnchecked read %+v", c)
	}
	if _, err := LoadUnchecked(filepath.Join(t.TempDir(), "none.yaml")); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("missing file: %v", err)
	}
}
