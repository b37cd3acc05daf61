package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// checkLeaks fails the test if goroutines started during it are still
// running shortly after it (and its cleanups) end. Call it first, so its
// cleanup runs last.
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		const tolerance = 2
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before+tolerance {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutines: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// hellos returns matching hellos for stages 1 (dialer) and 2 (listener) of a
// plain pipeline (one chunk of the given shape).
func hellos(shape ...int) (up, down Hello) {
	return chunkHellos([][]int{shape})
}

// chunkHellos is hellos with one activation shape per model chunk.
func chunkHellos(shapes [][]int) (up, down Hello) {
	up = Hello{Stage: 1, Stages: 4, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7101", DType: Float32, Shapes: shapes}
	down = up.clone()
	down.Stage = 2
	down.Address = ""
	return up, down
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// connect starts a server for down and dials it as up. The links and the
// server are closed at cleanup.
func connect(t *testing.T, up, down Hello, opts Options) (srv *Server, upLink, downLink Link) {
	t.Helper()
	srv, err := Listen("127.0.0.1:0", down, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	upLink, downLink = join(t, acceptAsync(t, srv, 10*time.Second), srv.Addr(), up, opts)
	return srv, upLink, downLink
}

// join dials addr as up and takes the listener's side of that connection from
// accepted; both links close at cleanup.
func join(t *testing.T, accepted <-chan acceptResultT, addr string, up Hello, opts Options) (upLink, downLink Link) {
	t.Helper()
	upLink, err := Dial(ctxT(t, 10*time.Second), addr, up, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upLink.Close() })
	r := <-accepted
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	return upLink, r.l
}

// pattern makes a chunk-0 tensor whose bytes depend on kind, step and
// micro-batch.
// rawStream opens the link service's stream on srv by hand, with no hello and
// no token, as a stranger or an old peer would; it closes with the test.
func rawStream(t *testing.T, srv *Server) grpc.ClientStream {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+srv.Addr(), dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cs, err := conn.NewStream(ctxT(t, 10*time.Second), &streamDesc, fullMethod)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func pattern(kind Kind, step int64, mb int32, shape []int) *Tensor {
	return chunkPattern(kind, step, mb, 0, shape)
}

// chunkPattern is pattern for a given chunk; the bytes depend on it too.
func chunkPattern(kind Kind, step int64, mb, chunk int32, shape []int) *Tensor {
	n := 4
	for _, d := range shape {
		n *= d
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(int64(i)*31 + step*7 + int64(mb)*3 + int64(kind) + int64(chunk)*11)
	}
	return &Tensor{Kind: kind, Step: step, MicroBatch: mb, Chunk: chunk, DType: Float32, Shape: shape, Data: data}
}

func sameTensor(a, b *Tensor) error {
	if a.Kind != b.Kind || a.Step != b.Step || a.MicroBatch != b.MicroBatch || a.Chunk != b.Chunk || a.DType != b.DType ||
		fmt.Sprint(a.Shape) != fmt.Sprint(b.Shape) || !bytes.Equal(a.Data, b.Data) {
		return fmt.Errorf("got %v step %d mb %d chunk %d %v %s (%d bytes), want %v step %d mb %d chunk %d %v %s (%d bytes)",
			b.Kind, b.Step, b.MicroBatch, b.Chunk, b.Shape, b.DType, len(b.Data), a.Kind, a.Step, a.MicroBatch, a.Chunk, a.Shape, a.DType, len(a.Data))
	}
	return nil
}

// exchange sends n activations up->down and n gradients down->up
// concurrently and checks that all arrive in order and intact. Message i
// belongs to chunk i%len(shapes), of shape shapes[chunk].
func exchange(t *testing.T, up, down Link, n int, shapes ...[]int) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	send := func(l Link, kind Kind) {
		defer wg.Done()
		for i := range n {
			c := i % len(shapes)
			if err := l.Send(ctx, chunkPattern(kind, int64(i), int32(i%8), int32(c), shapes[c])); err != nil {
				errs <- fmt.Errorf("send %s %d: %w", kind, i, err)
				return
			}
		}
	}
	recv := func(l Link, kind Kind) {
		defer wg.Done()
		for i := range n {
			got, err := l.Recv(ctx)
			if err != nil {
				errs <- fmt.Errorf("recv %s %d: %w", kind, i, err)
				return
			}
			c := i % len(shapes)
			if err := sameTensor(chunkPattern(kind, int64(i), int32(i%8), int32(c), shapes[c]), got); err != nil {
				errs <- fmt.Errorf("%s %d: %w", kind, i, err)
				return
			}
		}
	}
	wg.Add(4)
	go send(up, Activation)
	go send(down, Gradient)
	go recv(down, Activation)
	go recv(up, Gradient)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestExchangeOverGRPC(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(8, 16)
	_, ul, dl := connect(t, up, down, Options{})
	if p := dl.Peer(); p.Stage != 1 || p.Address != up.Address {
		t.Errorf("listener's peer = %+v", p)
	}
	if p := ul.Peer(); p.Stage != 2 || !strings.HasPrefix(p.Address, "127.0.0.1:") {
		t.Errorf("dialer's peer = %+v", p)
	}
	exchange(t, ul, dl, 100, []int{8, 16})
}

func TestSecondDialerRefused(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	srv, _, _ := connect(t, up, down, Options{})
	_, err := Dial(ctxT(t, 5*time.Second), srv.Addr(), up, Options{})
	var he *HandshakeError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "an upstream neighbour is already connected") {
		t.Errorf("got %v", err)
	}
	srv.Close()
	if _, err := srv.Accept(context.Background()); err == nil || err.Error() != "stage 2: server closed" {
		t.Errorf("Accept after Close: %v", err)
	}
}

func TestLargeTensor(t *testing.T) {
	checkLeaks(t)
	shape := []int{4096, 1024} // 16 MiB of float32
	up, down := hellos(shape...)
	_, ul, dl := connect(t, up, down, Options{})
	exchange(t, ul, dl, 2, shape)
}

func TestHandshakeMismatch(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(up *Hello)
		want   string
	}{
		{"digest", func(h *Hello) { h.ConfigDigest = "9b01de" }, "config digest 9b01de differs from 3fa2c1"},
		{"shape", func(h *Hello) { h.Shapes = [][]int{{64, 256}, {32, 128}} }, "chunk 0 activation shape [64 256] float32 differs from [64 128] float32"},
		{"shape of chunk 1", func(h *Hello) { h.Shapes = [][]int{{64, 128}, {32, 256}} }, "chunk 1 activation shape [32 256] float32 differs from [32 128] float32"},
		{"chunk count", func(h *Hello) { h.Shapes = [][]int{{64, 128}} }, "chunk count 1 differs from 2 (activation shapes [[64 128]] vs [[64 128] [32 128]])"},
		{"dtype", func(h *Hello) { h.DType = Float64 }, "chunk 0 activation shape [64 128] float64 differs from [64 128] float32"},
		{"stage count", func(h *Hello) { h.Stages = 5 }, "stage count 5 differs from 4"},
		{"ring", func(h *Hello) { h.Ring = true }, "ring true differs from false (whether stage 3 also dials stage 0 for an interleaved schedule)"},
		{"non-adjacent", func(h *Hello) { h.Stage = 0 }, "only upstream neighbour stage 1 may connect"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkLeaks(t)
			up, down := chunkHellos([][]int{{64, 128}, {32, 128}})
			c.mutate(&up)
			opts := Options{ConnectTimeout: 5 * time.Second}
			srv, err := Listen("127.0.0.1:0", down, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			_, dialErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, opts)
			_, acceptErr := srv.Accept(ctxT(t, 10*time.Second))
			names := fmt.Sprintf("stage 2 (%s) refused stage %d (%s): ", srv.Addr(), up.Stage, up.Address)
			for side, err := range map[string]error{"Dial": dialErr, "Accept": acceptErr} {
				var he *HandshakeError
				if !errors.As(err, &he) || !strings.Contains(err.Error(), names+c.want) {
					t.Errorf("%s: got %v, want a HandshakeError with %q", side, err, names+c.want)
				}
			}
		})
	}
}

func TestDialerRefusesWrongListener(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	down.Stage = 3 // the dialer expects stage 2; the listener refuses first
	srv, err := Listen("127.0.0.1:0", down, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = Dial(ctxT(t, 10*time.Second), srv.Addr(), up, Options{})
	if err == nil || !strings.Contains(err.Error(), "only upstream neighbour stage 2 may connect") {
		t.Errorf("got %v", err)
	}
	// The dialer's own check, as it would run on a listener's reply.
	err = CheckPeer(up, down, true)
	if err == nil || err.Error() != "stage 1 (127.0.0.1:7101) refused stage 3: expected downstream neighbour stage 2" {
		t.Errorf("CheckPeer = %v", err)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestDialUnreachable(t *testing.T) {
	checkLeaks(t)
	up, _ := hellos(2)
	addr := freeAddr(t)
	start := time.Now()
	_, err := Dial(context.Background(), addr, up, Options{ConnectTimeout: 300 * time.Millisecond})
	elapsed := time.Since(start)
	want := fmt.Sprintf("stage 1: downstream stage 2 at %s not reachable within 300ms: ", addr)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want prefix %q", err, want)
	}
	if elapsed < 250*time.Millisecond || elapsed > 5*time.Second {
		t.Errorf("Dial took %v", elapsed)
	}
	t.Log(err)

	// ctx is honoured too.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := Dial(ctx, addr, up, Options{}); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("Dial with a cancelled ctx: %v after %v", err, time.Since(start))
	}
}

func TestDialWaitsForLateListener(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	addr := freeAddr(t)
	type res struct {
		l   Link
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		l, err := Dial(context.Background(), addr, up, Options{ConnectTimeout: 10 * time.Second})
		dialed <- res{l, err}
	}()
	time.Sleep(300 * time.Millisecond)
	srv, err := Listen(addr, down, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dl, err := srv.Accept(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	r := <-dialed
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Close()
	exchange(t, r.l, dl, 3, []int{2})
}

func TestAcceptTimeout(t *testing.T) {
	checkLeaks(t)
	_, down := hellos(2)
	srv, err := Listen("127.0.0.1:0", down, Options{ConnectTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	start := time.Now()
	_, err = srv.Accept(context.Background())
	want := fmt.Sprintf("stage 2: upstream stage 1 did not connect to %s within 200ms", srv.Addr())
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Accept took %v", d)
	}
}

func TestListenAddressTaken(t *testing.T) {
	checkLeaks(t)
	_, down := hellos(2)
	srv, err := Listen("127.0.0.1:0", down, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, err = Listen(srv.Addr(), down, Options{})
	if err == nil || !strings.Contains(err.Error(), "stage 2: cannot listen on "+srv.Addr()) {
		t.Errorf("got %v", err)
	}
	t.Log(err)
}

func TestPeerCloses(t *testing.T) {
	t.Run("dialer closes", func(t *testing.T) {
		checkLeaks(t)
		up, down := hellos(2)
		_, ul, dl := connect(t, up, down, Options{})
		if err := ul.Send(ctxT(t, 5*time.Second), pattern(Activation, 0, 0, []int{2})); err != nil {
			t.Fatal(err)
		}
		if err := ul.Close(); err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t, 5*time.Second)
		if _, err := dl.Recv(ctx); err != nil { // sent before Close: delivered
			t.Fatal(err)
		}
		_, err := dl.Recv(ctx)
		if !errors.Is(err, io.EOF) || !strings.HasPrefix(err.Error(), "stage 1 (127.0.0.1:7101): stream closed: ") {
			t.Errorf("got %v", err)
		}
		if err := dl.Send(ctx, pattern(Gradient, 0, 0, []int{2})); err == nil {
			t.Error("Send after the peer closed succeeded")
		}
		if _, err := ul.Recv(ctx); !errors.Is(err, ErrClosed) {
			t.Errorf("Recv after Close: %v", err)
		}
	})
	t.Run("listener closes", func(t *testing.T) {
		checkLeaks(t)
		up, down := hellos(2)
		srv, ul, dl := connect(t, up, down, Options{})
		if err := dl.Send(ctxT(t, 5*time.Second), pattern(Gradient, 0, 0, []int{2})); err != nil {
			t.Fatal(err)
		}
		dl.Close()
		ctx := ctxT(t, 5*time.Second)
		if _, err := ul.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		_, err := ul.Recv(ctx)
		want := fmt.Sprintf("stage 2 (%s): stream closed: ", srv.Addr())
		if !errors.Is(err, io.EOF) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
	})
	t.Run("server stops", func(t *testing.T) {
		checkLeaks(t)
		up, down := hellos(2)
		srv, ul, _ := connect(t, up, down, Options{})
		srv.Close()
		_, err := ul.Recv(ctxT(t, 5*time.Second))
		want := fmt.Sprintf("stage 2 (%s): stream closed: ", srv.Addr())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
		t.Log(err)
	})
}

// TestPeerProcessDies runs the dialer in a child process and kills it: the
// listener's Recv must fail promptly.
func TestPeerProcessDies(t *testing.T) {
	if addr := os.Getenv("TRANSPORT_HELPER_DIAL"); addr != "" {
		up, _ := hellos(2)
		l, err := Dial(context.Background(), addr, up, Options{ConnectTimeout: 10 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		l.Send(context.Background(), pattern(Activation, 0, 0, []int{2}))
		time.Sleep(time.Minute) // killed by the parent
		os.Exit(0)
	}
	checkLeaks(t)
	_, down := hellos(2)
	srv, err := Listen("127.0.0.1:0", down, Options{ConnectTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerProcessDies$")
	cmd.Env = append(os.Environ(), "TRANSPORT_HELPER_DIAL="+srv.Addr())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	dl, err := srv.Accept(ctxT(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	ctx := ctxT(t, 20*time.Second)
	if _, err := dl.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	start := time.Now()
	_, err = dl.Recv(ctxT(t, 5*time.Second))
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "stage 1 (127.0.0.1:7101): stream closed: ") {
		t.Fatalf("got %v", err)
	}
	t.Logf("Recv failed %v after the kill: %v", time.Since(start), err)
}

func TestSendChecks(t *testing.T) {
	up, down := hellos(2, 3)
	a, b := Pipe(up, down, 1)
	defer a.Close()
	defer b.Close()
	ctx := ctxT(t, 5*time.Second)
	for _, c := range []struct {
		l    Link
		t    *Tensor
		want string
	}{
		{a, pattern(Gradient, 0, 0, []int{2, 3}), "stage 1 sends activation tensors on this link, not gradient"},
		{b, pattern(Activation, 0, 0, []int{2, 3}), "stage 2 sends gradient tensors on this link, not activation"},
		{a, pattern(Activation, 0, 0, []int{3, 2}), "send to stage 2: chunk 0 tensor shape [3 2] float32 does not match the link's [2 3] float32"},
		{a, &Tensor{Kind: Activation, DType: Float32, Shape: []int{2, 3}, Data: make([]byte, 4)}, "payload is 4 bytes, shape [2 3] float32 needs 24"},
		{a, chunkPattern(Activation, 0, 0, 1, []int{2, 3}), "send to stage 2: chunk 1 is out of range: the link carries 1 chunk(s), 0..0"},
		{b, chunkPattern(Gradient, 0, 0, -1, []int{2, 3}), "send to stage 1 (127.0.0.1:7101): chunk -1 is out of range: the link carries 1 chunk(s), 0..0"},
	} {
		if err := c.l.Send(ctx, c.t); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}

	// Per-chunk shapes: each chunk's tensors are checked against its own
	// shape, in both directions.
	up, down = chunkHellos([][]int{{2, 3}, {4}})
	a, b = Pipe(up, down, 4)
	defer a.Close()
	defer b.Close()
	for _, c := range []struct {
		l    Link
		t    *Tensor
		want string // "" for accepted
	}{
		{a, chunkPattern(Activation, 0, 0, 0, []int{2, 3}), ""},
		{a, chunkPattern(Activation, 0, 0, 1, []int{4}), ""},
		{b, chunkPattern(Gradient, 0, 0, 1, []int{4}), ""},
		{a, chunkPattern(Activation, 0, 0, 1, []int{2, 3}), "chunk 1 tensor shape [2 3] float32 does not match the link's [4] float32"},
		{b, chunkPattern(Gradient, 0, 0, 0, []int{4}), "chunk 0 tensor shape [4] float32 does not match the link's [2 3] float32"},
		{a, chunkPattern(Activation, 0, 0, 2, []int{4}), "chunk 2 is out of range: the link carries 2 chunk(s), 0..1"},
	} {
		err := c.l.Send(ctx, c.t)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("chunk %d %v: got %v, want %q", c.t.Chunk, c.t.Shape, err, c.want)
		}
	}
}

func TestPipe(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(4)
	a, b := Pipe(up, down, 2)
	if a.Peer().Stage != 2 || b.Peer().Stage != 1 {
		t.Errorf("peers: %+v %+v", a.Peer(), b.Peer())
	}
	exchange(t, a, b, 50, []int{4})

	ctx := ctxT(t, 5*time.Second)
	sent := pattern(Activation, 9, 0, []int{4})
	if err := a.Send(ctx, sent); err != nil {
		t.Fatal(err)
	}
	sent.Data[0]++ // the receiver must have its own copy
	a.Close()
	got, err := b.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameTensor(pattern(Activation, 9, 0, []int{4}), got); err != nil {
		t.Error(err)
	}
	if _, err := b.Recv(ctx); !errors.Is(err, io.EOF) || !strings.HasPrefix(err.Error(), "stage 1 (127.0.0.1:7101): stream closed: ") {
		t.Errorf("Recv after peer Close: %v", err)
	}
	if _, err := a.Recv(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	b.Close()
	b.Close() // idempotent
}

// fillUntilBlocked sends to a peer that never receives until a Send blocks
// past a short timeout, returning how many went through.
func fillUntilBlocked(t *testing.T, l Link, shape []int) int {
	t.Helper()
	for i := range 1000 {
		err := sendWithin(l, i, shape, 300*time.Millisecond)
		if errors.Is(err, context.DeadlineExceeded) {
			// A busy machine may stall the writer for a moment: blocked means
			// still blocked a second later.
			err = sendWithin(l, i, shape, time.Second)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return i
		}
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	t.Fatal("Send never blocked")
	return 0
}

func sendWithin(l Link, i int, shape []int, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return l.Send(ctx, pattern(Activation, int64(i), 0, shape))
}

// TestBackpressure fills links whose receiver never reads until Send
// blocks. Over a pipe the sends that fit are exactly the queue depth. Over
// gRPC they are the sending queue (queue_depth), what the writer and gRPC's
// flow-control window hold, and the receiving queue (queue_depth), which
// frees window only once gRPC sends a window update (after a quarter of the
// window is read): each queue slot more lets one or two sends more through,
// never none. A blocked Send honours cancellation.
func TestBackpressure(t *testing.T) {
	cancelled := func(t *testing.T, l Link, shape []int) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		if err := l.Send(ctx, pattern(Activation, 0, 0, shape)); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Send: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("cancelled Send took %v", d)
		}
	}
	t.Run("pipe", func(t *testing.T) {
		for _, depth := range []int{1, 3} {
			up, down := hellos(2)
			a, b := Pipe(up, down, depth)
			if n := fillUntilBlocked(t, a, []int{2}); n != depth {
				t.Errorf("queue depth %d: %d sends before blocking, want %d", depth, n, depth)
			}
			cancelled(t, a, []int{2})
			a.Close()
			b.Close()
		}
	})
	t.Run("grpc", func(t *testing.T) {
		checkLeaks(t)
		shape := []int{256, 1024} // 1 MiB, so gRPC's 64 MiB windows fill quickly
		depths := []int{1, 4}
		sends := make([]int, len(depths))
		for i, depth := range depths {
			up, down := hellos(shape...)
			opts := Options{QueueDepth: depth, CloseTimeout: 200 * time.Millisecond}
			srv, ul, dl := connect(t, up, down, opts)
			sends[i] = fillUntilBlocked(t, ul, shape)
			t.Logf("queue depth %d: %d sends of %v float32 before blocking", depth, sends[i], shape)
			if sends[i] < depth {
				t.Errorf("queue depth %d: Send blocked after %d sends, before its queue was full", depth, sends[i])
			}
			cancelled(t, ul, shape)
			// The receiver closes first; the sender's Close then gives up on its
			// queue quickly instead of waiting for a reader that never comes.
			dl.Close()
			done := make(chan struct{})
			go func() { ul.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Close of a blocked link hangs")
			}
			srv.Close()
		}
		if d, slots := sends[1]-sends[0], depths[1]-depths[0]; d < slots || d > 2*slots {
			t.Errorf("queue depth %d lets %d sends through, depth %d %d: %d more, want %d to %d", depths[1], sends[1], depths[0], sends[0], d, slots, 2*slots)
		}
	})
}

func TestCloseFlushesQueue(t *testing.T) {
	checkLeaks(t)
	shape := []int{64, 1024}
	up, down := hellos(shape...)
	_, ul, dl := connect(t, up, down, Options{QueueDepth: 8})
	ctx := ctxT(t, 10*time.Second)
	for i := range 8 {
		if err := ul.Send(ctx, pattern(Activation, int64(i), 0, shape)); err != nil {
			t.Fatal(err)
		}
	}
	go ul.Close() // must deliver all 8 before ending the stream
	for i := range 8 {
		got, err := dl.Recv(ctx)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if err := sameTensor(pattern(Activation, int64(i), 0, shape), got); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dl.Recv(ctx); !errors.Is(err, io.EOF) {
		t.Errorf("after the flush: %v", err)
	}
}

func BenchmarkStream4MiB(b *testing.B) {
	shape := []int{1024, 1024}
	up, down := hellos(shape...)
	srv, err := Listen("127.0.0.1:0", down, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	go func() {
		if l, err := Dial(context.Background(), srv.Addr(), up, Options{}); err == nil {
			ctx := context.Background()
			t := pattern(Activation, 0, 0, shape) // never modified, so it may be sent repeatedly
			for l.Send(ctx, t) == nil {
			}
			l.Close()
		}
	}()
	dl, err := srv.Accept(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer dl.Close()
	ctx := context.Background()
	if _, err := dl.Recv(ctx); err != nil { // warm up
		b.Fatal(err)
	}
	b.SetBytes(4 << 20)
	b.ResetTimer()
	for range b.N {
		t, err := dl.Recv(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t.Release()
	}
}

// TestChunksOverGRPC sends the tensors of two chunks of different shapes
// both ways over one link, interleaved.
func TestChunksOverGRPC(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{8, 16}, {4, 32, 2}}
	up, down := chunkHellos(shapes)
	_, ul, dl := connect(t, up, down, Options{})
	for side, l := range map[string]Link{"dialer": ul, "listener": dl} {
		p := l.Peer()
		if fmt.Sprint(p.Shapes) != fmt.Sprint(shapes) {
			t.Errorf("%s's peer shapes = %v", side, p.Shapes)
		}
		p.Shapes[1][0] = 99 // a copy: the link is unaffected
		if l.Peer().Shapes[1][0] != 4 {
			t.Errorf("%s: Peer shares Shapes with the link", side)
		}
	}
	exchange(t, ul, dl, 40, shapes...)
	// A chunk outside the handshake's list is refused at Send, both ways.
	ctx := ctxT(t, 5*time.Second)
	if err := ul.Send(ctx, chunkPattern(Activation, 0, 0, 2, []int{8, 16})); err == nil ||
		!strings.Contains(err.Error(), ": chunk 2 is out of range: the link carries 2 chunk(s), 0..1") {
		t.Errorf("dialer sending chunk 2: %v", err)
	}
	if err := dl.Send(ctx, chunkPattern(Gradient, 0, 0, 1, []int{8, 16})); err == nil ||
		!strings.Contains(err.Error(), "chunk 1 tensor shape [8 16] float32 does not match the link's [4 32 2] float32") {
		t.Errorf("listener sending chunk 1 with chunk 0's shape: %v", err)
	}
}

// ringHellos returns the hellos of the ring link of a 4-stage run: stage 3
// dials stage 0.
func ringHellos(shapes [][]int) (up, down Hello) {
	up = Hello{Stage: 3, Stages: 4, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7103", DType: Float32, Shapes: shapes, Ring: true}
	down = up.clone()
	down.Stage = 0
	down.Address = ""
	return up, down
}

func TestRingLink(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{8, 16}, {8, 32}}
	up, down := ringHellos(shapes)
	srv, ul, dl := connect(t, up, down, Options{})
	if p := dl.Peer(); p.Stage != 3 || !p.Ring {
		t.Errorf("stage 0's peer = %+v", p)
	}
	if p := ul.Peer(); p.Stage != 0 || !p.Ring || p.Address != srv.Addr() {
		t.Errorf("stage 3's peer = %+v", p)
	}
	exchange(t, ul, dl, 20, shapes...)
}

func TestRingRefusals(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{2}, {3}}
	up, down := ringHellos(shapes)
	opts := Options{ConnectTimeout: 5 * time.Second}

	// Without Ring, stage 3 -> stage 0 is not a link: neither side may
	// start it, and the handshake check refuses it as non-adjacent.
	noUp, noDown := up.clone(), down.clone()
	noUp.Ring, noDown.Ring = false, false
	if _, err := Listen("127.0.0.1:0", noDown, opts); err == nil || err.Error() != "stage 0 has no upstream neighbour to listen for (Ring is false)" {
		t.Errorf("Listen on stage 0 without Ring: %v", err)
	}
	if _, err := Dial(ctxT(t, 5*time.Second), freeAddr(t), noUp, opts); err == nil ||
		err.Error() != "stage 3 is the last stage: it has no downstream neighbour to dial (Ring is false)" {
		t.Errorf("Dial from stage 3 without Ring: %v", err)
	}
	var he *HandshakeError
	err := CheckPeer(noDown, noUp, false)
	if !errors.As(err, &he) || err.Error() != "stage 0 refused stage 3 (127.0.0.1:7103): no upstream neighbour may connect to stage 0 without the ring link" {
		t.Errorf("listener's CheckPeer without Ring: %v", err)
	}
	err = CheckPeer(noUp, noDown, true)
	if !errors.As(err, &he) || err.Error() != "stage 3 (127.0.0.1:7103) refused stage 0: stage 3 is the last stage and has no downstream neighbour without the ring link" {
		t.Errorf("dialer's CheckPeer without Ring: %v", err)
	}
	// With Ring, the link is accepted by the check...
	if err := CheckPeer(down, up, false); err != nil {
		t.Errorf("listener's CheckPeer with Ring: %v", err)
	}
	if err := CheckPeer(up, down, true); err != nil {
		t.Errorf("dialer's CheckPeer with Ring: %v", err)
	}
	// ...and so are the plain links of a ring run (2 -> 3, and 0 -> 1 where
	// stage 1 of 2 also dials stage 0).
	s2, s3 := up.clone(), up.clone()
	s2.Stage = 2
	if err := CheckPeer(s3, s2, false); err != nil {
		t.Errorf("2 -> 3 with Ring: %v", err)
	}
	two0, two1 := down.clone(), up.clone()
	two0.Stages, two1.Stages, two1.Stage = 2, 2, 1
	for _, c := range [][2]Hello{{two0, two1}, {two1, two0}} { // (dialer, listener)
		if err := CheckPeer(c[1], c[0], false); err != nil {
			t.Errorf("2 stages with Ring, %d -> %d: %v", c[0].Stage, c[1].Stage, err)
		}
		if err := CheckPeer(c[0], c[1], true); err != nil {
			t.Errorf("2 stages with Ring, %d -> %d: %v", c[0].Stage, c[1].Stage, err)
		}
	}
	// Ring disagreement is refused naming both stages.
	err = CheckPeer(down, noUp, false)
	if !errors.As(err, &he) || err.Error() != "stage 0 refused stage 3 (127.0.0.1:7103): ring false differs from true (whether stage 3 also dials stage 0 for an interleaved schedule)" {
		t.Errorf("ring disagreement: %v", err)
	}
	// A single stage has no links, ring or not.
	single := Hello{Stage: 0, Stages: 1, DType: Float32, Shapes: shapes, Ring: true}
	if _, err := Listen("127.0.0.1:0", single, opts); err == nil || !strings.Contains(err.Error(), "at least 2 stages") {
		t.Errorf("Listen with 1 stage: %v", err)
	}
	if _, err := Dial(ctxT(t, 5*time.Second), freeAddr(t), single, opts); err == nil || !strings.Contains(err.Error(), "at least 2 stages") {
		t.Errorf("Dial with 1 stage: %v", err)
	}

	// Over gRPC, with Ring: only the last stage may dial stage 0.
	srv, err := Listen("127.0.0.1:0", down, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	wrong := up.clone()
	wrong.Stage, wrong.Address = 2, "127.0.0.1:7102" // stage 2's downstream is 3; dialing stage 0's address is a mistake
	_, dialErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), wrong, opts)
	_, acceptErr := srv.Accept(ctxT(t, 10*time.Second))
	want := fmt.Sprintf("stage 0 (%s) refused stage 2 (127.0.0.1:7102): only upstream neighbour stage 3 may connect", srv.Addr())
	for side, err := range map[string]error{"Dial": dialErr, "Accept": acceptErr} {
		if !errors.As(err, &he) || err.Error() != want {
			t.Errorf("%s: got %v, want %q", side, err, want)
		}
	}
	// Stage 0 waits for stage 3, and says so.
	srv2, err := Listen("127.0.0.1:0", down, Options{ConnectTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if _, err := srv2.Accept(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "stage 0: upstream stage 3 did not connect to ") {
		t.Errorf("Accept timeout on stage 0: %v", err)
	}
}

// TestRingDisagreementOverGRPC: a dialer that uses the ring and a listener
// that does not are refused on both sides.
func TestRingDisagreementOverGRPC(t *testing.T) {
	checkLeaks(t)
	up, down := ringHellos([][]int{{2}, {3}})
	up.Stage, up.Address, down.Stage = 1, "127.0.0.1:7101", 2
	down.Ring = false
	opts := Options{ConnectTimeout: 5 * time.Second}
	srv, err := Listen("127.0.0.1:0", down, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, dialErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, opts)
	_, acceptErr := srv.Accept(ctxT(t, 10*time.Second))
	want := fmt.Sprintf("stage 2 (%s) refused stage 1 (127.0.0.1:7101): ring true differs from false", srv.Addr())
	for side, err := range map[string]error{"Dial": dialErr, "Accept": acceptErr} {
		var he *HandshakeError
		if !errors.As(err, &he) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: got %v, want a HandshakeError starting %q", side, err, want)
		}
	}
}

// oldHandshake is what a build before per-chunk shapes sent: "PTH\x00" and
// JSON.
const oldHandshake = "PTH\x00" + `{"hello":{"Stage":1,"Stages":4,"ConfigDigest":"3fa2c1","Address":"127.0.0.1:7101","DType":1,"Shape":[2]}}`

// v1Handshake is what a build before data parallelism sent as stage 1's
// hello: version 1, without group, replica and replicas.
const v1Handshake = "PTH\x01\x00\x01\x01\x00\x00\x00\x04\x00\x00\x00\x06\x00\x00\x003fa2c1\x0e\x00\x00\x00127.0.0.1:7101" +
	"\x00\x00\x00\x00\x01\x00\x00\x00\x01\x02\x00\x00\x00\x00\x00\x00\x00"

// oldListener answers every stream as an old build's listener would, with
// reply as its hello.
type oldListener struct{ reply string }

func (o oldListener) serveLink(stream grpc.ServerStream) error {
	var b []byte
	if err := stream.RecvMsg(&b); err != nil {
		return err
	}
	return stream.SendMsg(frame{[]byte(o.reply)})
}

// TestOldPeerRefused: a peer speaking a previous handshake version is
// refused with a clear message, in both roles.
func TestOldPeerRefused(t *testing.T) {
	checkLeaks(t)
	up, down := hellos(2)
	t.Run("version 1 dialer", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", down, Options{ConnectTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		cs := rawStream(t, srv)
		if err := cs.SendMsg(frame{[]byte(v1Handshake)}); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		const want = "protocol error: unsupported handshake version 1 (this build speaks version 2): the peer runs an incompatible pipetrain build"
		if err := cs.RecvMsg(&reply); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("version 1 dialer got %v", err)
		}
		if _, err := srv.Accept(ctxT(t, 10*time.Second)); err == nil || err.Error() != "stage 2: from a dialer: "+want {
			t.Errorf("Accept: %v", err)
		}
	})
	t.Run("version 1 listener", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(serverOptions()...)
		gs.RegisterService(&serviceDesc, oldListener{strings.Replace(v1Handshake, "\x01\x00\x00\x00\x04", "\x02\x00\x00\x00\x04", 1)})
		go gs.Serve(lis)
		defer gs.Stop()
		_, err = Dial(ctxT(t, 10*time.Second), lis.Addr().String(), up, Options{ConnectTimeout: 5 * time.Second})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s: protocol error: unsupported handshake version 1 (this build speaks version 2)", lis.Addr())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
	})
	t.Run("old dialer", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", down, Options{ConnectTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		cs := rawStream(t, srv)
		ctx := ctxT(t, 10*time.Second)
		if err := cs.SendMsg(frame{[]byte(oldHandshake)}); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		const want = "protocol error: unsupported handshake version 0 (this build speaks version 2): the peer runs an incompatible pipetrain build"
		// What the old dialer prints: the listener's reason, in the status.
		if err := cs.RecvMsg(&reply); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("old dialer got %v", err)
		}
		if _, err := srv.Accept(ctx); err == nil || err.Error() != "stage 2: from a dialer: "+want {
			t.Errorf("Accept: %v", err)
		}
	})
	t.Run("old listener", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(serverOptions()...)
		gs.RegisterService(&serviceDesc, oldListener{strings.Replace(oldHandshake, `"Stage":1`, `"Stage":2`, 1)})
		go gs.Serve(lis)
		defer gs.Stop()
		_, err = Dial(ctxT(t, 10*time.Second), lis.Addr().String(), up, Options{ConnectTimeout: 5 * time.Second})
		want := fmt.Sprintf("stage 1: downstream stage 2 at %s: protocol error: unsupported handshake version 0", lis.Addr())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
	})
}

func TestPipeReportsQueues(t *testing.T) {
	up := Hello{Stage: 0, Stages: 2, ConfigDigest: "d", Address: "a", DType: Float32, Shapes: [][]int{{2}}}
	down := Hello{Stage: 1, Stages: 2, ConfigDigest: "d", Address: "b", DType: Float32, Shapes: [][]int{{2}}}
	a, b := Pipe(up, down, 4)
	defer a.Close()
	defer b.Close()
	tensor, err := FromFloat32s(Activation, 0, 0, []int{2}, []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := a.Send(context.Background(), tensor); err != nil {
			t.Fatal(err)
		}
	}
	if s, _ := a.(QueueReporter).Queues(); s != 3 {
		t.Errorf("sender queue %d, want 3", s)
	}
	if _, r := b.(QueueReporter).Queues(); r != 3 {
		t.Errorf("receiver queue %d, want 3", r)
	}
}

// TestRecvChecksAgainstHandshake: a tensor the handshake did not agree on
// (wrong shape, chunk or kind) is refused by Recv, naming the sender, on an
// in-memory pipe and on a gRPC stream alike, as Send refuses it going out.
func TestRecvChecksAgainstHandshake(t *testing.T) {
	up, down := hellos(2, 3)
	liar := up.clone()
	liar.Shapes = [][]int{{4}} // the sender believes in another shape
	a, b := Pipe(liar, down, 2)
	if err := a.Send(ctxT(t, time.Second), pattern(Activation, 0, 0, []int{4})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(ctxT(t, time.Second)); err == nil || !strings.Contains(err.Error(), "stage 1 (127.0.0.1:7101) sent activation [4] float32 for chunk 0; the handshake agreed [2 3] float32") {
		t.Errorf("pipe: %v", err)
	}

	_, ul, dl := connect(t, up, down, Options{})
	sl := ul.(*streamLink)
	for _, tc := range []struct {
		t    *Tensor
		want string
	}{
		{pattern(Activation, 0, 0, []int{3, 2}), "sent activation [3 2] float32 for chunk 0; the handshake agreed [2 3] float32"},
		{chunkPattern(Activation, 0, 0, 1, []int{2, 3}), "sent activation for chunk 1; this link carries chunks 0-0"},
		{pattern(Gradient, 0, 0, []int{2, 3}), "sent gradient tensors on a link that carries activation from it"},
	} {
		sl.sendQ <- tc.t // past Send's own check, as a faulty peer would send
		if _, err := dl.Recv(ctxT(t, 5*time.Second)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("stream: got %v, want %q", err, tc.want)
		}
	}
	exchange(t, ul, dl, 2, []int{2, 3}) // the link still carries what was agreed
}
