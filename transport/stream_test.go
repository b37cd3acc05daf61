package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ringLink is replica 1 of stage 0 listening with ring streams on addr, and
// replica 0's ring link to it; down is the listener's hello with its address.
type ringLink struct {
	srv      *Server
	up, down Hello
	link     Link // replica 0's dialed link
	accepted Link
	rec      *logRecorder
}

// newRingLink listens as replica 1 with opts (plus Streams) and joins
// replica 0's gRPC link to it, dialed with dialOpts.
func newRingLink(t *testing.T, addr string, opts, dialOpts Options) *ringLink {
	t.Helper()
	shapes := [][]int{{1000}, {24}}
	rl := &ringLink{rec: &logRecorder{}}
	up := gridHello(ReplicaGroup, 0, 1, 0, 2, shapes)
	down := gridHello(ReplicaGroup, 0, 1, 1, 2, shapes)
	down.Address = ""
	opts.Streams, opts.Logf = true, rl.rec.logf
	srv, err := Listen(addr, down, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	down.Address = srv.Addr()
	accepted := acceptAsyncGroup(t, srv, ReplicaGroup, 10*time.Second)
	link, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), up, dialOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() { res.l.Close() })
	rl.srv, rl.up, rl.down, rl.link, rl.accepted = srv, up, down, link, res.l
	return rl
}

func acceptAsyncGroup(t *testing.T, srv *Server, g Group, d time.Duration) <-chan acceptResultT {
	ch := make(chan acceptResultT, 1)
	go func() {
		l, err := srv.AcceptGroup(ctxT(t, d), g)
		ch <- acceptResultT{l, err}
	}()
	return ch
}

type acceptedStream struct {
	in  *StreamIn
	err error
}

func acceptStreamAsync(t *testing.T, srv *Server, d time.Duration) <-chan acceptedStream {
	ch := make(chan acceptedStream, 1)
	go func() {
		in, err := srv.AcceptStream(ctxT(t, d), ReplicaGroup)
		if in != nil {
			t.Cleanup(func() { in.Close() })
		}
		ch <- acceptedStream{in, err}
	}()
	return ch
}

// open dials the ring stream with opts and takes it on the listener.
func (rl *ringLink) open(t *testing.T, opts Options) (*StreamOut, *StreamIn) {
	t.Helper()
	accepted := acceptStreamAsync(t, rl.srv, 10*time.Second)
	out, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	return out, res.in
}

