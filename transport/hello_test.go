package transport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func handshakeSeeds() []*handshake {
	up, down := chunkHellos([][]int{{32, 128}, {32, 256, 2}})
	ring, _ := ringHellos([][]int{{4}, {}})
	plain, _ := hellos(64, 128)
	r0, r1 := replicaHellos(3, [][]int{{4, 8}, {2}})
	r1.Stage, r1.Stages = 0, 1
	p1, _ := hellos(2)
	p1.Replica, p1.Replicas = 1, 2
	sock, _ := replicaHellos(2, [][]int{{4}})
	sock.StreamSocket, sock.Kernels = streamSocketPrefix+"00ff", "gonum"
	return []*handshake{
		{Hello: plain},
		{Hello: up},
		{Hello: down, Refused: "stage 2 refused stage 1 (127.0.0.1:7101): chunk 1 activation shape [32 256] float32 differs from [32 128] float32"},
		{Hello: ring},
		{Hello: Hello{Stage: -1, Stages: -7, DType: 200, Shapes: [][]int{}}},
		{Hello: r0},
		{Hello: r1, Refused: "no"},
		{Hello: p1},
		{Hello: Hello{Group: ReplicaGroup, Stage: math.MaxInt32, Stages: math.MinInt32, Replica: -1, Replicas: math.MaxInt32, Shapes: [][]int{}}},
		{Hello: sock},
	}
}

func TestHandshakeRoundTrip(t *testing.T) {
	for _, in := range handshakeSeeds() {
		b := in.marshal()
		var out handshake
		if err := out.unmarshal(b); err != nil {
			t.Fatalf("%+v: %v", in, err)
		}
		if !reflect.DeepEqual(&out, in) {
			t.Errorf("round trip changed the handshake:\n in %+v\nout %+v", in, out)
		}
		if again := out.marshal(); !bytes.Equal(again, b) {
			t.Errorf("re-encoding differs:\n%x\n%x", b, again)
		}
	}
}

// TestHandshakeWireFields pins where the version-2 header keeps the fields
// that version 1 did not have, so that a change of layout is a deliberate
// version bump.
func TestHandshakeWireFields(t *testing.T) {
	h := Hello{Group: ReplicaGroup, Stage: 3, Stages: 4, Replica: 2, Replicas: 5, DType: Float32, Ring: true, Shapes: [][]int{{1}}}
	b := (&handshake{Hello: h}).marshal()
	want := []byte("PTH\x02\x01\x01\x01" +
		"\x03\x00\x00\x00\x04\x00\x00\x00\x02\x00\x00\x00\x05\x00\x00\x00")
	if handshakeFixed != len(want) || !bytes.Equal(b[:len(want)], want) {
		t.Errorf("header %q (%d bytes fixed), want %q", b[:min(len(b), handshakeFixed)], handshakeFixed, want)
	}
	// Replicas is sent as given; 0 and 1 stay distinct on the wire yet
	// compare equal in CheckPeer.
	for _, n := range []int{0, 1} {
		x := h
		x.Group, x.Replica, x.Replicas = PipelineGroup, 0, n
		var out handshake
		if err := out.unmarshal((&handshake{Hello: x}).marshal()); err != nil || out.Hello.Replicas != n {
			t.Errorf("replicas %d decoded as %d (%v)", n, out.Hello.Replicas, err)
		}
	}
}

// TestHandshakeTruncated: every proper prefix of every seed is refused with
// a protocol error, and one that ends inside the fixed header says so.
func TestHandshakeTruncated(t *testing.T) {
	for i, seed := range handshakeSeeds() {
		good := seed.marshal()
		for n := range len(good) {
			var h handshake
			err := h.unmarshal(good[:n])
			if err == nil {
				t.Fatalf("seed %d: accepted a %d-byte prefix of a %d-byte handshake", i, n, len(good))
			}
			if !strings.HasPrefix(err.Error(), "protocol error: ") {
				t.Fatalf("seed %d, %d bytes: %v", i, n, err)
			}
			if want := fmt.Sprintf("%d bytes is shorter than the %d-byte header", n, handshakeFixed); n >= 4 && n < handshakeFixed && !strings.Contains(err.Error(), want) {
				t.Errorf("seed %d, %d bytes: got %v, want %q", i, n, err, want)
			}
		}
	}
}

