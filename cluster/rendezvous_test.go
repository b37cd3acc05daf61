package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/internal/certs"
	"github.com/pipetrain/pipetrain/transport"
)

const (
	rvDigest = "3fa2c1d4e5f60718293a4b5c6d7e8f90"
	rvBuild  = "go1.26.0 v1.4.0 vcs.revision=abc123"
)

// rvLeaks fails the test if goroutines started during it outlive it (the
// registry's server, its handlers, the joiners' connections).
func rvLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// rvLog is a Logf that keeps what it is given.
type rvLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *rvLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// waitFor fails unless a line containing all of want turns up soon.
func (l *rvLog) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		lines := slices.Clone(l.lines)
		l.mu.Unlock()
		for _, line := range lines {
			if rvContainsAll(line, want...) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line contains %q; got %q", want, lines)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rvContainsAll(s string, want ...string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

func rvEntry(rank int) Entry {
	return Entry{Rank: rank, Address: fmt.Sprintf("127.0.0.1:%d", 7100+rank), ConfigDigest: rvDigest, Build: rvBuild}
}

func rvTable(world int) []Entry {
	out := make([]Entry, world)
	for r := range out {
		out[r] = rvEntry(r)
	}
	return out
}

// rvFreeAddr is a loopback address nothing listens on (a moment ago).
func rvFreeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

func rvServe(t *testing.T, world int, o RendezvousOptions) *Registry {
	t.Helper()
	reg, err := ServeRendezvous("127.0.0.1:0", world, rvDigest, rvBuild, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

type rvResult struct {
	table []Entry
	err   error
}

// rvJoin joins in the background; the result arrives on the channel.
func rvJoin(addr string, e Entry, o RendezvousOptions) <-chan rvResult {
	ch := make(chan rvResult, 1)
	go func() {
		table, err := JoinRendezvous(context.Background(), addr, e, o)
		ch <- rvResult{table, err}
	}()
	return ch
}

func rvGet(t *testing.T, ch <-chan rvResult) rvResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("a joiner did not return")
		return rvResult{}
	}
}

// rvPending fails if the joiner has already returned: it must still wait.
func rvPending(t *testing.T, what string, ch <-chan rvResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned %v, %v; it should still be waiting", what, r.table, r.err)
	case <-time.After(100 * time.Millisecond):
	}
}

func rvWantTable(t *testing.T, what string, r rvResult, world int) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	if !slices.Equal(r.table, rvTable(world)) {
		t.Fatalf("%s got table %v, want %v", what, r.table, rvTable(world))
	}
}

func rvWantErr(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil || !rvContainsAll(err.Error(), want...) {
		t.Fatalf("%s: got %v, want an error containing %q", what, err, want)
	}
}

func TestRendezvousRandomOrder(t *testing.T) {
	rvLeaks(t)
	const world = 4
	orders := [][]int{{3, 1, 2, 0}} // rank 0 last: every other joiner waits on it
	for range 4 {
		orders = append(orders, rand.Perm(world))
	}
	for _, order := range orders {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			reg := rvServe(t, world, RendezvousOptions{Timeout: 20 * time.Second})
			var results [world]<-chan rvResult
			for i, rank := range order {
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				results[rank] = rvJoin(reg.Addr(), rvEntry(rank), RendezvousOptions{Timeout: 20 * time.Second})
				if i < world-1 {
					rvPending(t, fmt.Sprintf("rank %d", rank), results[rank])
				}
			}
			for rank := range world {
				rvWantTable(t, fmt.Sprintf("rank %d", rank), rvGet(t, results[rank]), world)
			}
			table, err := reg.Wait()
			rvWantTable(t, "the registry", rvResult{table, err}, world)
			// A joiner that asks again (its connection dropped as the table
			// went out) still gets the table, until Close.
			again, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(2), RendezvousOptions{Timeout: 10 * time.Second})
			rvWantTable(t, "rank 2 again", rvResult{again, err}, world)
			if err := reg.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRendezvousOneRank(t *testing.T) {
	rvLeaks(t)
	reg := rvServe(t, 1, RendezvousOptions{})
	table, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(0), RendezvousOptions{})
	rvWantTable(t, "rank 0", rvResult{table, err}, 1)
}

