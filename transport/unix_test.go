package transport

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestUnixSocketLink runs a link over a Unix socket, then listens again on the
// socket file a killed process would leave behind.
func TestUnixSocketLink(t *testing.T) {
	addr := "unix:" + filepath.Join(t.TempDir(), "stage1.sock")
	up := Hello{Stage: 1, Stages: 2, ConfigDigest: "d", Address: addr, DType: Float32, Shapes: [][]int{{2, 3}}}
	down := Hello{Stage: 0, Stages: 2, ConfigDigest: "d", Address: "a", DType: Float32, Shapes: [][]int{{2, 3}}}
	opts := Options{ConnectTimeout: 5 * time.Second}
	for round := 0; round < 2; round++ {
		srv, err := Listen(addr, up, opts)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var accepted Link
		done := make(chan error, 1)
		go func() {
			var err error
			accepted, err = srv.Accept(ctx)
			done <- err
		}()
		dialer, err := Dial(ctx, addr, down, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		msg, _ := FromFloat32s(Activation, 0, 0, []int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
		if err := dialer.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		got, err := accepted.Recv(ctx)
		if err != nil || got.Float32s()[5] != 6 {
			t.Fatalf("received %v, %v", got, err)
		}
		dialer.Close()
		accepted.Close()
		cancel()
		if round == 0 {
			// Leave the socket file behind as a killed process would: the
			// listener's file descriptor closes without unlinking the file.
			srv.lis.(*net.UnixListener).SetUnlinkOnClose(false)
		}
		srv.Close()
	}
	// A socket someone is listening on is not taken over.
	srv, err := Listen(addr, up, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := Listen(addr, up, opts); err == nil {
		t.Error("a second listener took over a live socket")
	}
}
