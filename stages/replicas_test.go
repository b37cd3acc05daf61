package stages

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

// replicaPair builds replicas 0 and 1 of a one-stage run with data_parallel
// 2, joined in their ring by in-memory pipes, checking their weights every
// 2 steps.
func replicaPair(t *testing.T) [2]*Runtime {
	t.Helper()
	c := testConfig("1f1b", plain("0-2"), 2, "float32", "sgd")
	c.DataParallel = 2
	c.Stages[0].Address, c.Stages[0].Addresses = "", []string{"127.0.0.1:7000", "127.0.0.1:7001"}
	c.AllReduce.BucketBytes, c.AllReduce.CheckEvery = 64, 2
	var layouts [2]*Layout
	for r := range layouts {
		l, err := NewReplicaLayout(c, 0, r)
		if err != nil {
			t.Fatal(err)
		}
		layouts[r] = l
	}
	// Replica r's Next is replica 1-r's Prev.
	next0, prev1 := transport.Pipe(layouts[0].Reduce, layouts[1].Reduce, 4)
	next1, prev0 := transport.Pipe(layouts[1].Reduce, layouts[0].Reduce, 4)
	links := [2][2]transport.Link{{prev0, next0}, {prev1, next1}}
	train, test := synthetic(64, 8, 3, 1), synthetic(16, 8, 3, 2)
	var rts [2]*Runtime
	for r, l := range layouts {
		rt, err := New(Options{Layout: l, Config: c, RunDir: t.TempDir(), ReplicaPrev: links[r][0], ReplicaNext: links[r][1], Train: train, Test: test})
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
		rts[r] = rt
	}
	t.Cleanup(func() {
		for _, l := range links {
			l[0].Close()
			l[1].Close()
		}
	})
	return rts
}

// checkBoth runs both replicas' digest check of step, as their processes
// would, each waiting on the other's digest.
func checkBoth(rts [2]*Runtime, step int) [2]error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs [2]error
	var wg sync.WaitGroup
	for r, rt := range rts {
		wg.Go(func() { errs[r] = rt.replicas.check(ctx, step) })
	}
	wg.Wait()
	return errs
}

// TestReplicaDigestCheckFiresOnDivergedWeights: replicas holding the same
// weights pass the check; one bit flipped in one weight of replica 1 stops
// both with ErrDiverged, naming the replicas, the stage and the step.
func TestReplicaDigestCheckFiresOnDivergedWeights(t *testing.T) {
	rts := replicaPair(t)
	for r, err := range checkBoth(rts, 1) {
		if err != nil {
			t.Fatalf("replica %d with identical weights: %v", r, err)
		}
	}

	w := rts[1].Chunks()[0].Weights()[0].Value.Data().([]float32)
	w[len(w)/2] = nextFloat32(w[len(w)/2])
	for r, err := range checkBoth(rts, 1) {
		if !errors.Is(err, ErrDiverged) {
			t.Errorf("replica %d: err = %v, want ErrDiverged", r, err)
			continue
		}
		if want := "replicas 0 and 1 of stage 0 hold different weights after step 2"; !strings.Contains(err.Error(), want) {
			t.Errorf("replica %d: %q lacks %q", r, err, want)
		}
	}

	// A step the check does not fall on compares nothing.
	for r, err := range checkBoth(rts, 2) {
		if err != nil {
			t.Errorf("replica %d at step 3 (check_every 2): %v", r, err)
		}
	}
}

// nextFloat32 is x with its lowest mantissa bit flipped: the smallest
// divergence there is.
func nextFloat32(x float32) float32 {
	return math.Float32frombits(math.Float32bits(x) ^ 1)
}
