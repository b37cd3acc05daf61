package configs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/transport"
)

// stagePlaceholder in transport.tls.cert and .key is replaced by the stage
// index, so one config names every stage's files.
const stagePlaceholder = "{stage}"

// validateAuth checks the token and TLS settings and that a stage listening
// beyond loopback has one of them: a port open to the network without it
// would take tensors from anyone who connects. Metrics addresses follow the
// same rule (the metrics server then requires the token or a certificate):
// they would show anyone the run's progress and timings, and take their
// connections on the stage's host.
func (c *Config) validateAuth(p *Problems) {
	t := c.Transport
	if t.Token != "" && t.TokenFile != "" {
		p.add("transport.token_file", "set either transport.token or transport.token_file, not both")
	} else if t.TokenFile != "" {
		if _, err := c.readTokenFile(); err != nil {
			p.add("transport.token_file", "%v", err)
		}
	}
	if t.TLS.Enabled() {
		c.validateTLSFiles(p)
	}
	if c.Authenticated() {
		return
	}
	for i, s := range c.Stages {
		for r := range c.stageReplicas(i) {
			if a := c.Address(i, r); beyondLoopback(a) { // the rule Listen enforces too
				p.add(c.addressField(i, r), "%s listens beyond loopback; set transport.token (or token_file) or transport.tls so strangers cannot connect", a)
			}
		}
		if beyondLoopback(s.MetricsAddress) { // the rule ServeMetrics enforces too
			p.add(fmt.Sprintf("stages[%d].metrics_address", i), "%s listens beyond loopback; set transport.token (or token_file) or transport.tls, which the metrics server then requires, so strangers cannot read it", s.MetricsAddress)
		}
	}
}

// beyondLoopback reports whether a well-formed TCP address can be reached
// from other machines; socket files and malformed addresses (which
// validateStages reports) are not.
func beyondLoopback(addr string) bool {
	if _, auto := AutoPort(addr); auto {
		return false // bound where the rendezvous is reached; Listen checks it then
	}
	if _, unix := transport.UnixPath(addr); unix {
		return false // a socket file is reachable from this host only
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && host != "" && !transport.IsLoopback(host)
}

// validateTLSFiles checks that ca, cert and key are set together and that
// every stage's files exist: a stage started later must not be the first to
// find its certificate missing.
func (c *Config) validateTLSFiles(p *Problems) {
	t := c.Transport.TLS
	fields := []struct{ name, value string }{{"ca", t.CA}, {"cert", t.Cert}, {"key", t.Key}}
	complete := true
	for _, f := range fields {
		if f.value == "" {
			p.add("transport.tls."+f.name, "missing; transport.tls needs ca, cert and key together")
			complete = false
		}
	}
	if !complete {
		return
	}
	seen := map[string]bool{}
	for i := range max(len(c.Stages), 1) {
		ca, cert, key := c.TLSFiles(i)
		for j, path := range []string{ca, cert, key} {
			if seen[path] {
				continue
			}
			seen[path] = true
			if err := checkFile(path); err != nil {
				where := ""
				if strings.Contains(fields[j].value, stagePlaceholder) {
					where = fmt.Sprintf(" (stage %d)", i)
				}
				p.add("transport.tls."+fields[j].name, "%s%s: %v", path, where, err)
			}
		}
	}
}

// checkFile reports why path is not a readable regular file.
func checkFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return pathErr.Err
		}
		return err
	}
	if !st.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return pathErr.Err
		}
		return err
	}
	return f.Close()
}

// resolve makes a path from the config relative to the config's directory.
func (c *Config) resolve(path string) string {
	if path == "" || filepath.IsAbs(path) || c.Path == "" {
		return path
	}
	return filepath.Join(filepath.Dir(c.Path), path)
}

// Authenticated reports whether the config makes its listeners (links,
// rendezvous, metrics) require a secret: a token (transport.token or
// token_file) or a client certificate (transport.tls).
func (c *Config) Authenticated() bool {
	t := c.Transport
	return t.Token != "" || t.TokenFile != "" || t.TLS.Enabled()
}

// TokenVariable hands a process its token through the environment, which
// other users cannot read, unlike a command line (/proc/PID/cmdline is
// world-readable). It beats the file's token and token_file (see Load).
var TokenVariable = EnvName("transport.token")

// NewToken is a fresh shared secret for one run: 32 bytes from crypto/rand,
// in hex, so that it travels unchanged as gRPC metadata and as an HTTP
// bearer token.
func NewToken() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails: crypto/rand crashes the program rather than return weak bytes
	return hex.EncodeToString(b)
}

// AuthToken is the shared secret of the links: transport.token, or the first
// line of transport.token_file with surrounding white space removed; "" when
// neither is set. Errors name transport.token_file and the path.
func (c *Config) AuthToken() (string, error) {
	t := c.Transport
	if t.Token != "" || t.TokenFile == "" {
		return t.Token, nil
	}
	token, err := c.readTokenFile()
	if err != nil {
		return "", fmt.Errorf("transport.token_file: %w", err)
	}
	return token, nil
}

// readTokenFile reads the token from transport.token_file; errors name the
// path.
func (c *Config) readTokenFile() (string, error) {
	path := c.resolve(c.Transport.TokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			err = pathErr.Err
		}
		return "", fmt.Errorf("%s: %v", path, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	token := strings.TrimSpace(line)
	if token == "" {
		return "", fmt.Errorf("%s is empty; write the shared secret on its first line", path)
	}
	return token, nil
}

// TLSFiles are stage's TLS files: the CA, and its certificate and key with
// "{stage}" replaced by the stage index, each relative to the config's
// directory unless absolute. They are "" when transport.tls is not set.
func (c *Config) TLSFiles(stage int) (ca, cert, key string) {
	t := c.Transport.TLS
	n := strconv.Itoa(stage)
	return c.resolve(t.CA),
		c.resolve(strings.ReplaceAll(t.Cert, stagePlaceholder, n)),
		c.resolve(strings.ReplaceAll(t.Key, stagePlaceholder, n))
}