// sendAndCheck sends frames of float32s out and reads them on in, into
// fresh memory, checking every bit.
func sendAndCheck(t *testing.T, out *StreamOut, in *StreamIn, frames int) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	errs := make(chan error, 1)
	sent := make([][]float32, frames)
	for i := range sent {
		sent[i] = make([]float32, 1000)
		for j := range sent[i] {
			sent[i][j] = float32(i*1000+j) * 1.25
		}
	}
	go func() {
		for i, v := range sent {
			if err := out.Send(ctx, Frame{Step: int64(i), Phase: 1, Tag: 0, DType: Float32}, FloatBytes(v)); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	for i := range frames {
		got := make([]float32, 1000)
		err := in.Recv(ctx, Frame{Step: int64(i), Phase: 1, Tag: 0, DType: Float32, Len: 4000}, func(r io.Reader) error {
			_, err := io.ReadFull(r, FloatBytes(got))
			return err
		})
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		for j := range got {
			if math.Float32bits(got[j]) != math.Float32bits(sent[i][j]) {
				t.Fatalf("frame %d value %d: %v, sent %v", i, j, got[j], sent[i][j])
			}
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestRingStreamCarriesFrames: over TCP, a Unix socket address, the
// listener's stream socket, with a token and with mutual TLS, a ring stream
// opened beside the ring link delivers the frames sent on it, in order, bit
// for bit, on the socket it should use; the gRPC link beside it still
// works. The dialer (127.0.0.1:7000) is on the listener's host unless the
// listener is on 127.0.0.2.
func TestRingStreamCarriesFrames(t *testing.T) {
	checkLeaks(t)
	ca := newCA(t, "run CA")
	tcp := Options{StreamsOverTCP: true}
	for _, c := range []struct {
		name       string
		addr       string
		opts, dial Options
		network    string
	}{
		{"tcp", "127.0.0.1:0", Options{}, tcp, "tcp"},
		{"unix", "unix:" + filepath.Join(t.TempDir(), "r1.sock"), Options{}, Options{}, "unix"},
		{"token", "127.0.0.1:0", Options{Token: "s3cret"}, Options{Token: "s3cret", StreamsOverTCP: true}, "tcp"},
		{"tls", "127.0.0.1:0", Options{TLS: issue(t, ca, ca, "replica 1")}, Options{TLS: issue(t, ca, ca, "replica 0"), StreamsOverTCP: true}, "tcp"},
		{"unix with tls", "unix:" + filepath.Join(t.TempDir(), "r1t.sock"), Options{TLS: issue(t, ca, ca, "replica 1")}, Options{TLS: issue(t, ca, ca, "replica 0")}, "unix"},
		{"stream socket", "127.0.0.1:0", Options{}, Options{}, streamSocketNetwork()},
		{"stream socket with token", "127.0.0.1:0", Options{Token: "s3cret"}, Options{Token: "s3cret"}, streamSocketNetwork()},
		{"stream socket with tls", "127.0.0.1:0", Options{TLS: issue(t, ca, ca, "replica 1")}, Options{TLS: issue(t, ca, ca, "replica 0")}, streamSocketNetwork()},
		{"another host", "127.0.0.2:0", Options{}, Options{}, "tcp"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rl := newRingLink(t, c.addr, c.opts, c.dial)
			out, in := rl.open(t, c.dial)
			if p := in.Peer(); p.Replica != 0 || p.Address != rl.up.Address {
				t.Errorf("stream's dialer: %+v", p)
			}
			if out.Network() != c.network || in.Network() != c.network {
				t.Errorf("the stream runs on %s (dialer) and %s (listener), want %s", out.Network(), in.Network(), c.network)
			}
			sendAndCheck(t, out, in, 20)
			exchange(t, rl.link, rl.accepted, 3, []int{1000}, []int{24})
		})
	}
}

// TestRingStreamRefusesStrangers: a stream without the token is refused on
// its 32-byte proof, before the listener reads anything more (so before any
// tensor byte), and logged, not handed to AcceptStream; a dialer with the
// wrong token gets ErrUnauthenticated; a dialer with a certificate from
// another CA is refused; a stream from a process other than the link's
// peer is refused by name; the real neighbour then opens its stream.
func TestRingStreamRefusesStrangers(t *testing.T) {
	checkLeaks(t)
	rl := newRingLink(t, "127.0.0.1:0", Options{Token: "s3cret"}, Options{Token: "s3cret"})
	accepted := acceptStreamAsync(t, rl.srv, 20*time.Second)

	// A raw stranger: the preface, a wrong proof, then what would be a
	// hello and a frame. The answer must come after the proof alone.
	c, err := net.Dial("tcp", rl.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proof := tokenProof("guess")
	if _, err := c.Write(append([]byte(streamPreface), proof[:]...)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	refusal, err := readStreamAnswer(c)
	if err != nil || refusal != badTokenMsg {
		t.Fatalf("stranger's answer: %q, %v; want the token refusal", refusal, err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("the listener kept the stranger's connection open: %d, %v", n, err)
	}

	for _, token := range []string{"", "wrong"} {
		_, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{Token: token, StreamsOverTCP: true})
		if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "bad or missing token") {
			t.Errorf("token %q: %v, want ErrUnauthenticated", token, err)
		}
	}
	rl.rec.waitFor(t, 3, "refused a ring stream from 127.0.0.1:", "bad or missing token")

	// Not the link's peer: replica 0 of another stage, whose hello the
	// handshake would refuse too, and a replica 0 at another address.
	other := rl.up.clone()
	other.Address = "127.0.0.1:1"
	_, err = DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), other, rl.link.Peer(), Options{Token: "s3cret"})
	var refused *HandshakeError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "its replica ring link is with stage 0 replica 0 (127.0.0.1:7000)") {
		t.Errorf("stream from another process: %v", err)
	}
	select {
	case r := <-accepted:
		t.Fatalf("AcceptStream returned after refusals: %v, %v", r.in, r.err)
	default:
	}

	out, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	res := <-accepted
	if res.err != nil {
		t.Fatal(res.err)
	}
	sendAndCheck(t, out, res.in, 3)

	// A second stream from the peer is refused: one per link.
	_, err = DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{Token: "s3cret"})
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "a ring stream is already open") {
		t.Errorf("second stream: %v", err)
	}
}