func TestRendezvousJoinerBeforeServer(t *testing.T) {
	rvLeaks(t)
	addr := rvFreeAddr(t)
	o := RendezvousOptions{Timeout: 20 * time.Second}
	early := []<-chan rvResult{rvJoin(addr, rvEntry(1), o), rvJoin(addr, rvEntry(2), o)}
	time.Sleep(500 * time.Millisecond) // several failed connection attempts
	for i, ch := range early {
		rvPending(t, fmt.Sprintf("rank %d", i+1), ch)
	}
	reg, err := ServeRendezvous(addr, 3, rvDigest, rvBuild, o)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	zero := rvJoin(reg.Addr(), rvEntry(0), o)
	rvWantTable(t, "rank 0", rvGet(t, zero), 3)
	for i, ch := range early {
		rvWantTable(t, fmt.Sprintf("rank %d", i+1), rvGet(t, ch), 3)
	}
}

func TestRendezvousRefusesOtherConfigAndBuild(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 4, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	o := RendezvousOptions{Timeout: 20 * time.Second}
	good := []<-chan rvResult{rvJoin(reg.Addr(), rvEntry(0), o), rvJoin(reg.Addr(), rvEntry(1), o)}

	other := rvEntry(2)
	other.ConfigDigest = "9b01de77aa55cc3311ee"
	_, err := JoinRendezvous(context.Background(), reg.Addr(), other, o)
	rvWantErr(t, "another config", err,
		"rendezvous at "+reg.Addr()+" refused rank 2 (127.0.0.1:7102)", "config digest 9b01de77aa55 differs from the rendezvous's 3fa2c1d4e5f6")
	if strings.Contains(err.Error(), other.ConfigDigest) || strings.Contains(err.Error(), rvDigest) {
		t.Errorf("digests should be abbreviated: %v", err)
	}
	log.waitFor(t, "refused rank 2 (127.0.0.1:7102)", "config digest")

	stale := rvEntry(3)
	stale.Build = "go1.26.0 v1.3.9"
	_, err = JoinRendezvous(context.Background(), reg.Addr(), stale, o)
	rvWantErr(t, "another build", err,
		"refused rank 3 (127.0.0.1:7103)", `build "go1.26.0 v1.3.9" differs from the rendezvous's "`+rvBuild+`"`)
	log.waitFor(t, "refused rank 3 (127.0.0.1:7103)", "build")

	// The refusals stopped nobody: the right ranks 2 and 3 complete the job.
	for i, ch := range good {
		rvPending(t, fmt.Sprintf("rank %d", i), ch)
	}
	rest := []<-chan rvResult{rvJoin(reg.Addr(), rvEntry(2), o), rvJoin(reg.Addr(), rvEntry(3), o)}
	for i, ch := range append(good, rest...) {
		rvWantTable(t, fmt.Sprintf("rank %d", i), rvGet(t, ch), 4)
	}
}

func TestRendezvousToken(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 2, RendezvousOptions{Token: "s3cret", Timeout: 20 * time.Second, Logf: log.logf})
	first := rvJoin(reg.Addr(), rvEntry(0), RendezvousOptions{Token: "s3cret", Timeout: 20 * time.Second})

	for _, c := range []struct{ what, token string }{{"a wrong token", "guess"}, {"no token", ""}} {
		start := time.Now()
		_, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), RendezvousOptions{Token: c.token, Timeout: 20 * time.Second})
		if !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("%s: got %v, want transport.ErrUnauthenticated", c.what, err)
		}
		rvWantErr(t, c.what, err, "rendezvous at "+reg.Addr()+" refused the connection", "bad or missing token")
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: refused after %v; a refusal must not be retried", c.what, d)
		}
	}
	log.waitFor(t, "rendezvous at "+reg.Addr()+": refused a connection from 127.0.0.1:", "bad or missing token")

	rvPending(t, "rank 0", first)
	second := rvJoin(reg.Addr(), rvEntry(1), RendezvousOptions{Token: "s3cret", Timeout: 20 * time.Second})
	rvWantTable(t, "rank 0", rvGet(t, first), 2)
	rvWantTable(t, "rank 1", rvGet(t, second), 2)
}

