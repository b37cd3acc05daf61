package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// replicaHellos returns the hellos of a replica-ring link of stage 1 of a
// 4-stage run with r replicas: replica 0 dials replica 1.
func replicaHellos(r int, shapes [][]int) (up, down Hello) {
	up = Hello{Group: ReplicaGroup, Stage: 1, Stages: 4, Replica: 0, Replicas: r, ConfigDigest: "3fa2c1", Address: "127.0.0.1:7200", DType: Float32, Shapes: shapes}
	down = up.clone()
	down.Replica = 1
	down.Address = ""
	return up, down
}

// gridHello is the hello of the process at (stage, replica) of a grid of
// stages × replicas, for a link of group g.
func gridHello(g Group, stage, stages, replica, replicas int, shapes [][]int) Hello {
	return Hello{Group: g, Stage: stage, Stages: stages, Replica: replica, Replicas: replicas,
		ConfigDigest: "3fa2c1", Address: fmt.Sprintf("127.0.0.1:%d", 7000+100*replica+stage), DType: Float32, Shapes: shapes}
}

func TestCheckPeerReplicaRing(t *testing.T) {
	shapes := [][]int{{2, 3}}
	at := func(stage, replica, replicas int) Hello {
		return gridHello(ReplicaGroup, stage, 4, replica, replicas, shapes)
	}
	pipe := func(stage, replica, replicas int) Hello {
		return gridHello(PipelineGroup, stage, 4, replica, replicas, shapes)
	}
	mutate := func(h Hello, f func(*Hello)) Hello { h = h.clone(); f(&h); return h }
	cases := []struct {
		name             string
		dialer, listener Hello
		// want is the error of the listener's check (the dialer's hello as
		// remote), wantDialer that of the dialer's check; "" means accepted.
		want, wantDialer string
	}{
		{name: "R=2 0->1", dialer: at(1, 0, 2), listener: at(1, 1, 2)},
		{name: "R=2 1->0", dialer: at(1, 1, 2), listener: at(1, 0, 2)},
		{name: "R=3 0->1", dialer: at(1, 0, 3), listener: at(1, 1, 3)},
		{name: "R=3 1->2", dialer: at(1, 1, 3), listener: at(1, 2, 3)},
		{name: "R=3 2->0", dialer: at(1, 2, 3), listener: at(1, 0, 3)},
		{name: "one-stage pipeline", dialer: gridHello(ReplicaGroup, 0, 1, 1, 2, shapes), listener: gridHello(ReplicaGroup, 0, 1, 0, 2, shapes)},
		{
			name: "R=3 0->2", dialer: at(1, 0, 3), listener: at(1, 2, 3),
			want:       "stage 1 replica 2 (127.0.0.1:7201) refused stage 1 replica 0 (127.0.0.1:7001): only upstream neighbour replica 1 of stage 1 may connect",
			wantDialer: "stage 1 replica 0 (127.0.0.1:7001) refused stage 1 replica 2 (127.0.0.1:7201): expected downstream neighbour replica 1 of stage 1",
		},
		{
			name: "R=3 1->0", dialer: at(1, 1, 3), listener: at(1, 0, 3),
			want:       "refused stage 1 replica 1 (127.0.0.1:7101): only upstream neighbour replica 2 of stage 1 may connect",
			wantDialer: "refused stage 1 replica 0 (127.0.0.1:7001): expected downstream neighbour replica 2 of stage 1",
		},
		{
			name: "R=3 self", dialer: at(1, 1, 3), listener: at(1, 1, 3),
			want:       "only upstream neighbour replica 0 of stage 1 may connect",
			wantDialer: "expected downstream neighbour replica 2 of stage 1",
		},
		{
			name: "different stage", dialer: at(2, 0, 2), listener: at(1, 1, 2),
			want:       "stage 1 replica 1 (127.0.0.1:7101) refused stage 2 replica 0 (127.0.0.1:7002): stage 2 differs from 1: the replica ring joins the replicas of one stage",
			wantDialer: "stage 2 replica 0 (127.0.0.1:7002) refused stage 1 replica 1 (127.0.0.1:7101): stage 1 differs from 2: the replica ring joins the replicas of one stage",
		},
		{
			name: "replica count", dialer: at(1, 0, 3), listener: at(1, 1, 2),
			want:       "refused stage 1 replica 0 (127.0.0.1:7001): replica count 3 differs from 2",
			wantDialer: "refused stage 1 replica 1 (127.0.0.1:7101): replica count 2 differs from 3",
		},
		{
			name: "stage count", dialer: mutate(at(1, 0, 2), func(h *Hello) { h.Stages = 5 }), listener: at(1, 1, 2),
			want:       "stage count 5 differs from 4",
			wantDialer: "stage count 4 differs from 5",
		},
		{
			name: "digest", dialer: mutate(at(1, 0, 2), func(h *Hello) { h.ConfigDigest = "9b01de" }), listener: at(1, 1, 2),
			want:       "config digest 9b01de differs from 3fa2c1",
			wantDialer: "config digest 3fa2c1 differs from 9b01de",
		},
		{
			name: "shape", dialer: mutate(at(1, 0, 2), func(h *Hello) { h.Shapes = [][]int{{3, 2}} }), listener: at(1, 1, 2),
			want:       "chunk 0 activation shape [3 2] float32 differs from [2 3] float32",
			wantDialer: "chunk 0 activation shape [2 3] float32 differs from [3 2] float32",
		},
		{
			name: "dtype", dialer: mutate(at(1, 0, 2), func(h *Hello) { h.DType = Float16 }), listener: at(1, 1, 2),
			want: "chunk 0 activation shape [2 3] float16 differs from [2 3] float32",
		},
		{
			name: "chunk count", dialer: mutate(at(1, 0, 2), func(h *Hello) { h.Shapes = [][]int{{2, 3}, {2, 3}} }), listener: at(1, 1, 2),
			want: "chunk count 2 differs from 1",
		},
		// Pipeline links with replicas.
		{name: "pipeline, same replica", dialer: pipe(1, 1, 3), listener: pipe(2, 1, 3)},
		{name: "pipeline, replicas 0 and 1 agree", dialer: mutate(pipe(1, 0, 0), func(h *Hello) {}), listener: pipe(2, 0, 1)},
		{
			name: "pipeline between replicas", dialer: pipe(1, 1, 2), listener: pipe(2, 0, 2),
			want:       "stage 2 replica 0 (127.0.0.1:7002) refused stage 1 replica 1 (127.0.0.1:7101): replica 1 differs from 0: stage 2 of one replica links only to its neighbour of the same replica",
			wantDialer: "stage 1 replica 1 (127.0.0.1:7101) refused stage 2 replica 0 (127.0.0.1:7002): replica 0 differs from 1: stage 1 of one replica links only to its neighbour of the same replica",
		},
		{
			name: "pipeline replica count", dialer: pipe(1, 0, 2), listener: pipe(2, 0, 3),
			want:       "replica count 2 differs from 3",
			wantDialer: "replica count 3 differs from 2",
		},
		{
			name: "pipeline replica count, unset", dialer: pipe(1, 0, 0), listener: pipe(2, 0, 2),
			want:       "stage 2 replica 0 (127.0.0.1:7002) refused stage 1 (127.0.0.1:7001): replica count 1 differs from 2",
			wantDialer: "stage 1 (127.0.0.1:7001) refused stage 2 replica 0 (127.0.0.1:7002): replica count 2 differs from 1",
		},
		{
			name: "pipeline non-adjacent", dialer: pipe(0, 1, 2), listener: pipe(2, 1, 2),
			want:       "only upstream neighbour stage 1 replica 1 may connect",
			wantDialer: "expected downstream neighbour stage 1 replica 1",
		},
		// Group mismatches.
		{
			name: "pipeline dialer, ring listener", dialer: pipe(1, 0, 2), listener: at(1, 1, 2),
			want:       "stage 1 replica 1 (127.0.0.1:7101) refused stage 1 replica 0 (127.0.0.1:7001): link group pipeline differs from replica ring (a pipeline dialer reached a replica ring listener)",
			wantDialer: "stage 1 replica 0 (127.0.0.1:7001) refused stage 1 replica 1 (127.0.0.1:7101): link group replica ring differs from pipeline (a pipeline dialer reached a replica ring listener)",
		},
		{
			name: "ring dialer, pipeline listener", dialer: at(1, 0, 2), listener: pipe(2, 0, 2),
			want:       "link group replica ring differs from pipeline (a replica ring dialer reached a pipeline listener)",
			wantDialer: "link group pipeline differs from replica ring (a replica ring dialer reached a pipeline listener)",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantDialer := c.wantDialer
			if wantDialer == "" && c.want != "" {
				wantDialer = "?" // only the listener's message is pinned; the dialer must refuse too
			}
			for _, side := range []struct {
				name          string
				local, remote Hello
				dialer        bool
				want          string
			}{
				{"listener", c.listener, c.dialer, false, c.want},
				{"dialer", c.dialer, c.listener, true, wantDialer},
			} {
				err := CheckPeer(side.local, side.remote, side.dialer)
				var he *HandshakeError
				switch {
				case side.want == "" && err != nil:
					t.Errorf("%s: refused: %v", side.name, err)
				case side.want == "":
				case side.want == "?" && !errors.As(err, &he):
					t.Errorf("%s: got %v, want a HandshakeError", side.name, err)
				case side.want != "?" && (!errors.As(err, &he) || !strings.Contains(err.Error(), side.want)):
					t.Errorf("%s: got %v, want a HandshakeError containing %q", side.name, err, side.want)
				}
			}
		})
	}
}