func TestHandshakeDecodeRejects(t *testing.T) {
	good := handshakeSeeds()[2].marshal()
	// Every proper prefix is refused.
	for n := range len(good) {
		var h handshake
		if err := h.unmarshal(good[:n]); err == nil {
			t.Fatalf("accepted a %d-byte prefix of a %d-byte handshake", n, len(good))
		}
	}
	// A version-1 header: the same fields without group, replica and replicas.
	v1 := append([]byte("PTH\x01\x00\x01\x01\x00\x00\x00\x04\x00\x00\x00"), good[handshakeFixed:]...)
	with := func(i int, v ...byte) []byte { b := bytes.Clone(good); copy(b[i:], v); return b }
	// Offset of the chunk count: header, then three strings.
	off := handshakeFixed
	for range 3 {
		off += 4 + int(binary.LittleEndian.Uint32(good[off:]))
	}
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "expected a handshake message, got 0 bytes"},
		{"tensor", header(1, 1, 0), `expected a handshake message, got 24 bytes starting "PTT\x00"`},
		{"old JSON version", []byte(oldHandshake), "unsupported handshake version 0 (this build speaks version 2): the peer runs an incompatible pipetrain build"},
		{"version 1", v1, "unsupported handshake version 1 (this build speaks version 2): the peer runs an incompatible pipetrain build"},
		{"newer version", with(3, 3), "unsupported handshake version 3"},
		{"unknown flag", with(4, 3), "bad handshake message: unknown flags 0x3"},
		{"unknown group", with(6, 2), "bad handshake message: unknown link group 2"},
		{"group 255", with(6, 0xff), "bad handshake message: unknown link group 255"},
		{"trailing byte", append(bytes.Clone(good), 0), "1 unexpected bytes after the shapes"},
		{"digest too long", with(handshakeFixed, 0xff, 0xff, 0xff, 0xff), "config digest of 4294967295 bytes exceeds the 1024-byte limit"},
		{"digest past the end", with(handshakeFixed, 0xff, 0x03), "config digest of 1023 bytes is longer than"},
		{"too many chunks", with(off, 0xff, 0xff, 0xff, 0x7f), "2147483647 chunks exceed the limit of 1048576"},
		{"chunks past the end", with(off, 0xff, 0xff, 0x0f), "1048575 chunks do not fit"},
		{"rank too big", with(off+4, 9), "chunk 0: rank 9 exceeds 8"},
		{"negative dim", with(off+5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff), "chunk 0: dimension 0 of 18446744073709551615 is out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h handshake
			err := h.unmarshal(c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "protocol error: ") {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	// A huge claimed chunk count must not make the decoder allocate.
	huge := with(off, 0xff, 0xff, 0xff, 0xff)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		var h handshake
		_ = h.unmarshal(huge)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("100 decodes of a huge chunk count allocated %d bytes", n)
	}
}

func TestHelloValidate(t *testing.T) {
	up, _ := chunkHellos([][]int{{2}, {3}})
	cases := []struct {
		mutate func(h *Hello)
		want   string
	}{
		{func(h *Hello) { h.Shapes = nil }, "stage 1: the link has no activation shapes (Hello.Shapes needs one per model chunk)"},
		{func(h *Hello) { h.Shapes = [][]int{{2}, {-3}} }, "stage 1: link dtype/shape of chunk 1: tensor message: negative dimension in shape [-3]"},
		{func(h *Hello) { h.Shapes = [][]int{make([]int, 9)} }, "stage 1: link dtype/shape of chunk 0: tensor message: rank 9 exceeds 8"},
		{func(h *Hello) { h.DType = 0 }, "stage 1: link dtype/shape of chunk 0: tensor message: unknown dtype 0"},
		{func(h *Hello) { h.Stages = 1; h.Stage = 0 }, "stage 0 of 1: a link needs 0 <= stage < stages and at least 2 stages"},
		{func(h *Hello) { h.Stage = 4 }, "stage 4 of 4: a link needs"},
	}
	for _, c := range cases {
		h := up.clone()
		c.mutate(&h)
		if err := h.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", h, err, c.want)
		}
	}
	if err := up.validate(); err != nil {
		t.Error(err)
	}
}

