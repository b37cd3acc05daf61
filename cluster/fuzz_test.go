package cluster

import (
	"strings"
	"testing"
)

// FuzzRendezvousMessage: whatever a joiner or the registry sends, the
// decoder neither panics nor lets text past its bounds: a decoded entry's
// fields are within maxEntryText, a refusal or failure within
// maxReplyText, and an error's text short enough to log.
func FuzzRendezvousMessage(f *testing.F) {
	long := strings.Repeat("x", maxEntryText+1)
	e := rvEntry(1)
	f.Add(message{Join: &e}.marshal())
	f.Add(message{World: 2, Registered: []int{0}}.marshal())
	f.Add(message{World: 2, Table: rvTable(2)}.marshal())
	f.Add(message{Refused: "rendezvous at 127.0.0.1:7000 refused rank 1"}.marshal())
	e.Build = long
	f.Add(message{Join: &e}.marshal())
	e.Build = strings.Repeat("b", maxJoinMessage)
	f.Add(message{Join: &e}.marshal())
	f.Add([]byte(`{"rendezvous":2,"registered":[0],"` + long + `":1}`))
	f.Add([]byte(`{"rendezvous":3,"join":"whatever the future holds"}`))
	f.Add([]byte(`{"rendezvous":2,"join":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m message
		if err := m.unmarshal(b); err != nil {
			if n := len(err.Error()); n > 2*maxRefusalText {
				t.Fatalf("an error of %d bytes", n)
			}
			return
		}
		entries := m.Table
		if m.Join != nil {
			entries = append(entries, *m.Join)
			var again message
			if err := again.unmarshal(m.marshal()); err != nil || *again.Join != *m.Join {
				t.Fatalf("a join re-decodes as %+v, %v; want %+v", again.Join, err, m.Join)
			}
		}
		for _, e := range entries {
			if len(e.Address) > maxEntryText || len(e.ConfigDigest) > maxEntryText || len(e.Build) > maxEntryText {
				t.Fatalf("an entry beyond the bounds: %d, %d, %d bytes", len(e.Address), len(e.ConfigDigest), len(e.Build))
			}
		}
		if len(m.Refused) > maxReplyText || len(m.Failed) > maxReplyText {
			t.Fatalf("a reply of %d, %d bytes", len(m.Refused), len(m.Failed))
		}
	})
}
