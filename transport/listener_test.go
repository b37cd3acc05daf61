package transport

import (
	"context"
	"net"
	"testing"
	"time"
)

// A socket bound before Listen (a rank publishing its address to a
// rendezvous first) is served as if Listen had bound it, and Listen's
// exposure rules still hold for it.
func TestListenServesABoundSocket(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up, down := hellos(2, 3)
	srv, err := Listen(lis.Addr().String(), down, Options{Listener: lis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if srv.Addr() != lis.Addr().String() {
		t.Fatalf("serves %s, bound %s", srv.Addr(), lis.Addr())
	}
	upLink, downLink := join(t, acceptAsync(t, srv, 10*time.Second), srv.Addr(), up, Options{})
	msg, err := FromFloat32s(Activation, 1, 0, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := upLink.Send(ctx, msg); err != nil {
		t.Fatal(err)
	}
	got, err := downLink.Recv(ctx)
	if err != nil || got.Float32s()[5] != 6 {
		t.Fatalf("received %v, %v", got, err)
	}

	wide, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	if _, err := Listen(wide.Addr().String(), down, Options{Listener: wide}); err == nil {
		t.Fatal("a socket beyond loopback was served without a token or TLS")
	}
}