func TestHelloValidateReplicas(t *testing.T) {
	r0, _ := replicaHellos(3, [][]int{{2}})
	p, _ := hellos(2)
	p.Replica, p.Replicas = 2, 3
	cases := []struct {
		base   Hello
		mutate func(h *Hello)
		want   string // "" when valid
	}{
		{r0, func(h *Hello) {}, ""},
		{r0, func(h *Hello) { h.Stages, h.Stage = 1, 0 }, ""}, // a one-stage pipeline may have replicas
		{r0, func(h *Hello) { h.Replicas, h.Replica = 2, 1 }, ""},
		{r0, func(h *Hello) { h.Replicas = 1; h.Replica = 0 }, "stage 1 replica 0 of 1: a replica ring link needs 0 <= replica < replicas and at least 2 replicas"},
		{r0, func(h *Hello) { h.Replicas = 0 }, "a replica ring link needs 0 <= replica < replicas and at least 2 replicas"},
		{r0, func(h *Hello) { h.Replica = 3 }, "stage 1 replica 3 of 3: a replica ring link needs"},
		{r0, func(h *Hello) { h.Replica = -1 }, "stage 1 replica -1 of 3: a replica ring link needs"},
		{r0, func(h *Hello) { h.Stages = 0; h.Stage = 0 }, "stage 0 of 0: a replica ring link needs 0 <= stage < stages"},
		{r0, func(h *Hello) { h.Stage = 4 }, "stage 4 of 4: a replica ring link needs"},
		{r0, func(h *Hello) { h.Shapes = nil }, "stage 1 replica 0: the link has no activation shapes"},
		{r0, func(h *Hello) { h.Group = 2 }, "stage 1 replica 0: unknown link group 2"},
		{p, func(h *Hello) {}, ""},
		{p, func(h *Hello) { h.Replica = 3 }, "stage 1 replica 3 of 3: a link needs 0 <= replica < replicas"},
		{p, func(h *Hello) { h.Replica = -1 }, "stage 1 replica -1 of 3: a link needs"},
		{p, func(h *Hello) { h.Replicas, h.Replica = 0, 1 }, "stage 1 replica 1 of 0: a link needs"},
		{p, func(h *Hello) { h.Replicas, h.Replica = 0, 0 }, ""},
		{p, func(h *Hello) { h.Replicas, h.Replica = -1, 0 }, "a link needs 0 <= replica < replicas"},
		{p, func(h *Hello) { h.Stages, h.Stage = 1, 0 }, "stage 0 of 1: a link needs 0 <= stage < stages and at least 2 stages"},
		{p, func(h *Hello) { h.DType = 0 }, "stage 1 replica 2: link dtype/shape of chunk 0"},
	}
	for i, c := range cases {
		h := c.base.clone()
		c.mutate(&h)
		err := h.validate()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("case %d %+v: got %v, want %q", i, h, err, c.want)
		}
	}
}

func TestGroupString(t *testing.T) {
	for g, want := range map[Group]string{PipelineGroup: "pipeline", ReplicaGroup: "replica ring", 7: "group 7"} {
		if got := g.String(); got != want {
			t.Errorf("Group(%d) = %q, want %q", g, got, want)
		}
	}
}

func TestNames(t *testing.T) {
	p, _ := hellos(2)
	if got := p.name(); got != "stage 1 (127.0.0.1:7101)" {
		t.Errorf("without replicas: %q", got)
	}
	p.Replicas = 1
	if got := p.name(); got != "stage 1 (127.0.0.1:7101)" {
		t.Errorf("one replica: %q", got)
	}
	p.Replicas = 2
	if got := p.name(); got != "stage 1 replica 0 (127.0.0.1:7101)" {
		t.Errorf("two replicas: %q", got)
	}
	p.Address, p.Replica = "", 1
	if got := p.name(); got != "stage 1 replica 1" {
		t.Errorf("without address: %q", got)
	}
}