// bothRoles is the process at stage 1, replica 0 of a 2 × 2 grid: its
// pipeline upstream is stage 0 replica 0, its ring upstream stage 1
// replica 1. The pipeline and ring links carry different shapes, so links
// handed to the wrong role would fail the exchange.
func bothRoles() (pipeUp, pipeSelf, ringUp, ringSelf Hello) {
	pipeShapes, ringShapes := [][]int{{8, 16}}, [][]int{{32}, {4, 4}}
	pipeUp = gridHello(PipelineGroup, 0, 2, 0, 2, pipeShapes)
	pipeSelf = gridHello(PipelineGroup, 1, 2, 0, 2, pipeShapes)
	pipeSelf.Address = ""
	ringUp = gridHello(ReplicaGroup, 1, 2, 1, 2, ringShapes)
	ringSelf = gridHello(ReplicaGroup, 1, 2, 0, 2, ringShapes)
	ringSelf.Address = ""
	return
}

// TestOneListenerServesBothGroups: one Server on one port takes a pipeline
// link and a replica-ring link; each AcceptGroup returns its own, in either
// connect order, and both carry tensors at once.
func TestOneListenerServesBothGroups(t *testing.T) {
	for _, c := range []struct {
		name      string
		ringFirst bool // the ring dialer connects first
		ringRole  bool // the ring hello is Listen's self, the pipeline one in more
	}{
		{"pipeline connects first", false, false},
		{"ring connects first", true, false},
		{"ring role first, ring connects first", true, true},
		{"ring role first, pipeline connects first", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkLeaks(t)
			pipeUp, pipeSelf, ringUp, ringSelf := bothRoles()
			opts := Options{ConnectTimeout: 10 * time.Second}
			self, more := pipeSelf, ringSelf
			if c.ringRole {
				self, more = ringSelf, pipeSelf
			}
			srv, err := Listen("127.0.0.1:0", self, opts, more)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			dial := func(h Hello) Link {
				l, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), h, opts)
				if err != nil {
					t.Fatalf("%s dialer: %v", h.Group, err)
				}
				t.Cleanup(func() { l.Close() })
				return l
			}
			var pipeDial, ringDial Link
			if c.ringFirst {
				ringDial, pipeDial = dial(ringUp), dial(pipeUp)
			} else {
				pipeDial, ringDial = dial(pipeUp), dial(ringUp)
			}
			accept := func(g Group) Link {
				l, err := srv.AcceptGroup(ctxT(t, 10*time.Second), g)
				if err != nil {
					t.Fatalf("AcceptGroup(%s): %v", g, err)
				}
				t.Cleanup(func() { l.Close() })
				return l
			}
			// Accept in the order opposite to the connects; plain Accept is
			// the first role's.
			var pipeAcc, ringAcc Link
			if c.ringFirst {
				pipeAcc = accept(PipelineGroup)
				if c.ringRole {
					ringAcc, err = srv.Accept(ctxT(t, 10*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { ringAcc.Close() })
				} else {
					ringAcc = accept(ReplicaGroup)
				}
			} else {
				ringAcc = accept(ReplicaGroup)
				if c.ringRole {
					pipeAcc = accept(PipelineGroup)
				} else {
					pipeAcc, err = srv.Accept(ctxT(t, 10*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { pipeAcc.Close() })
				}
			}
			if p := pipeAcc.Peer(); p.Group != PipelineGroup || p.Stage != 0 || p.Replica != 0 {
				t.Errorf("pipeline link's peer = %+v", p)
			}
			if p := ringAcc.Peer(); p.Group != ReplicaGroup || p.Stage != 1 || p.Replica != 1 {
				t.Errorf("ring link's peer = %+v", p)
			}
			for _, l := range []Link{pipeDial, ringDial} {
				if p := l.Peer(); p.Address != srv.Addr() || p.Stage != 1 || p.Replica != 0 {
					t.Errorf("dialer's peer = %+v, want stage 1 replica 0 at %s", p, srv.Addr())
				}
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); exchange(t, pipeDial, pipeAcc, 20, pipeUp.Shapes...) }()
			go func() { defer wg.Done(); exchange(t, ringDial, ringAcc, 20, ringUp.Shapes...) }()
			wg.Wait()
		})
	}
}

