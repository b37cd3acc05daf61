// Package certs makes a small certificate authority and one certificate per
// pipeline stage, for the mutual TLS between stages (transport.tls). Every
// stage both listens and dials, so each certificate is good for both server
// and client authentication, and names the stage's host plus the loopback
// names, so that stages on one machine can dial each other by any of them.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// backdate covers clocks that differ a little between the machines of a run.
const backdate = time.Hour

// CA signs stage certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Pair is a PEM certificate and its PEM (PKCS #8) private key.
type Pair struct {
	Cert, Key []byte
}

// NewCA makes a self-signed ECDSA P-256 CA valid for validFor from now.
func NewCA(name string, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template(name, validFor)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true // it signs stage certificates only
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// PEM encodes the CA's certificate and key.
func (ca *CA) PEM() (Pair, error) {
	return encode(ca.Cert.Raw, ca.Key)
}

// Issue makes a certificate for name, valid for both server and client
// authentication, for the given hosts (IP addresses or DNS names).
func (ca *CA) Issue(name string, hosts []string, validFor time.Duration) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl, err := template(name, validFor)
	if err != nil {
		return Pair{}, err
	}
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, err
	}
	return encode(der, key)
}

func template(name string, validFor time.Duration) (*x509.Certificate, error) {
	if validFor <= 0 {
		return nil, fmt.Errorf("validity %v is not positive", validFor)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(validFor),
	}, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (Pair, error) {
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}),
	}, nil
}

// loopback names are in every stage certificate: stages on one machine dial
// each other by any of them.
var loopback = []string{"127.0.0.1", "::1", "localhost"}

// JobName is in every stage certificate too. A job whose addresses are
// given at run time (address: auto) cannot name its hosts in a certificate
// made beforehand, so its dialers check the listener's certificate for
// this name instead of the dialed host (transport.TLS.ServerName): any
// certificate the job's CA signed then passes, as any stage's would.
const JobName = "pipetrain-job"

// StageHosts lists the names a stage's certificate must carry: the hosts of
// its host:port addresses (one per replica), then JobName and the loopback
// names, without repeats. An auto address names no host.
func StageHosts(addresses ...string) ([]string, error) {
	var hosts []string
	add := func(h string) {
		if !slices.ContainsFunc(hosts, func(o string) bool { return sameHost(o, h) }) {
			hosts = append(hosts, h)
		}
	}
	for _, address := range addresses {
		if address == "auto" || strings.HasPrefix(address, "auto:") {
			continue
		}
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return nil, fmt.Errorf("%q is not host:port: %w", address, err)
		}
		if host == "" {
			return nil, fmt.Errorf("%q has no host to name in a certificate", address)
		}
		add(host)
	}
	add(JobName)
	for _, h := range loopback {
		add(h)
	}
	return hosts, nil
}

func sameHost(a, b string) bool {
	if ia, ib := net.ParseIP(a), net.ParseIP(b); ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return strings.EqualFold(a, b)
}

// ErrExists is wrapped by Write's error when a file it would write exists.
var ErrExists = errors.New("exists; a new CA would invalidate every certificate of the old one")

// Files names what Write writes.
type Files struct {
	CA, CAKey string
	// Stage[i] and StageKey[i] are stage i's certificate and key.
	Stage, StageKey []string
}

// FileNames are the names Write uses in dir: ca.pem, ca-key.pem,
// stage-N.pem and stage-N-key.pem.
func FileNames(dir string, stages int) Files {
	f := Files{CA: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem")}
	for i := range stages {
		f.Stage = append(f.Stage, filepath.Join(dir, fmt.Sprintf("stage-%d.pem", i)))
		f.StageKey = append(f.StageKey, filepath.Join(dir, fmt.Sprintf("stage-%d-key.pem", i)))
	}
	return f
}

// Write makes a new CA and one certificate per stage in dir (see
// FileNames), for the stage's addresses (one per replica). Keys are written
// readable by their owner only. Existing files are kept, and Write fails,
// unless overwrite is set: a new CA would make every certificate it did not
// sign useless.
func Write(dir string, addresses [][]string, validFor time.Duration, overwrite bool) (Files, error) {
	files := FileNames(dir, len(addresses))
	if !overwrite {
		if err := checkAbsent(files); err != nil {
			return files, err
		}
	}
	hosts := make([][]string, len(addresses))
	for i, a := range addresses {
		h, err := StageHosts(a...)
		if err != nil {
			return files, fmt.Errorf("stage %d: %w", i, err)
		}
		hosts[i] = h
	}
	ca, err := NewCA("pipetrain test CA", validFor)
	if err != nil {
		return files, err
	}
	caPEM, err := ca.PEM()
	if err != nil {
		return files, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, err
	}
	if err := writePair(files.CA, files.CAKey, caPEM); err != nil {
		return files, err
	}
	for i := range addresses {
		p, err := ca.Issue(fmt.Sprintf("pipetrain stage %d", i), hosts[i], validFor)
		if err != nil {
			return files, fmt.Errorf("stage %d: %w", i, err)
		}
		if err := writePair(files.Stage[i], files.StageKey[i], p); err != nil {
			return files, err
		}
	}
	return files, nil
}

func checkAbsent(f Files) error {
	all := append([]string{f.CA, f.CAKey}, f.Stage...)
	for _, p := range append(all, f.StageKey...) {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s: %w", p, ErrExists)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writePair writes the certificate world-readable and the key for its owner
// only.
func writePair(certPath, keyPath string, p Pair) error {
	if err := writeNew(certPath, p.Cert, 0o644); err != nil {
		return err
	}
	return writeNew(keyPath, p.Key, 0o600)
}

// writeNew replaces path with a new file of the given mode. Writing into an
// existing file would keep that file's mode, and so could leave a key
// readable by others.
func writeNew(path string, data []byte, mode os.FileMode) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