func rvIdentity(t *testing.T, ca, trust *certs.CA, name string) *transport.TLS {
	t.Helper()
	p, err := ca.Issue(name, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	trustPEM, err := trust.PEM()
	if err != nil {
		t.Fatal(err)
	}
	id, err := transport.NewTLS(trustPEM.Cert, p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRendezvousMutualTLS(t *testing.T) {
	rvLeaks(t)
	ca, err := certs.NewCA("job CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := certs.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var log rvLog
	reg := rvServe(t, 2, RendezvousOptions{TLS: rvIdentity(t, ca, ca, "rank 0"), Timeout: 20 * time.Second, Logf: log.logf})
	o := RendezvousOptions{TLS: rvIdentity(t, ca, ca, "rank 1"), Timeout: 20 * time.Second}
	first := rvJoin(reg.Addr(), rvEntry(0), o)

	_, err = JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), RendezvousOptions{TLS: rvIdentity(t, stranger, ca, "stranger"), Timeout: 10 * time.Second})
	if !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("a certificate of another CA: got %v, want transport.ErrUnauthenticated", err)
	}
	log.waitFor(t, "rendezvous at "+reg.Addr()+": refused a connection", "TLS handshake failed")
	_, err = JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), RendezvousOptions{Timeout: 10 * time.Second})
	rvWantErr(t, "no certificate", err, "rendezvous at "+reg.Addr(), "TLS")

	rvPending(t, "rank 0", first)
	second := rvJoin(reg.Addr(), rvEntry(1), o)
	rvWantTable(t, "rank 0", rvGet(t, first), 2)
	rvWantTable(t, "rank 1", rvGet(t, second), 2)
}

func TestRendezvousTimeoutNamesMissingRanks(t *testing.T) {
	rvLeaks(t)
	reg := rvServe(t, 4, RendezvousOptions{Timeout: 700 * time.Millisecond, Logf: (&rvLog{}).logf})
	o := RendezvousOptions{Timeout: 20 * time.Second}
	waiting := []<-chan rvResult{rvJoin(reg.Addr(), rvEntry(0), o), rvJoin(reg.Addr(), rvEntry(1), o)}
	wrong := rvEntry(3)
	wrong.ConfigDigest = "9b01de77aa55cc3311ee"
	if _, err := JoinRendezvous(context.Background(), reg.Addr(), wrong, o); err == nil {
		t.Fatal("a rank with another config was taken")
	}

	want := "rendezvous at " + reg.Addr() + ": ranks 2, 3 of 4 did not register within 700ms"
	_, err := reg.Wait()
	rvWantErr(t, "the registry", err, want, "; refused meanwhile: rank 3 (127.0.0.1:7103): its config digest 9b01de77aa55 differs", "(joiner from 127.0.0.1:")
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("the registry: got %q, want it to start %q", err, want)
	}
	for i, ch := range waiting {
		r := rvGet(t, ch)
		rvWantErr(t, fmt.Sprintf("rank %d", i), r.err, want)
	}
	// A rank arriving after the timeout hears the same.
	_, err = JoinRendezvous(context.Background(), reg.Addr(), rvEntry(2), o)
	rvWantErr(t, "rank 2, late", err, want)
}

