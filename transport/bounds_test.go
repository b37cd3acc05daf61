package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// manyChunks is a handshake of plain's head followed by n chunks of rank
// rank (all dimensions 0): the hello a process holding the token can send
// to make a listener allocate a slice header per byte or so.
func manyChunks(plain Hello, n, rank int) []byte {
	head := (&handshake{Hello: plain}).marshal()
	off := handshakeFixed
	for range 3 {
		off += 4 + int(binary.LittleEndian.Uint32(head[off:]))
	}
	b := binary.LittleEndian.AppendUint32(bytes.Clone(head[:off]), uint32(n))
	chunk := make([]byte, 1+8*rank)
	chunk[0] = byte(rank)
	for range n {
		b = append(b, chunk...)
	}
	return b
}

// allocated is the number of bytes f allocates, measured across the
// process (background goroutines count too, so thresholds need slack).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHandshakeChunkCountBounded: a well-formed hello of one more rank-0
// chunk than maxHelloChunks (about a MiB, each chunk one byte) is refused by
// its count, before the decoder allocates a slice for its shapes (24 bytes a
// chunk, 24 MiB here).
func TestHandshakeChunkCountBounded(t *testing.T) {
	plain, _ := hellos(64, 128)
	b := manyChunks(plain, maxHelloChunks+1, 0)
	var err error
	n := allocated(func() {
		var h handshake
		err = h.unmarshal(b)
	})
	if err == nil || !strings.Contains(err.Error(), "1048577 chunks exceed the limit of 1048576") {
		t.Errorf("got %v, want the chunk count refused", err)
	}
	if n > 256<<10 {
		t.Errorf("refusing %d chunks allocated %d bytes", maxHelloChunks+1, n)
	}
}

// TestHandshakeDecodeAllocs: decoding a hello takes the same few
// allocations whatever its chunk count (its strings, and the shapes in one
// array), not one per chunk.
func TestHandshakeDecodeAllocs(t *testing.T) {
	plain, _ := hellos(64, 128)
	for _, chunks := range []int{1, 4096} {
		b := manyChunks(plain, chunks, 1)
		var h handshake
		if err := h.unmarshal(b); err != nil || len(h.Hello.Shapes) != chunks {
			t.Fatalf("%d chunks: %v", chunks, err)
		}
		if allocs := testing.AllocsPerRun(10, func() { h.unmarshal(b) }); allocs > 5 {
			t.Errorf("decoding %d chunks: %v allocations", chunks, allocs)
		}
	}
}

// tokenStream opens the link service's stream on srv by hand, holding the
// token: a process that may connect but is not the neighbour, or does not
// follow the protocol. It closes with the test.
func tokenStream(t *testing.T, srv *Server, token string) grpc.ClientStream {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr(), dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cs, err := conn.NewStream(withToken(ctxT(t, 10*time.Second), token), &streamDesc, fullMethod)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// sendHello sends b as the first message of cs and returns the listener's
// answer: the status it ended the stream with, or what it sent back.
func sendHello(cs grpc.ClientStream, b []byte) (reply []byte, err error) {
	if err := cs.SendMsg(frame{b}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	err = cs.RecvMsg(&reply)
	return reply, err
}

// TestHugeHelloRefusedUnread plays the attack on a running link: a process
// holding the token sends stage 2 a 9 MiB hello of a million chunks. The
// listener refuses it by its length (gRPC reads the length prefix, not the
// message, against a limit derived from the link's shapes), allocating a
// small part of what decoding it would, and the link goes on.
func TestHugeHelloRefusedUnread(t *testing.T) {
	checkLeaks(t)
	shape := []int{8, 16}
	up, down := hellos(shape...)
	opts := Options{Token: "s3cret"}
	srv, ul, dl := connect(t, up, down, opts)

	huge := manyChunks(up, maxHelloChunks, 1)
	var err error
	n := allocated(func() {
		cs := tokenStream(t, srv, "s3cret")
		_, err = sendHello(cs, huge)
	})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Errorf("a %d-byte hello: got %v, want it refused by its length", len(huge), err)
	}
	// Decoding it would take 9 MiB for the message, 24 MiB for the shapes'
	// slice headers and 8 MiB for the shapes, before its refusal printed
	// a million of them.
	t.Logf("refusing a %d-byte hello allocated %d bytes", len(huge), n)
	if n > 16<<20 {
		t.Errorf("refusing a %d-byte hello allocated %d bytes", len(huge), n)
	}
	exchange(t, ul, dl, 3, shape)
}

// TestConnectedRefusedBeforeShapes: once the link is up, a dialer of its
// group is refused from the hello's head; its shapes are never decoded
// (here they are malformed, which would otherwise be the refusal), and the
// link goes on.
func TestConnectedRefusedBeforeShapes(t *testing.T) {
	checkLeaks(t)
	shape := []int{4}
	up, down := hellos(shape...)
	opts := Options{Token: "s3cret"}
	srv, ul, dl := connect(t, up, down, opts)

	b := append((&handshake{Hello: up}).marshal(), 0xff) // a stray byte after the shapes
	reply, err := sendHello(tokenStream(t, srv, "s3cret"), b)
	if err != nil {
		t.Fatalf("want the refusal as a handshake, got %v", err)
	}
	var hs handshake
	if err := hs.unmarshal(reply); err != nil || !strings.Contains(hs.Refused, "an upstream neighbour is already connected") {
		t.Errorf("got refusal %q (%v), want an upstream neighbour already connected", hs.Refused, err)
	}
	exchange(t, ul, dl, 3, shape)
}

// TestRecvLimit: a link receives messages up to its largest tensor or the
// peer's hello, whichever is longer, never the 1 GiB any send may take.
func TestRecvLimit(t *testing.T) {
	small, _ := hellos(4)
	if got := recvLimit(small); got != minHelloLimit {
		t.Errorf("a link of [4]: %d, want the hello's floor %d", got, minHelloLimit)
	}
	big, _ := chunkHellos([][]int{{4}, {4096, 1024}})
	if got, want := recvLimit(big), fixedHeader+2*8+4096*1024*4; got != want {
		t.Errorf("a link of [4096 1024] float32: %d, want %d", got, want)
	}
}

// TestRefusalCut: a refusal longer than a hello may carry is cut before it
// is sent, so that the dialer can read it.
func TestRefusalCut(t *testing.T) {
	up, _ := hellos(4)
	b := (&handshake{Hello: up, Refused: strings.Repeat("é", maxHelloRefusal)}).marshal()
	var hs handshake
	if err := hs.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if len(hs.Refused) > maxHelloRefusal || !strings.HasSuffix(hs.Refused, " [cut]") || !strings.HasPrefix(hs.Refused, "éé") {
		t.Errorf("refusal of %d bytes ends %q", len(hs.Refused), hs.Refused[max(0, len(hs.Refused)-12):])
	}
}