// TestReplicaRingOfTwo: with R = 2 each replica dials the other, so the pair
// holds two links, one dialed by each; every process listens on one
// address. The replicas are the only stage of a one-stage pipeline.
func TestReplicaRingOfTwo(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{16}}
	opts := Options{ConnectTimeout: 10 * time.Second}
	var srv [2]*Server
	var self [2]Hello
	for r := range 2 {
		h := gridHello(ReplicaGroup, 0, 1, r, 2, shapes)
		h.Address = ""
		var err error
		if srv[r], err = Listen("127.0.0.1:0", h, opts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv[r].Close() })
		h.Address = srv[r].Addr()
		self[r] = h
	}
	var dialed, accepted [2]Link
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			l, err := Dial(ctxT(t, 10*time.Second), srv[1-r].Addr(), self[r], opts)
			if err != nil {
				errs <- fmt.Errorf("replica %d dialing: %w", r, err)
				return
			}
			dialed[r] = l
		}()
		go func() {
			defer wg.Done()
			l, err := srv[r].AcceptGroup(ctxT(t, 10*time.Second), ReplicaGroup)
			if err != nil {
				errs <- fmt.Errorf("replica %d accepting: %w", r, err)
				return
			}
			accepted[r] = l
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, l := range append(dialed[:], accepted[:]...) {
		if l != nil {
			t.Cleanup(func() { l.Close() })
		}
	}
	if t.Failed() {
		return
	}
	for r := range 2 {
		for side, l := range map[string]Link{"dialed": dialed[r], "accepted": accepted[r]} {
			if p := l.Peer(); p.Replica != 1-r || p.Group != ReplicaGroup || p.Address != srv[1-r].Addr() {
				t.Errorf("replica %d's %s link: peer %+v", r, side, p)
			}
		}
	}
	// Replica r's dialed link reaches the other replica's accepted one; both
	// directions of both links work, at the same time.
	wg.Add(2)
	for r := range 2 {
		go func() { defer wg.Done(); exchange(t, dialed[r], accepted[1-r], 10, shapes...) }()
	}
	wg.Wait()
}