// TestHandshakeCorpus keeps the seed corpus meaningful across format
// changes: the entries named for a valid hello decode, every other one is
// refused, each for the reason its name gives.
func TestHandshakeCorpus(t *testing.T) {
	valid := map[string]Hello{
		"plain":            {Stage: 1, Stages: 4, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7101", DType: Float32, Shapes: [][]int{{64, 128}}},
		"replica-ring":     {Group: ReplicaGroup, Stage: 0, Stages: 2, Replica: 1, Replicas: 3, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7101", DType: Float32, Shapes: [][]int{{64, 128}}},
		"pipeline-replica": {Stage: 1, Stages: 4, Replica: 2, Replicas: 3, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7101", DType: Float32, Shapes: [][]int{{64, 128}}},
		"negative-stage":   {Group: ReplicaGroup, Stage: -1, Stages: -7, Replica: -2, Replicas: -3, DType: 200, Shapes: [][]int{}},
		"stream-socket": {Group: ReplicaGroup, Stage: 0, Stages: 2, Replica: 1, Replicas: 3, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7101", DType: Float32, Shapes: [][]int{{64, 128}},
			StreamSocket: "@pipetrain-ring-0123456789abcdef0123456789abcdef"},
		"chunks": {}, "float64-rank8": {}, "refused": {}, "ring": {},
	}
	refused := map[string]string{
		"chunk-negative-dim":       "dimension 0 of 18446744073709551615 is out of range",
		"chunk-rank9":              "rank 9 exceeds 8",
		"empty":                    "got 0 bytes",
		"huge-chunk-count":         "4294967295 chunks exceed the limit of 1048576",
		"huge-digest-length":       "config digest of 4294967295 bytes exceeds the 1024-byte limit",
		"long-address":             "address of 1025 bytes exceeds the 1024-byte limit",
		"long-refusal":             "refusal of 8193 bytes exceeds the 8192-byte limit",
		"many-chunks":              "1048577 chunks exceed the limit of 1048576",
		"magic-only":               "got 3 bytes",
		"newer-version":            "unsupported handshake version 3",
		"version-1":                "unsupported handshake version 1 (this build speaks version 2)",
		"old-json-version":         "unsupported handshake version 0",
		"tensor-sent-as-hello":     `starting "PTT\x00"`,
		"trailing-byte":            "1 unexpected bytes after the shapes",
		"truncated-digest":         "config digest of 6 bytes is longer than the 2 bytes left",
		"truncated-header":         "21 bytes is shorter than the 23-byte header",
		"truncated-shape":          "truncated shape of chunk 0",
		"unknown-flags":            "unknown flags 0x3",
		"unknown-group":            "unknown link group 2",
		"stream-socket-flag-empty": "the stream socket flag with no socket",
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzHandshake")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(valid)+len(refused) {
		t.Errorf("%d corpus entries, %d expected", len(entries), len(valid)+len(refused))
	}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s: not a corpus file", e.Name())
		}
		lit, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		var h handshake
		err = h.unmarshal([]byte(lit))
		if want, ok := valid[e.Name()]; ok {
			if err != nil {
				t.Errorf("%s: %v", e.Name(), err)
			} else if want.Shapes != nil && !reflect.DeepEqual(h.Hello, want) {
				t.Errorf("%s: decoded %+v, want %+v", e.Name(), h.Hello, want)
			}
			continue
		}
		want, ok := refused[e.Name()]
		if !ok {
			t.Errorf("%s: unexpected corpus entry", e.Name())
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", e.Name(), err, want)
		}
	}
}

func FuzzHandshake(f *testing.F) {
	for _, h := range handshakeSeeds() {
		f.Add(h.marshal())
	}
	f.Add([]byte{})
	f.Add([]byte(oldHandshake))
	f.Add([]byte("PTH\x01\x01\x01\x00\x00\x00\x00\x02\x00\x00\x00"))
	f.Add([]byte("PTH\x02\x01\x01\x01\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h handshake
		if err := h.unmarshal(b); err != nil {
			return
		}
		if out := h.marshal(); !bytes.Equal(out, b) {
			t.Fatalf("re-marshal differs:\n in %x\nout %x", b, out)
		}
		// Whatever decodes can be checked without panicking.
		_ = CheckPeer(h.Hello, h.Hello, true)
		_ = CheckPeer(h.Hello, h.Hello, false)
	})
}
