package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", certPEM)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStageCertificate(t *testing.T) {
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := StageHosts("10.1.2.3:7102")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.2.3", JobName, "127.0.0.1", "::1", "localhost"}; !slices.Equal(hosts, want) {
		t.Errorf("hosts %v, want %v", hosts, want)
	}
	p, err := ca.Issue("pipetrain stage 2", hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(p.Cert, p.Key); err != nil {
		t.Fatalf("key does not match certificate: %v", err)
	}
	cert := parse(t, p.Cert)
	roots := x509.NewCertPool()
	roots.AddCert(parse(t, caPEM.Cert))
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		for _, host := range hosts {
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("verify for %s as %v: %v", host, usage, err)
			}
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.9.9.9"}); err == nil {
		t.Error("certificate verifies for a host it does not name")
	}
	if cert.IsCA || !slices.ContainsFunc(cert.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.ParseIP("::1")) }) || !slices.Contains(cert.DNSNames, "localhost") {
		t.Errorf("IsCA %t, IPs %v, DNS %v", cert.IsCA, cert.IPAddresses, cert.DNSNames)
	}

	other, err := NewCA("other CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherPool := x509.NewCertPool()
	otherPool.AddCert(other.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: otherPool, DNSName: "127.0.0.1"}); err == nil {
		t.Error("certificate verifies against another CA")
	}
}

func TestStageHostsByName(t *testing.T) {
	hosts, err := StageHosts("gpu-node-3:7102")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gpu-node-3", JobName, "127.0.0.1", "::1", "localhost"}; !slices.Equal(hosts, want) {
		t.Errorf("hosts %v, want %v", hosts, want)
	}
	if hosts, _ := StageHosts("[::1]:7102"); !slices.Equal(hosts, []string{"::1", JobName, "127.0.0.1", "localhost"}) {
		t.Errorf("loopback host repeated: %v", hosts)
	}
	// Every replica's host, once; an auto address names none.
	hosts, err = StageHosts("node-1:7102", "node-2:7102", "node-1:7112", "auto", "auto:7100")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"node-1", "node-2", JobName, "127.0.0.1", "::1", "localhost"}; !slices.Equal(hosts, want) {
		t.Errorf("replicas' hosts %v, want %v", hosts, want)
	}
	for _, bad := range []string{"7102", ":7102"} {
		if _, err := StageHosts(bad); err == nil {
			t.Errorf("StageHosts(%q) accepted", bad)
		}
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir() + "/certs"
	files, err := Write(dir, [][]string{{"127.0.0.1:7101"}, {"127.0.0.1:7102"}}, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := dir + "/stage-1-key.pem"; files.StageKey[1] != want {
		t.Errorf("stage 1 key at %s, want %s", files.StageKey[1], want)
	}
	for _, p := range append([]string{files.CAKey}, files.StageKey...) {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, err %v; want 0600", p, st.Mode(), err)
		}
	}
	caPEM, _ := os.ReadFile(files.CA)
	roots := x509.NewCertPool()
	roots.AddCert(parse(t, caPEM))
	for i := range 2 {
		certPEM, _ := os.ReadFile(files.Stage[i])
		if _, err := parse(t, certPEM).Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("stage %d: %v", i, err)
		}
	}

	_, err = Write(dir, [][]string{{"127.0.0.1:7101"}}, time.Hour, false)
	if !errors.Is(err, ErrExists) || !strings.HasPrefix(err.Error(), dir+"/ca.pem: exists") {
		t.Errorf("second Write without overwrite: %v", err)
	}
	os.Chmod(files.StageKey[0], 0o644)
	if _, err := Write(dir, [][]string{{"127.0.0.1:7101"}}, time.Hour, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(files.StageKey[0]); st.Mode().Perm() != 0o600 {
		t.Errorf("overwritten key has mode %v", st.Mode())
	}
}