func TestRendezvousJoinerTimeout(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 4, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	zero := rvJoin(reg.Addr(), rvEntry(0), RendezvousOptions{Timeout: 20 * time.Second})

	// Its own deadline passes first: it names the ranks the registry last
	// reported missing.
	_, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), RendezvousOptions{Timeout: 500 * time.Millisecond})
	want := "rendezvous at " + reg.Addr() + ": ranks 2, 3 of 4 did not register within 500ms"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	// Having left, it may come back from another address (restarted on
	// another port) without being taken for a duplicate.
	log.waitFor(t, "rank 1 (127.0.0.1:7101) left")
	moved := rvEntry(1)
	moved.Address = "127.0.0.1:7201"
	rest := []<-chan rvResult{rvJoin(reg.Addr(), moved, RendezvousOptions{Timeout: 20 * time.Second})}
	for _, rank := range []int{2, 3} {
		rest = append(rest, rvJoin(reg.Addr(), rvEntry(rank), RendezvousOptions{Timeout: 20 * time.Second}))
	}
	wantTable := rvTable(4)
	wantTable[1] = moved
	for i, ch := range append([]<-chan rvResult{zero}, rest...) {
		r := rvGet(t, ch)
		if r.err != nil || !slices.Equal(r.table, wantTable) {
			t.Errorf("rank %d: %v, %v; want %v", i, r.table, r.err, wantTable)
		}
	}
}

func TestRendezvousUnreachable(t *testing.T) {
	rvLeaks(t)
	addr := rvFreeAddr(t)
	_, err := JoinRendezvous(context.Background(), addr, rvEntry(1), RendezvousOptions{Timeout: 300 * time.Millisecond})
	rvWantErr(t, "nobody there", err, "rendezvous at "+addr+" not reachable: ", "connection refused", "(gave up after 300ms)")

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(200 * time.Millisecond)
		cancel()
	}()
	_, err = JoinRendezvous(ctx, addr, rvEntry(1), RendezvousOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v, want context.Canceled", err)
	}
}

func TestRendezvousDuplicateAndOutOfRange(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 4, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	o := RendezvousOptions{Timeout: 20 * time.Second}

	_, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(5), o)
	rvWantErr(t, "rank 5", err, "refused rank 5 (127.0.0.1:7105): rank 5 is beyond the job's 4 ranks (0-3)")

	first := rvJoin(reg.Addr(), rvEntry(2), o)
	waitRegistered(t, reg, 2)
	imposter := rvEntry(2)
	imposter.Address = "127.0.0.1:7202"
	_, err = JoinRendezvous(context.Background(), reg.Addr(), imposter, o)
	rvWantErr(t, "rank 2 again", err, "refused rank 2 (127.0.0.1:7202): rank 2 registered twice: from 127.0.0.1:7102 and 127.0.0.1:7202")
	log.waitFor(t, "rank 2 registered twice")

	// The same rank from the same address twice is one rank retrying: both
	// calls get the table.
	retry := rvJoin(reg.Addr(), rvEntry(2), o)
	rest := []<-chan rvResult{rvJoin(reg.Addr(), rvEntry(0), o), rvJoin(reg.Addr(), rvEntry(1), o), rvJoin(reg.Addr(), rvEntry(3), o)}
	for i, ch := range append([]<-chan rvResult{first, retry}, rest...) {
		rvWantTable(t, fmt.Sprintf("joiner %d", i), rvGet(t, ch), 4)
	}
}

