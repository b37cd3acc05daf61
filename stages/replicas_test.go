package stages

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/runlog"
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

// watchedChunk passes a chunk's weight-pass reports on, noting for each
// report whose layers before it are still to come (first > 0) whether the
// step's reduction of the chunk had buckets in the reducer's hands by then.
type watchedChunk struct {
	compute.Stage
	rs    *replicaSync
	chunk int
	early *[]bool
}

func (w watchedChunk) WatchGradients(f func(first int)) {
	if f == nil {
		w.Stage.(compute.GradientWatcher).WatchGradients(nil)
		return
	}
	w.Stage.(compute.GradientWatcher).WatchGradients(func(first int) {
		f(first)
		if first > 0 {
			r := w.rs.reducer.open[w.chunk]
			*w.early = append(*w.early, r != nil && r.handed < len(w.rs.reducer.plans[w.chunk].Buckets))
		}
	})
}

// TestLayerBucketsReduceDuringLastWeightPass: with all_reduce.overlap
// layer under zb-h1 (a split backward) the buckets of a 2 × 2 grid's last layers go to the replicas'
// ring while the chunk's last weight pass still computes the earlier
// layers' gradients, each stage's all-reduce starts before that pass ends,
// and the run, sharded or not, equals the one-process reference bit for
// bit.
func TestLayerBucketsReduceDuringLastWeightPass(t *testing.T) {
	cfg := gridTestConfig("zb-h1", plain("0-1", "2-3"), 2, 2, "sgd")
	// Buckets of 8 elements: the last layer (8·3 + 3 elements) holds whole
	// ones, which need not wait for the layer before it.
	cfg.AllReduce.BucketBytes, cfg.AllReduce.Overlap = 64, "layer"
	ref := runInProcess(t, cfg, true)
	dir := t.TempDir()
	early := make([][]bool, 4)
	runGrid(t, cfg, dir, false, func(stage, replica int, rt *Runtime) {
		rt.chunks[0] = watchedChunk{Stage: rt.chunks[0], rs: rt.replicas, chunk: 0, early: &early[2*stage+replica]}
	})
	sameMLPRun(t, cfg, ref, dir)
	for k, e := range early {
		if !slices.Contains(e, true) {
			t.Errorf("stage %d replica %d: no bucket reduced before the last weight pass reached its first layer (%v)", k/2, k%2, e)
		}
	}
	for stage := range 2 {
		for replica := range 2 {
			checkReductionsStartInPass(t, runlog.ReplicaEventsFile(dir, stage, replica))
		}
	}
	// Reduce-scattered for a sharded optimizer, bucket by bucket as well.
	cfg.AllReduce.ShardOptimizer = true
	sharded := t.TempDir()
	runGrid(t, cfg, sharded, false)
	sameMLPRun(t, cfg, ref, sharded)
}

// checkReductionsStartInPass reads a stage replica's events and checks
// that each step's all-reduce started before its last weight pass ended.
func checkReductionsStartInPass(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lastW, start := map[int]int64{}, map[int]int64{}
	for line := range strings.Lines(string(b)) {
		var ev runlog.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch ev.Kind {
		case runlog.Weight:
			lastW[ev.Step] = max(lastW[ev.Step], ev.EndNS)
		case runlog.AllReduce:
			start[ev.Step] = ev.StartNS
		}
	}
	if len(start) == 0 {
		t.Fatalf("%s: no all-reduce events", path)
	}
	for step, s := range start {
		if s >= lastW[step] {
			t.Errorf("%s: step %d's all-reduce started %d ns after its last weight pass ended", path, step, s-lastW[step])
		}
	}
}
