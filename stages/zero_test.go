package stages

import (
	"context"
	"fmt"
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
// replica.
func runGrid(t *testing.T, c *configs.Config, dir string, resume bool) [][]*Runtime {
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
		for i := 0; i+1 < p; i++ {
			a, b := transport.Pipe(layouts[i][r].Down, layouts[i+1][r].Up, c.Transport.QueueDepth)
			links[i][r].next, links[i+1][r].prev = a, b
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
// weights must equal the one-process reference's bit for bit, the replicas
// must pass the weight digest check after every step, and each replica's
// optimizer state must be 1/R of the unsharded run's.
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
					ref := runInProcess(t, cfg, true)
					cfg.AllReduce.ShardOptimizer = true
					dir := t.TempDir()
					sharded := runGrid(t, cfg, dir, false)
					sameMLPRun(t, cfg, ref, dir)
					cfg.AllReduce.ShardOptimizer = false
					whole := runGrid(t, cfg, t.TempDir(), false)
					shardedStateShrinks(t, sharded, whole)
				})
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