// TestRingStreamTLSRefusesForeignCertificate: under mutual TLS a stream
// dialer whose certificate another CA signed is refused, with
// ErrUnauthenticated, and never reaches AcceptStream.
func TestRingStreamTLSRefusesForeignCertificate(t *testing.T) {
	checkLeaks(t)
	ca, other := newCA(t, "run CA"), newCA(t, "other CA")
	rl := newRingLink(t, "127.0.0.1:0", Options{TLS: issue(t, ca, ca, "replica 1")}, Options{TLS: issue(t, ca, ca, "replica 0")})
	accepted := acceptStreamAsync(t, rl.srv, 20*time.Second)
	_, err := DialStream(ctxT(t, 10*time.Second), rl.srv.Addr(), rl.up, rl.link.Peer(), Options{TLS: issue(t, other, ca, "replica 0")})
	if !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("foreign certificate: %v, want ErrUnauthenticated", err)
	}
	rl.rec.waitFor(t, 1, "refused a ring stream from", "TLS handshake failed")
	select {
	case r := <-accepted:
		t.Fatalf("AcceptStream returned a stranger: %v, %v", r.in, r.err)
	default:
	}
}

// TestRingStreamBeforeLinkRefused: a stream whose gRPC link has not passed
// its handshake is refused, naming the link, and so is one for a pipeline
// link.
func TestRingStreamBeforeLinkRefused(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{8}}
	up := gridHello(ReplicaGroup, 0, 1, 0, 2, shapes)
	down := gridHello(ReplicaGroup, 0, 1, 1, 2, shapes)
	down.Address = ""
	srv, err := Listen("127.0.0.1:0", down, Options{Streams: true, Logf: func(string, ...any) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	down.Address = srv.Addr()
	_, err = DialStream(ctxT(t, 10*time.Second), srv.Addr(), up, down, Options{})
	if err == nil || !strings.Contains(err.Error(), "its replica ring link is not connected") {
		t.Errorf("stream before its link: %v", err)
	}
	pipe := gridHello(PipelineGroup, 0, 2, 0, 2, shapes)
	_, err = DialStream(ctxT(t, 10*time.Second), srv.Addr(), pipe, down, Options{})
	if err == nil || !strings.Contains(err.Error(), "a ring stream for a pipeline link reached a listener that takes them for replica ring links only") {
		t.Errorf("stream of a pipeline link: %v", err)
	}
}

// TestRingStreamWrongFrameNamesPeer: a frame of another step, phase or
// tag, or of another length or dtype than expected, is refused before its
// payload is read, naming the sender; the stream is unusable afterwards.
func TestRingStreamWrongFrameNamesPeer(t *testing.T) {
	checkLeaks(t)
	rl := newRingLink(t, "127.0.0.1:0", Options{}, Options{})
	for _, c := range []struct {
		sent Frame
		want string
	}{
		{Frame{Step: 3, Phase: 1, Tag: 1, DType: Float32}, "sent step 3 phase 1 tag 1, expected step 3 phase 1 tag 0"},
		{Frame{Step: 4, Phase: 1, Tag: 0, DType: Float32}, "sent step 4 phase 1 tag 0, expected step 3 phase 1 tag 0"},
		{Frame{Step: 3, Phase: 0, Tag: 0, DType: Float32}, "sent step 3 phase 0 tag 0, expected step 3 phase 1 tag 0"},
		{Frame{Step: 3, Phase: 1, Tag: 0, DType: BFloat16}, "sent 8 bytes of bfloat16 for step 3 phase 1 tag 0, expected 16 bytes of float32"},
	} {
		t.Run(c.want, func(t *testing.T) {
			out, in := rl.open(t, Options{})
			payload := make([]byte, 16)
			if c.sent.DType == BFloat16 {
				payload = payload[:8]
			}
			if err := out.Send(ctxT(t, 5*time.Second), c.sent, payload); err != nil {
				t.Fatal(err)
			}
			read := false
			err := in.Recv(ctxT(t, 5*time.Second), Frame{Step: 3, Phase: 1, Tag: 0, DType: Float32, Len: 16}, func(io.Reader) error {
				read = true
				return nil
			})
			want := fmt.Sprintf("stage 0 replica 0 (%s) %s", rl.up.Address, c.want)
			if err == nil || err.Error() != want {
				t.Errorf("got %v, want %q", err, want)
			}
			if read {
				t.Error("the payload of a refused frame was read")
			}
			if again := in.Recv(ctxT(t, time.Second), Frame{}, nil); again == nil {
				t.Error("the stream was used again after a refused frame")
			}
			in.Close()
			out.Close()
			rl.srv.mu.Lock()
			rl.srv.role(ReplicaGroup).streamed = false // the next case's stream
			rl.srv.mu.Unlock()
		})
	}
}

// TestRingStreamTimeoutNamesPeer: a Recv whose context ends while the peer
// sends nothing fails with the context's cause and the peer's name.
func TestRingStreamTimeoutNamesPeer(t *testing.T) {
	checkLeaks(t)
	rl := newRingLink(t, "127.0.0.1:0", Options{}, Options{})
	_, in := rl.open(t, Options{})
	ctx, cancel := context.WithTimeoutCause(context.Background(), 100*time.Millisecond, errors.New("replica 0 sent nothing for 100ms"))
	defer cancel()
	err := in.Recv(ctx, Frame{DType: Float32, Len: 4}, func(io.Reader) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "ring stream from stage 0 replica 0") || !strings.Contains(err.Error(), "sent nothing for 100ms") {
		t.Errorf("got %v", err)
	}
}

// fakeConn is a net.Conn reading from bytes, for the decoder's fuzzing.
type fakeConn struct {
	net.Conn
	r io.Reader
}

func (c *fakeConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) Close() error                     { return nil }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzRingStreamFrame feeds arbitrary bytes to a ring stream's receiver,
// as a peer holding the token could send them, expecting one frame of
// step 7 phase 1 tag 2 of 16 float32s: it never panics, never reads a
// payload it refused, and accepts only the exact expected header, after
// which the payload read is the bytes that followed it. The stream hello's
// reader gets the same bytes and refuses anything over its limit unread.
func FuzzRingStreamFrame(f *testing.F) {
	want := Frame{Step: 7, Phase: 1, Tag: 2, DType: Float32, Len: 64}
	good := append(want.appendHeader(nil), make([]byte, 64)...)
	f.Add(good)
	f.Add(good[:FrameHeaderSize])
	f.Add(append(Frame{Step: 7, Phase: 1, Tag: 3, DType: Float32, Len: 64}.appendHeader(nil), make([]byte, 64)...))
	f.Add(Frame{Step: 7, Phase: 1, Tag: 2, DType: Float32, Len: math.MaxUint32}.appendHeader(nil))
	f.Add(Frame{Step: 7, Phase: 1, Tag: 2, DType: 99, Len: 64}.appendHeader(nil))
	hello := (&handshake{Hello: gridHello(ReplicaGroup, 0, 1, 0, 2, [][]int{{16}})}).marshal()
	f.Add(append(binary.LittleEndian.AppendUint32(nil, uint32(len(hello))), hello...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := &StreamIn{conn: &fakeConn{r: bytes.NewReader(b)}, peer: gridHello(ReplicaGroup, 0, 1, 0, 2, nil)}
		dst := make([]byte, want.Len)
		called := false
		err := in.Recv(context.Background(), want, func(r io.Reader) error {
			called = true
			_, err := io.ReadFull(r, dst)
			return err
		})
		if called && !bytes.Equal(b[:FrameHeaderSize], want.appendHeader(nil)) {
			t.Fatalf("read the payload of header %x", b[:FrameHeaderSize])
		}
		if err == nil && !bytes.Equal(dst, b[FrameHeaderSize:FrameHeaderSize+want.Len]) {
			t.Fatalf("payload %x, sent %x", dst, b[FrameHeaderSize:])
		}
		if err != nil && called && len(b) >= FrameHeaderSize+want.Len {
			t.Fatalf("a whole frame refused: %v", err)
		}
		const limit = 1 << 10
		hs, err := readStreamHello(&fakeConn{r: bytes.NewReader(b)}, limit)
		if err == nil {
			if n := binary.LittleEndian.Uint32(b); n > limit {
				t.Fatalf("a hello of %d bytes over the %d-byte limit was read", n, limit)
			}
			if again := hs.marshal(); !bytes.Equal(again, b[4:4+len(again)]) {
				t.Fatalf("hello re-encodes to %x, read from %x", again, b[4:])
			}
		}
	})
}