// TestReplicaRingRefusals: over gRPC, a second dialer from the upstream
// replica and a dialer from a non-neighbouring replica are refused; an
// Accept with no dialer names the upstream replica.
func TestReplicaRingRefusals(t *testing.T) {
	checkLeaks(t)
	shapes := [][]int{{2}}
	opts := Options{ConnectTimeout: 5 * time.Second}
	listener := gridHello(ReplicaGroup, 0, 2, 1, 3, shapes)
	listener.Address = ""
	up := gridHello(ReplicaGroup, 0, 2, 0, 3, shapes)

	t.Run("wrong replica", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", listener, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		wrong := gridHello(ReplicaGroup, 0, 2, 2, 3, shapes) // replica 2 dials replica 0, not 1
		_, dialErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), wrong, opts)
		_, acceptErr := srv.AcceptGroup(ctxT(t, 10*time.Second), ReplicaGroup)
		want := fmt.Sprintf("stage 0 replica 1 (%s) refused stage 0 replica 2 (127.0.0.1:7200): only upstream neighbour replica 0 of stage 0 may connect", srv.Addr())
		for side, err := range map[string]error{"Dial": dialErr, "Accept": acceptErr} {
			var he *HandshakeError
			if !errors.As(err, &he) || err.Error() != want {
				t.Errorf("%s: got %v, want %q", side, err, want)
			}
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", listener, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		ul, dl := join(t, acceptAsync(t, srv, 10*time.Second), srv.Addr(), up, opts)
		_, err = Dial(ctxT(t, 5*time.Second), srv.Addr(), up, opts)
		var he *HandshakeError
		want := fmt.Sprintf("stage 0 replica 1 (%s) refused stage 0 replica 0 (127.0.0.1:7000): an upstream neighbour is already connected", srv.Addr())
		if !errors.As(err, &he) || err.Error() != want {
			t.Errorf("second dialer: got %v, want %q", err, want)
		}
		exchange(t, ul, dl, 3, shapes...) // the first link is unaffected
	})
	t.Run("accept timeout", func(t *testing.T) {
		srv, err := Listen("127.0.0.1:0", listener, Options{ConnectTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		want := fmt.Sprintf("stage 0 replica 1: upstream replica 0 of stage 0 did not connect to %s within 100ms", srv.Addr())
		if _, err := srv.AcceptGroup(context.Background(), ReplicaGroup); err == nil || err.Error() != want {
			t.Errorf("got %v, want %q", err, want)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := srv.Accept(ctx); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "stage 0 replica 1: waiting for upstream replica 0 of stage 0: ") {
			t.Errorf("cancelled: %v", err)
		}
	})
	t.Run("dial unreachable", func(t *testing.T) {
		addr := freeAddr(t)
		_, err := Dial(context.Background(), addr, up, Options{ConnectTimeout: 200 * time.Millisecond})
		want := fmt.Sprintf("stage 0 replica 0: downstream replica 1 of stage 0 at %s not reachable within 200ms: ", addr)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want prefix %q", err, want)
		}
	})
}

