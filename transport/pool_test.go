package transport

import (
	"testing"
	"time"
)

func TestPayloadPoolSizes(t *testing.T) {
	var p payloadPool
	for _, n := range []int{0, 1, 3, 4096, 4097, 3 << 20} {
		b := p.get(n)
		if len(*b) != n {
			t.Fatalf("get(%d) has length %d", n, len(*b))
		}
		if n > 0 && cap(*b) != 1<<sizeClass(n) {
			t.Errorf("get(%d) has capacity %d, want the class's %d", n, cap(*b), 1<<sizeClass(n))
		}
		p.put(b)
	}
	// A buffer of a capacity that is no class is dropped, not pooled, so a
	// later get never returns one too short for its class.
	odd := make([]byte, 100)
	p.put(&odd)
	if b := p.get(128); cap(*b) != 128 {
		t.Errorf("get(128) returned capacity %d", cap(*b))
	}
}

// TestReleaseOverLinks receives over a gRPC link and a Pipe, releases, and
// checks what Release promises: Data is gone, the memory is handed back (seen
// here through poisoning), a second Release and a Release of a tensor that was
// never received do nothing.
func TestReleaseOverLinks(t *testing.T) {
	PoisonReleased(true)
	defer PoisonReleased(false)
	shape := []int{4, 8}
	up, down := hellos(shape...)
	_, ul, dl := connect(t, up, down, Options{})
	pa, pb := Pipe(up, down, 2)
	for name, pair := range map[string][2]Link{"grpc": {ul, dl}, "pipe": {pa, pb}} {
		ctx := ctxT(t, 5*time.Second)
		sent := pattern(Activation, 3, 1, shape)
		if err := pair[0].Send(ctx, sent); err != nil {
			t.Fatal(err)
		}
		got, err := pair[1].Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameTensor(sent, got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mem := got.Data
		got.Release()
		if got.Data != nil {
			t.Errorf("%s: Data survives Release", name)
		}
		for i, b := range mem {
			if b != 0xff {
				t.Fatalf("%s: byte %d of the released buffer is %#x, not poisoned", name, i, b)
			}
		}
		got.Release()
		before := append([]byte(nil), sent.Data...)
		sent.Release() // never received: its memory is the sender's
		if string(sent.Data) != string(before) {
			t.Errorf("%s: Release changed a tensor that was never received", name)
		}
	}
}
