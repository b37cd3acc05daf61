package cluster

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// rvAllocated is the number of bytes f allocates, measured across the
// process.
func rvAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// logBytes is the size of everything logged so far, and the line count.
func (l *rvLog) logBytes() (bytes, lines int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		bytes += len(line)
	}
	return bytes, len(l.lines)
}

// TestJoinTextBounded: an entry's text fields are bounded on receipt: a
// join with a field beyond maxEntryText is refused naming the field, and a
// join beyond maxJoinMessage is refused before it is decoded, without
// allocating its text.
func TestJoinTextBounded(t *testing.T) {
	long := strings.Repeat("x", maxEntryText+1)
	for _, c := range []struct {
		mutate func(*Entry)
		want   string
	}{
		{func(e *Entry) { e.Address = long }, "join of rank 1: its address is 1025 bytes, more than the 1024 an entry may hold"},
		{func(e *Entry) { e.ConfigDigest = long }, "its config digest is 1025 bytes"},
		{func(e *Entry) { e.Build = long }, "its build is 1025 bytes"},
	} {
		e := rvEntry(1)
		c.mutate(&e)
		var m message
		err := m.unmarshal(message{Join: &e}.marshal())
		rvWantErr(t, c.want, err, "protocol error", c.want)
		if strings.Contains(err.Error(), long) {
			t.Errorf("the refusal repeats the field: %.100s…", err)
		}
	}
	table := rvTable(3)
	table[2].Build = long
	var m message
	rvWantErr(t, "table", m.unmarshal(message{World: 3, Table: table}.marshal()), "entry 2 of the table, rank 2: its build is 1025 bytes")

	e := rvEntry(1)
	e.Build = strings.Repeat("b", 16<<20-1<<10)
	b := message{Join: &e}.marshal()
	var err error
	n := rvAllocated(func() { err = m.unmarshal(b) })
	rvWantErr(t, "a 16 MiB build", err, fmt.Sprintf("a join of %d bytes, more than the 32768 one may take", len(b)))
	if n > 1<<20 {
		t.Errorf("refusing a %d-byte join allocated %d bytes", len(b), n)
	}
}

// TestReplyTextCut: a refusal or failure longer than maxReplyText reaches
// the joiner cut.
func TestReplyTextCut(t *testing.T) {
	var m message
	if err := m.unmarshal(message{Failed: strings.Repeat("f", 1<<20)}.marshal()); err != nil {
		t.Fatal(err)
	}
	if len(m.Failed) > maxReplyText || !strings.HasSuffix(m.Failed, " [cut]") {
		t.Errorf("a failure of 1 MiB reads as %d bytes ending %q", len(m.Failed), m.Failed[len(m.Failed)-10:])
	}
}

// TestRendezvousHugeBuildRefused plays the attack: a process holding the
// token joins with a build of nearly 16 MiB (the most a rendezvous message
// may take). It is refused by the join's size, and neither the log nor the
// refusal repeats the build.
func TestRendezvousHugeBuildRefused(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 2, RendezvousOptions{Token: "s3cret", Timeout: 20 * time.Second, Logf: log.logf})
	o := RendezvousOptions{Token: "s3cret", Timeout: 20 * time.Second}
	e := rvEntry(1)
	e.Build = strings.Repeat("b", 16<<20-1<<10)
	_, err := JoinRendezvous(context.Background(), reg.Addr(), e, o)
	rvWantErr(t, "a 16 MiB build", err, "refused a joiner from 127.0.0.1:", "more than the 32768 one may take")
	if len(err.Error()) > 1<<10 {
		t.Errorf("the refusal is %d bytes", len(err.Error()))
	}
	log.waitFor(t, "refused a joiner from 127.0.0.1:", "more than the 32768 one may take")
	if n, _ := log.logBytes(); n > 1<<10 {
		t.Errorf("one refusal logged %d bytes", n)
	}
	// The job goes on.
	good := []<-chan rvResult{rvJoin(reg.Addr(), rvEntry(0), o), rvJoin(reg.Addr(), rvEntry(1), o)}
	for i, ch := range good {
		rvWantTable(t, fmt.Sprintf("rank %d", i), rvGet(t, ch), 2)
	}
}

// TestRendezvousRefusalFloodBounded: 48 joins with builds of 512 KiB, each
// different, write a bounded log (the first maxRefusalsLogged in full, then
// a count) and leave bounded refusals in memory.
func TestRendezvousRefusalFloodBounded(t *testing.T) {
	rvLeaks(t)
	var log rvLog
	reg := rvServe(t, 2, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	o := RendezvousOptions{Timeout: 20 * time.Second}
	const joins = 48
	for i := range joins {
		e := rvEntry(1)
		e.Build = fmt.Sprintf("%d %s", i, strings.Repeat("b", 512<<10))
		_, err := JoinRendezvous(context.Background(), reg.Addr(), e, o)
		rvWantErr(t, fmt.Sprintf("join %d", i), err, "rendezvous at "+reg.Addr()+" refused ")
	}
	n, lines := log.logBytes()
	if lines != maxRefusalsLogged+1 || n > 16<<10 {
		t.Errorf("%d refusals logged %d lines, %d bytes; want %d lines, a few KiB", joins, lines, n, maxRefusalsLogged+1)
	}
	log.waitFor(t, "has refused 32 calls (the first 16 are logged in full); the latest: ")
	reg.mu.Lock()
	kept := 0
	for _, r := range reg.refusals {
		kept += len(r)
	}
	count := len(reg.refusals)
	reg.mu.Unlock()
	if count > maxRefusalsKept || kept > maxRefusalsKept*maxRefusalText {
		t.Errorf("%d refusals kept, %d bytes", count, kept)
	}
}

// TestRefusalsCut: however long a refusal (a ledger's error, a decoder's),
// it is logged and kept cut to maxRefusalText.
func TestRefusalsCut(t *testing.T) {
	var log rvLog
	reg := rvServe(t, 1, RendezvousOptions{Timeout: 20 * time.Second, Logf: log.logf})
	reg.refused(strings.Repeat("r", 1<<20))
	if n, _ := log.logBytes(); n > maxRefusalText+100 {
		t.Errorf("a 1 MiB refusal logged %d bytes", n)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.refusals) != 1 || len(reg.refusals[0]) > maxRefusalText {
		t.Errorf("kept %d refusals, the first %d bytes", len(reg.refusals), len(reg.refusals[0]))
	}
}
