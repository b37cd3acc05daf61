package transport

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func handshakeSeeds() []*handshake {
	up, down := chunkHellos([][]int{{32, 128}, {32, 256, 2}})
	ring, _ := ringHellos([][]int{{4}, {}})
	plain, _ := hellos(64, 128)
	return []*handshake{
		{Hello: plain},
		{Hello: up},
		{Hello: down, Refused: "stage 2 refused stage 1 (127.0.0.1:7101): chunk 1 activation shape [32 256] float32 differs from [32 128] float32"},
		{Hello: ring},
		{Hello: Hello{Stage: -1, Stages: -7, DType: 200, Shapes: [][]int{}}},
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

func TestHandshakeDecodeRejects(t *testing.T) {
	good := handshakeSeeds()[2].marshal()
	// Every proper prefix is refused.
	for n := range len(good) {
		var h handshake
		if err := h.unmarshal(good[:n]); err == nil {
			t.Fatalf("accepted a %d-byte prefix of a %d-byte handshake", n, len(good))
		}
	}
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
		{"old JSON version", []byte(oldHandshake), "unsupported handshake version 0 (this build speaks version 1): the peer runs an incompatible pipetrain build"},
		{"newer version", with(3, 2), "unsupported handshake version 2"},
		{"unknown flag", with(4, 3), "bad handshake message: unknown flags 0x3"},
		{"trailing byte", append(bytes.Clone(good), 0), "1 unexpected bytes after the shapes"},
		{"digest too long", with(handshakeFixed, 0xff, 0xff, 0xff, 0xff), "config digest of 4294967295 bytes is longer than"},
		{"too many chunks", with(off, 0xff, 0xff, 0xff, 0x7f), "2147483647 chunks do not fit"},
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

func FuzzHandshake(f *testing.F) {
	for _, h := range handshakeSeeds() {
		f.Add(h.marshal())
	}
	f.Add([]byte{})
	f.Add([]byte(oldHandshake))
	f.Add([]byte("PTH\x01\x01\x01\x00\x00\x00\x00\x02\x00\x00\x00"))
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