// waitRegistered waits until rank is in the registry.
func waitRegistered(t *testing.T, reg *Registry, rank int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		reg.mu.Lock()
		in := reg.ranks[rank] != nil
		reg.mu.Unlock()
		if in {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank %d never registered", rank)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRendezvousClose(t *testing.T) {
	rvLeaks(t)
	reg, err := ServeRendezvous("127.0.0.1:0", 3, rvDigest, rvBuild, RendezvousOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waiting := rvJoin(reg.Addr(), rvEntry(1), RendezvousOptions{Timeout: 20 * time.Second})
	waitRegistered(t, reg, 1)
	reg.Close()
	want := "rendezvous at " + reg.Addr() + ": closed before all 3 ranks registered"
	rvWantErr(t, "rank 1", rvGet(t, waiting).err, want)
	_, err = reg.Wait()
	rvWantErr(t, "the registry", err, want)
	reg.Close() // again: a no-op
}

func TestRendezvousBindsLoopbackOnlyWithoutAuth(t *testing.T) {
	_, err := ServeRendezvous("0.0.0.0:0", 2, rvDigest, rvBuild, RendezvousOptions{})
	rvWantErr(t, "0.0.0.0", err, "rendezvous at 0.0.0.0:0: refusing to listen on 0.0.0.0:0 without authentication")
	if _, err := ServeRendezvous("127.0.0.1:0", 0, rvDigest, rvBuild, RendezvousOptions{}); err == nil {
		t.Error("a job of 0 ranks was served")
	}
}

// A link listener is not a registry: the joiner is told, not left waiting.
func TestRendezvousAtALinkAddress(t *testing.T) {
	rvLeaks(t)
	srv, err := transport.Listen("127.0.0.1:0", transport.Hello{Stage: 1, Stages: 2, DType: transport.Float32, Shapes: [][]int{{2}}}, transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = JoinRendezvous(context.Background(), srv.Addr(), rvEntry(1), RendezvousOptions{Timeout: 10 * time.Second})
	rvWantErr(t, "a link address", err, "rendezvous at "+srv.Addr()+": the address serves no pipetrain.cluster.Rendezvous")
}

// Another version's join is refused with both versions named; the job
// goes on.
func TestRendezvousOtherVersion(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 1, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	var reply message
	err := rendezvousService.Call(context.Background(), reg.Addr(), transport.Options{}, func(c *transport.ServiceStream) error {
		if err := c.Send([]byte(`{"rendezvous":3,"join":{"rank":0,"address":"127.0.0.1:7100","replica":0}}`)); err != nil {
			return err
		}
		b, err := c.Recv()
		if err != nil {
			return err
		}
		return reply.unmarshal(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	rvWantErr(t, "version 3", errors.New(reply.Refused), "refused a joiner from 127.0.0.1:", "unsupported rendezvous version 3 (this build speaks version 2)")
	log.waitFor(t, "unsupported rendezvous version 3")
	table, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(0), RendezvousOptions{})
	rvWantTable(t, "rank 0", rvResult{table, err}, 1)
}

func TestRendezvousMessages(t *testing.T) {
	good := message{World: 2, Registered: []int{0}}.marshal()
	if string(good) != `{"rendezvous":2,"world":2,"registered":[0]}` {
		t.Errorf("progress encodes as %s", good)
	}
	var m message
	if err := m.unmarshal(good); err != nil || m.World != 2 || !slices.Equal(m.Registered, []int{0}) {
		t.Errorf("progress decodes as %+v, %v", m, err)
	}
	for _, c := range []struct{ msg, want string }{
		{`{"rendezvous":3,"table":"whatever the future holds"}`, "unsupported rendezvous version 3 (this build speaks version 2)"},
		{`PTH` + "\x02", "expected a rendezvous message"},
		{`{"world":2}`, "expected a rendezvous message"},
		{`{"rendezvous":2,"registered":[0]} {}`, "expected a rendezvous message"},
		{`{"rendezvous":2,"registered":[0],"colour":"red"}`, `unknown field "colour"`},
		{`{"rendezvous":2,"refused":"x","failed":"y"}`, "2 kinds of content"},
		{`{"rendezvous":2,"world":2}`, "0 kinds of content"},
	} {
		err := m.unmarshal([]byte(c.msg))
		rvWantErr(t, c.msg, err, "protocol error", c.want)
	}
}

func TestCheckTable(t *testing.T) {
	table := rvTable(3)
	if err := checkTable(table, 3, rvEntry(1)); err != nil {
		t.Fatal(err)
	}
	short := checkTable(table[:2], 3, rvEntry(1))
	swapped := checkTable([]Entry{table[1], table[0], table[2]}, 3, rvEntry(1))
	moved := rvEntry(1)
	moved.Address = "127.0.0.1:9999"
	notMine := checkTable(table, 3, moved)
	rvWantErr(t, "short", short, "a table of 2 entries for 3 ranks")
	rvWantErr(t, "swapped", swapped, "entry 0 of the table is rank 1")
	rvWantErr(t, "not mine", notMine, "the table holds rank 1 (127.0.0.1:7101), not this rank's rank 1 (127.0.0.1:9999)")
}
