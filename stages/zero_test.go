package stages

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/transport"
)

// gridConfig is testConfig with r replicas of each stage, whose global
// batch gives each replica micro micro-batches of 4 examples, summed in
// buckets of 32 float64 elements (many buckets, so each replica's shard is
// many ranges).
func gridTestConfig(sched string, layers [][]string, micro, replicas int, opt string) *configs.Config {
	c := testConfig(sched, layers, micro, "float64", opt)
	c.DataParallel = replicas
	c.Data.BatchSize = 4 * micro * replicas
	c.AllReduce.BucketBytes, c.AllReduce.CheckEvery = 256, 1
	for i := range c.Stages {
		s := &c.Stages[i]
		for r := range replicas {
			s.Addresses = append(s.Addresses, fmt.Sprintf("127.0.0.1:%d", 7100+10*i+r))
		}
		s.Address = s.Addresses[0]
	}
	return c
}

// runGrid runs every stage of every replica of c as a goroutine in dir,
// each replica's stages linked by in-memory pipes and each stage's
// replicas in a ring of them, and returns the runtimes by stage and
// replica. Each prepare sees each runtime before it runs.
func runGrid(t *testing.T, c *configs.Config, dir string, resume bool, prepare ...func(stage, replica int, rt *Runtime)) [][]*Runtime {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	p, R := len(c.Stages), c.Replicas()
	layouts := make([][]*Layout, p)
	for i := range p {
		for r := range R {
			l, err := NewReplicaLayout(c, i, r)
			if err != nil {
				t.Fatal(err)
			}
			layouts[i] = append(layouts[i], l)
		}
	}
	type ends struct{ prev, next, rprev, rnext transport.Link }
	links := make([][]ends, p)
	for i := range links {
		links[i] = make([]ends, R)
	}
	for r := range R {
		for i := 0; i < p && p > 1; i++ {
			j := (i + 1) % p
			if j == 0 && !layouts[i][r].Down.Ring {
				break // the last stage links back to the first only where the hellos ask for it
			}
			a, b := transport.Pipe(layouts[i][r].Down, layouts[j][r].Up, c.Transport.QueueDepth)
			links[i][r].next, links[j][r].prev = a, b
		}
	}
	for i := range p {
		for r := range R {
			a, b := transport.Pipe(layouts[i][r].Reduce, layouts[i][(r+1)%R].Reduce, c.Transport.QueueDepth)
			links[i][r].rnext, links[i][(r+1)%R].rprev = a, b
		}
	}
	train, test := synthetic(96, 8, 3, 1), synthetic(30, 8, 3, 2) // runPausable's
	rts := make([][]*Runtime, p)
	errs := make([][]error, p)
	var wg sync.WaitGroup
	for i := range p {
		errs[i] = make([]error, R)
		for r := range R {
			e := links[i][r]
			rt, err := New(Options{Layout: layouts[i][r], Config: c, Stage: i, RunDir: dir, Prev: e.prev, Next: e.next,
				ReplicaPrev: e.rprev, ReplicaNext: e.rnext, Train: train, Test: test, Resume: resume})
			if err != nil {
				t.Fatalf("stage %d replica %d: %v", i, r, err)
			}
			rts[i] = append(rts[i], rt)
			for _, f := range prepare {
				f(i, r, rt)
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				errs[i][r] = rt.Run(ctx)
				for _, l := range []transport.Link{e.prev, e.next, e.rprev, e.rnext} {
					if l != nil {
						l.Close()
					}
				}
			})
		}
	}
	wg.Wait()
	for i := range errs {
		for r, err := range errs[i] {
			if err != nil {
				t.Errorf("stage %d replica %d: %v", i, r, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return rts
}

// TestShardedOptimizerEqualsReference trains 1 × 2, 2 × 2 and 3 × 2 grids
// (and 1 × 3, whose three-way sums have an order) under gpipe, 1f1b and
// zb-h1 with AdamW (weight decay on the weights alone, a warmup and cosine
// schedule) and with SGD with momentum, each replica keeping the optimizer
// state of its share of every stage's elements: the losses, evaluation and
// weights must equal the one-process reference's and the unsharded run's
// bit for bit, the replicas must pass the weight digest check after every
// step, each replica's optimizer state must be 1/R of the unsharded run's,
// and its ring must carry the unsharded run's bytes.
func TestShardedOptimizerEqualsReference(t *testing.T) {
	grids := []struct {
		layers   [][]string
		replicas int
	}{
		{plain("0-3"), 2}, {plain("0-1", "2-3"), 2}, {plain("0", "1-2", "3"), 2}, {plain("0-3"), 3},
	}
	for _, g := range grids {
		for _, sched := range []string{"gpipe", "1f1b", "zb-h1"} {
			for _, opt := range []string{"adamw", "sgd"} {
				name := fmt.Sprintf("%dx%d/%s/%s", len(g.layers), g.replicas, sched, opt)
				t.Run(name, func(t *testing.T) {
					cfg := gridTestConfig(sched, g.layers, 2, g.replicas, opt)
					if opt == "adamw" {
						cfg.Train.Optimizer.WeightDecay = 0.1
						cfg.Train.LRSchedule = configs.LRSchedule{Kind: "cosine", WarmupSteps: 2}
					}
					shardedEqualsWholeAndReference(t, cfg)
				})
			}
		}
	}
}

// TestShardedInterleavedEqualsReference: with two chunks per stage each
// chunk's optimizer keeps its own shard and each chunk's weights are
// gathered with its own plan; 2 × 2 interleaved and zb-v equal the
// reference and the unsharded run bit for bit.
func TestShardedInterleavedEqualsReference(t *testing.T) {
	for _, c := range []struct {
		sched  string
		layers [][]string
		micro  int
	}{{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 2}, {"zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 3}} {
		for _, opt := range []string{"adamw", "sgd"} {
			t.Run(c.sched+"/"+opt, func(t *testing.T) {
				cfg := gridTestConfig(c.sched, c.layers, c.micro, 2, opt)
				shardedEqualsWholeAndReference(t, cfg)
			})
		}
	}
}

// TestShardedOptimizerWithClippingEqualsReference: clipping by the global
// norm reads every stage's whole summed gradient, so a sharded run that
// clips all-reduces the gradients whole, then all-gathers the weights
// besides; it too equals the reference bit for bit, at 2 × 2 and 1 × 3.
func TestShardedOptimizerWithClippingEqualsReference(t *testing.T) {
	for _, g := range []struct {
		layers   [][]string
		replicas int
	}{{plain("0-1", "2-3"), 2}, {plain("0-3"), 3}} {
		cfg := gridTestConfig("zb-h1", g.layers, 2, g.replicas, "adamw")
		cfg.Train.ClipGradNorm = 0.05
		ref := runInProcess(t, cfg, true)
		cfg.AllReduce.ShardOptimizer = true
		dir := t.TempDir()
		sharded := runGrid(t, cfg, dir, false)
		sameMLPRun(t, cfg, ref, dir)
		if sharded[0][0].replicas.reducer.scatter {
			t.Errorf("%d x %d: a run that clips its gradients reduce-scatters them alone", len(g.layers), g.replicas)
		}
		ms := readMetricsOf(t, dir)
		if ms[0].GradNorm == nil || *ms[0].GradNorm <= cfg.Train.ClipGradNorm {
			t.Fatalf("%d x %d: the first step's gradient norm %v is not clipped to %v: the test clips nothing", len(g.layers), g.replicas, ms[0].GradNorm, cfg.Train.ClipGradNorm)
		}
	}
}

func readMetricsOf(t *testing.T, dir string) []Metric {
	t.Helper()
	ms, err := ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil || len(ms) == 0 {
		t.Fatalf("%s: %d metrics (%v)", dir, len(ms), err)
	}
	return ms
}

// scatteredTraffic requires a sharded run that neither clips nor ties
// weights to reduce-scatter its gradients alone: each replica's ring then
// carries the payload the unsharded all-reduce carries, byte for byte (the
// gradients' reduce-scatter and the weights' all-gather are its two
// halves; Ring.Sent leaves out control messages such as the verdicts).
func scatteredTraffic(t *testing.T, sharded, whole [][]*Runtime) {
	t.Helper()
	for i := range sharded {
		R := len(sharded[i])
		for r := range R {
			rs := sharded[i][r].replicas
			if !rs.reducer.scatter {
				t.Fatalf("stage %d replica %d: the gradients are all-reduced whole", i, r)
			}
			got, want := rs.ring.Sent, whole[i][r].replicas.ring.Sent
			if got != want || got == 0 {
				t.Errorf("stage %d replica %d sent %d bytes on its ring sharded, %d unsharded", i, r, got, want)
			}
		}
	}
}

// shardedStateShrinks requires each sharded replica's optimizer state to be
// its share of the unsharded one's: 1/R, give or take an element per bucket
// and slot where a bucket does not divide by R.
func shardedStateShrinks(t *testing.T, sharded, whole [][]*Runtime) {
	t.Helper()
	for i := range sharded {
		R := len(sharded[i])
		for c, o := range whole[i][0].optims {
			full := o.StateBytes()
			if len(o.SlotNames()) > 0 && full == 0 {
				t.Fatalf("stage %d chunk %d: the unsharded optimizer keeps no state", i, c)
			}
			plan := sharded[i][0].layout.Plans[c]
			slack := int64(len(plan.Buckets) * len(o.SlotNames()) * 8)
			var sum int64
			for r := range R {
				so := sharded[i][r].optims[c]
				if !so.Sharded() {
					t.Fatalf("stage %d replica %d chunk %d: optimizer not sharded", i, r, c)
				}
				got := so.StateBytes()
				sum += got
				if d := got - full/int64(R); d > slack || d < -slack {
					t.Errorf("stage %d replica %d chunk %d: %d bytes of optimizer state, unsharded %d (1/%d is %d)", i, r, c, got, full, R, full/int64(R))
				}
			}
			if sum != full {
				t.Errorf("stage %d chunk %d: the shards keep %d bytes of state together, the unsharded optimizer %d", i, c, sum, full)
			}
		}
	}
}

// TestShardedCheckpointResumes stops a sharded 2 × 2 run after 4 of 6
// steps and resumes it: the run ends with the weights and losses of one
// never stopped. The sharded run's checkpoint holds the whole optimizer
// state, each element once, with the bits the unsharded run's holds, so an
// unsharded run's checkpoint resumes sharded too. A checkpoint of 2
// replicas is refused by a run of 3: data_parallel is a training setting
// (it cuts the micro-batches and orders the sums), which pipetrain resume
// names with both values.
func TestShardedCheckpointResumes(t *testing.T) {
	cfg := gridTestConfig("1f1b", plain("0-1", "2-3"), 2, 2, "adam")
	cfg.AllReduce.ShardOptimizer = true
	cfg.Train.Steps = 6
	full := t.TempDir()
	runGrid(t, cfg, full, false)

	cfg.Checkpoint.Every, cfg.Checkpoint.Keep = 2, 3
	cfg.Train.Steps = 4
	sharded := t.TempDir()
	runGrid(t, cfg, sharded, false)
	cfg.AllReduce.ShardOptimizer = false
	whole := t.TempDir()
	runGrid(t, cfg, whole, false)
	for s := range cfg.Stages {
		part := func(dir string) string {
			return filepath.Join(checkpoint.StepDir(CheckpointDir(dir), 4), checkpoint.PartFile(s))
		}
		a, _, err := checkpoint.Read(part(sharded))
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := checkpoint.Read(part(whole))
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != len(b) {
			t.Fatalf("stage %d: the sharded part holds %d tensors, the unsharded %d", s, len(a), len(b))
		}
		if err := checkpoint.Diff(byName(a), byName(b)); err != nil {
			t.Errorf("stage %d: the sharded and unsharded checkpoints differ: %v", s, err)
		}
	}

	cfg.Train.Steps = 6
	for _, c := range []struct {
		name, dir string
	}{{"sharded", sharded}, {"unsharded", whole}} {
		cfg.AllReduce.ShardOptimizer = true
		rts := runGrid(t, cfg, c.dir, true)
		if got := rts[1][1].optims[0].Steps(); got != 6 {
			t.Errorf("%s checkpoint: stage 1 replica 1's optimizer has taken %d steps, want 6", c.name, got)
		}
		sameWeights(t, full, c.dir)
		sameLosses(t, full, c.dir)
	}

	three := gridTestConfig("1f1b", plain("0-1", "2-3"), 2, 3, "adam")
	three.AllReduce.ShardOptimizer = true
	three.Data.BatchSize = cfg.Data.BatchSize
	three.Train.Steps = 6
	msg := resumeError(t, three, sharded)
	for _, want := range []string{"no usable checkpoint", "written by a run of another config"} {
		if !strings.Contains(msg, want) {
			t.Errorf("resuming 2 replicas' checkpoint with 3: %q lacks %q", msg, want)
		}
	}
	// What pipetrain resume names before any stage starts.
	changes := configs.DiffSettings(cfg.TrainingSettings(), three.TrainingSettings())
	if len(changes) != 1 || changes[0].String() != "data_parallel: 2, now 3" {
		t.Errorf("2 replicas against 3: the settings that changed are %v, want data_parallel alone", changes)
	}
}

func byName(ts []checkpoint.Tensor) map[string]checkpoint.Tensor {
	out := map[string]checkpoint.Tensor{}
	for _, t := range ts {
		out[t.Name] = t
	}
	return out
}

// resumeError is the error New or Run of stage 0 replica 0 of a pipeline
// of two stages gives resuming c in dir.
func resumeError(t *testing.T, c *configs.Config, dir string) string {
	t.Helper()
	l, err := NewReplicaLayout(c, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	next, err := NewReplicaLayout(c, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := transport.Pipe(l.Reduce, l.Reduce, 2)
	down, up := transport.Pipe(l.Down, next.Up, 2)
	for _, x := range []transport.Link{a, b, down, up} {
		defer x.Close()
	}
	rt, err := New(Options{Layout: l, Config: c, RunDir: dir, ReplicaPrev: b, ReplicaNext: a, Next: down, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2), Resume: true})
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rt.Run(ctx); err != nil {
		return err.Error()
	}
	t.Fatal("resumed")
	return ""
}

// TestShardedNonFiniteGradientStopsEveryReplica: after a reduce-scatter
// each replica checks only its own sums, so a NaN in replica 1's share is
// found there alone; the replicas share their verdicts, and both stop at
// the step with ErrNonFinite, replica 1 naming the parameter and replica 0
// naming replica 1.
func TestShardedNonFiniteGradientStopsEveryReplica(t *testing.T) {
	cfg := gridTestConfig("1f1b", plain("0-3"), 2, 2, "adam")
	cfg.AllReduce.ShardOptimizer = true
	cfg.Train.Steps, cfg.Train.Evaluate = 1, false // a step, so that the gradients exist
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var rts [2]*Runtime
	var ls [2]*Layout
	for r := range ls {
		l, err := NewReplicaLayout(cfg, 0, r)
		if err != nil {
			t.Fatal(err)
		}
		ls[r] = l
	}
	a, b := transport.Pipe(ls[0].Reduce, ls[1].Reduce, 4)
	c, d := transport.Pipe(ls[1].Reduce, ls[0].Reduce, 4)
	for _, x := range []transport.Link{a, b, c, d} {
		defer x.Close()
	}
	ends := [2][2]transport.Link{{d, a}, {b, c}} // [prev, next]
	for r := range rts {
		rt, err := New(Options{Layout: ls[r], Config: cfg, RunDir: t.TempDir(), ReplicaPrev: ends[r][0], ReplicaNext: ends[r][1],
			Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
		if err != nil {
			t.Fatal(err)
		}
		if !rt.replicas.reducer.scatter {
			t.Fatal("an MLP that does not clip all-reduces its gradients whole")
		}
		rts[r] = rt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs [2]error
	var wg sync.WaitGroup
	for r, rt := range rts {
		wg.Go(func() { errs[r] = rt.Run(ctx) })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("a step: %v, %v", errs[0], errs[1])
	}
	// The first element replica 1 owns, in its parameter.
	first := rts[1].replicas.owned[0][0][0]
	ws, grads, err := stepGrads(rts[1].chunks[0])
	if err != nil {
		t.Fatal(err)
	}
	name := ""
	for i, g := range grads {
		if n := g.Shape().TotalSize(); first < n {
			g.Data().([]float64)[first] = math.NaN()
			name = ws[i].Name
			break
		} else {
			first -= n
		}
	}
	if err := rts[1].chunks[0].LoadGradients(ws); err != nil {
		t.Fatal(err)
	}
	for r, rt := range rts {
		wg.Go(func() { errs[r] = rt.checkSummedGradients(ctx, 2) })
	}
	wg.Wait()
	for r, want := range []string{
		"a gradient in replica 1's share became NaN at step 3 (stage 0 replica 0)",
		"gradient of " + name + " became NaN at step 3 (stage 0 replica 1)",
	} {
		if !errors.Is(errs[r], ErrNonFinite) || errs[r].Error() != want {
			t.Errorf("replica %d: %v; want %q", r, errs[r], want)
		}
	}
}

// shardedEqualsWholeAndReference trains cfg sharded and unsharded on its
// grid: both equal the one-process reference bit for bit, and sharding
// shrinks each replica's optimizer state and scatters the traffic.
func shardedEqualsWholeAndReference(t *testing.T, cfg *configs.Config) {
	t.Helper()
	ref := runInProcess(t, cfg, true)
	cfg.AllReduce.ShardOptimizer = true
	dir := t.TempDir()
	sharded := runGrid(t, cfg, dir, false)
	sameMLPRun(t, cfg, ref, dir)
	cfg.AllReduce.ShardOptimizer = false
	wholeDir := t.TempDir()
	whole := runGrid(t, cfg, wholeDir, false)
	sameMLPRun(t, cfg, wholeDir, dir)
	shardedStateShrinks(t, sharded, whole)
	scatteredTraffic(t, sharded, whole)
}
