package stages

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// connectReplicas connects both replicas of a one-stage run with
// data_parallel 2 over loopback, with all_reduce.transport tr, and runs
// two steps on each, returning the replicas' links.
func connectReplicas(t *testing.T, tr string) [2]*Links {
	t.Helper()
	c := testConfig("1f1b", plain("0-2"), 2, "float32", "sgd")
	c.DataParallel = 2
	c.Stages[0].Address, c.Stages[0].Addresses = "", []string{freeLoopback(t), freeLoopback(t)}
	c.AllReduce.BucketBytes, c.AllReduce.CheckEvery, c.AllReduce.Transport = 64, 1, tr
	c.Train.Steps, c.Train.Evaluate = 3, false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Layouts are built one at a time: gorgonia's graph building is not
	// safe for concurrent use, and processes never share it.
	var layouts [2]*Layout
	for r := range layouts {
		l, err := NewReplicaLayout(c, 0, r)
		if err != nil {
			t.Fatal(err)
		}
		layouts[r] = l
	}
	var links [2]*Links
	var errs [2]error
	var wg sync.WaitGroup
	for r := range links {
		wg.Go(func() { links[r], errs[r] = Connect(ctx, layouts[r]) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, l := range links {
			l.Close()
		}
	})
	train, test := synthetic(64, 8, 3, 1), synthetic(16, 8, 3, 2)
	var rts [2]*Runtime
	for r, l := range layouts {
		rt, err := New(Options{Layout: l, Config: c, RunDir: t.TempDir(), ReplicaPrev: links[r].ReplicaPrev, ReplicaNext: links[r].ReplicaNext,
			ReplicaIn: links[r].ReplicaIn, ReplicaOut: links[r].ReplicaOut, Train: train, Test: test})
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
		rts[r] = rt
	}
	// Every step ends with the weights' digests compared (check_every 1):
	// the replicas summed the same gradients.
	for r, err := range runBoth(rts) {
		if err != nil {
			t.Fatalf("%s: replica %d: %v", tr, r, err)
		}
	}
	return links
}

// runBoth trains both replicas at once.
func runBoth(rts [2]*Runtime) [2]error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var errs [2]error
	var wg sync.WaitGroup
	for r, rt := range rts {
		wg.Go(func() { errs[r] = rt.Run(ctx) })
	}
	wg.Wait()
	return errs
}

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestConnectOpensRingStreams: with all_reduce.transport stream, Connect
// opens the ring streams beside the replica links, on the listeners' Unix
// stream sockets (both replicas are on 127.0.0.1, one host) where Linux has
// them, and the replicas train over them, identically; with grpc it opens
// none.
func TestConnectOpensRingStreams(t *testing.T) {
	local := "tcp"
	if runtime.GOOS == "linux" {
		local = "unix"
	}
	for _, tr := range []string{"stream", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			links := connectReplicas(t, tr)
			for r, l := range links {
				streams := l.ReplicaIn != nil && l.ReplicaOut != nil
				if streams != (tr == "stream") {
					t.Errorf("replica %d with transport %s: ring streams %t", r, tr, streams)
				}
				if streams && (l.ReplicaOut.Network() != local || l.ReplicaIn.Network() != local) {
					t.Errorf("replica %d: ring streams on %s / %s, want %s", r, l.ReplicaOut.Network(), l.ReplicaIn.Network(), local)
				}
			}
		})
	}
}