// TestUnservedGroupRefused: a dialer of a group the listener does not serve
// is refused on both sides, naming what the listener serves; the real
// neighbour still gets its link afterwards.
func TestUnservedGroupRefused(t *testing.T) {
	checkLeaks(t)
	pipeUp, pipeSelf, ringUp, ringSelf := bothRoles()
	opts := Options{ConnectTimeout: 5 * time.Second}
	for _, c := range []struct {
		name           string
		serve, intrude Hello
		rightful       Hello
		want           string
	}{
		{"ring dialer at a pipeline listener", pipeSelf, ringUp, pipeUp,
			"refused stage 1 replica 1 (127.0.0.1:7101): a replica ring dialer reached a listener that serves only pipeline links"},
		{"pipeline dialer at a ring listener", ringSelf, pipeUp, ringUp,
			"refused stage 0 replica 0 (127.0.0.1:7000): a pipeline dialer reached a listener that serves only replica ring links"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, err := Listen("127.0.0.1:0", c.serve, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			want := fmt.Sprintf("stage 1 replica 0 (%s) %s", srv.Addr(), c.want)
			_, dialErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), c.intrude, opts)
			_, acceptErr := srv.AcceptGroup(ctxT(t, 10*time.Second), c.serve.Group)
			for side, err := range map[string]error{"Dial": dialErr, "Accept": acceptErr} {
				var he *HandshakeError
				if !errors.As(err, &he) || err.Error() != want {
					t.Errorf("%s: got %v, want %q", side, err, want)
				}
			}
			other := ReplicaGroup
			if c.serve.Group == ReplicaGroup {
				other = PipelineGroup
			}
			wantNone := fmt.Sprintf("stage 1 replica 0: the listener on %s serves no %s link (it serves %s)", srv.Addr(), other, c.serve.Group)
			if _, err := srv.AcceptGroup(ctxT(t, time.Second), other); err == nil || err.Error() != wantNone {
				t.Errorf("AcceptGroup(%s): got %v, want %q", other, err, wantNone)
			}
			// The intruder did not take the role: its neighbour connects.
			_, intruderErr := Dial(ctxT(t, 10*time.Second), srv.Addr(), c.intrude, opts)
			ul, err := Dial(ctxT(t, 10*time.Second), srv.Addr(), c.rightful, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer ul.Close()
			dl, err := srv.AcceptGroup(ctxT(t, 10*time.Second), c.serve.Group)
			if err != nil && err.Error() == want {
				// The second intruder's refusal may reach Accept before the
				// neighbour's link does: the link must still follow.
				dl, err = srv.AcceptGroup(ctxT(t, 10*time.Second), c.serve.Group)
			}
			if err != nil {
				t.Fatalf("Accept after the refusals: %v (intruder: %v)", err, intruderErr)
			}
			defer dl.Close()
			exchange(t, ul, dl, 2, c.rightful.Shapes...)
		})
	}
}

