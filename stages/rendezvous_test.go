package stages

import (
	"errors"
	"io"
	"testing"
	"time"
)

// A rendezvous host whose name does not resolve yet is retried until it
// does, or until the wait is over.
func TestLocalAddressForRetriesUntilTheHostResolves(t *testing.T) {
	tries := 0
	route := func(host string) (string, error) {
		if tries++; tries < 3 {
			return "", errors.New("no such host " + host)
		}
		return "10.0.0.7", nil
	}
	if addr, err := localAddressFor("rank-0.pipetrain", 5*time.Second, route, io.Discard); err != nil || addr != "10.0.0.7" || tries != 3 {
		t.Fatalf("got %q, %v after %d tries; want 10.0.0.7 after 3", addr, err, tries)
	}
	never := func(host string) (string, error) { return "", errors.New("no such host " + host) }
	start := time.Now()
	if _, err := localAddressFor("rank-0.pipetrain", 500*time.Millisecond, never, io.Discard); err == nil || err.Error() != "no such host rank-0.pipetrain" {
		t.Fatalf("a host that never resolves: %v", err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 2*time.Second {
		t.Fatalf("gave up after %v; the wait was 500ms", took)
	}
}