func TestListenRoles(t *testing.T) {
	checkLeaks(t)
	_, pipeSelf, _, ringSelf := bothRoles()
	opts := Options{}
	mutate := func(h Hello, f func(*Hello)) Hello { h = h.clone(); f(&h); return h }
	stage0 := mutate(pipeSelf, func(h *Hello) { h.Stage = 0 })
	cases := []struct {
		name string
		self Hello
		more []Hello
		want string
	}{
		{"two pipeline roles", pipeSelf, []Hello{pipeSelf}, "stage 1 replica 0: two pipeline roles on one listener (a listener serves one link per group)"},
		{"two ring roles", ringSelf, []Hello{pipeSelf, ringSelf}, "two replica ring roles on one listener"},
		{"other replica", pipeSelf, []Hello{mutate(ringSelf, func(h *Hello) { h.Replica = 1 })},
			"the roles of one listener differ: stage 1 of 2 replica 0 of 2 (pipeline) and stage 1 of 2 replica 1 of 2 (replica ring); a listener is one process, one stage of one replica"},
		{"other stage", pipeSelf, []Hello{mutate(ringSelf, func(h *Hello) { h.Stage = 0 })}, "the roles of one listener differ"},
		{"other replica count", pipeSelf, []Hello{mutate(ringSelf, func(h *Hello) { h.Replicas = 3 })}, "the roles of one listener differ"},
		{"invalid ring role", pipeSelf, []Hello{mutate(ringSelf, func(h *Hello) { h.Replicas, h.Replica = 1, 0 })}, "a replica ring link needs 0 <= replica < replicas and at least 2 replicas"},
		{"stage 0 has no pipeline upstream", mutate(ringSelf, func(h *Hello) { h.Stage = 0 }), []Hello{stage0}, "stage 0 has no upstream neighbour to listen for (Ring is false)"},
	}
	for _, c := range cases {
		srv, err := Listen("127.0.0.1:0", c.self, opts, c.more...)
		if err == nil {
			srv.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
	// Stage 0's process may serve the ring alone.
	srv, err := Listen("127.0.0.1:0", mutate(ringSelf, func(h *Hello) { h.Stage = 0 }), opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if _, err := srv.AcceptGroup(context.Background(), ReplicaGroup); err == nil || err.Error() != "stage 0 replica 0: server closed" {
		t.Errorf("AcceptGroup after Close: %v", err)
	}
}
