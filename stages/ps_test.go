package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/ps"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// psConfig is a 2-stage MLP run with workers replicas of the pipeline and
// servers parameter servers (their addresses filled in by startServers).
func psConfig(workers, servers int, opt string) *configs.Config {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", opt)
	c.DataParallel = workers
	c.Data.BatchSize = 4 * workers * c.Data.MicroBatches
	for i := range c.Stages {
		for w := range workers {
			c.Stages[i].Addresses = append(c.Stages[i].Addresses, fmt.Sprintf("127.0.0.1:%d", 7000+10*i+w))
		}
		c.Stages[i].Address = c.Stages[i].Addresses[0]
	}
	c.Transport.Token = "ps-test-token"
	c.ParameterServers = configs.ParameterServers{Count: servers, Mode: "sync"}
	return c
}

// startServers serves c's parameter servers on loopback ports, with the
// links' token, and writes their addresses into c; observe, if set,
// hears each server's updates and drops.
func startServers(t *testing.T, c *configs.Config, observe func(server int, e ps.Event)) []*ps.Server {
	t.Helper()
	return startServersWith(t, c, func(i int, srv *ps.Server) {
		if observe != nil {
			srv.Observe = func(e ps.Event) { observe(i, e) }
		}
	})
}

// startServersWith is startServers with each server handed to prepare
// before it serves.
func startServersWith(t *testing.T, c *configs.Config, prepare func(i int, srv *ps.Server)) []*ps.Server {
	t.Helper()
	opts, err := LinkOptions(c, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []*ps.Server
	c.ParameterServers.Addresses = nil
	for i := range c.ParameterServers.Count {
		srv := ps.NewServer(PSSettings(c, i))
		prepare(i, srv)
		ss, err := srv.Serve("127.0.0.1:0", opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ss.Close() })
		c.ParameterServers.Addresses = append(c.ParameterServers.Addresses, ss.Addr())
		out = append(out, srv)
	}
	return out
}

// runWorkers runs every stage of every worker of c in this process, each
// worker's stages linked by in-memory pipes, each runtime handed to setup
// (when set) before it runs; it returns the run directory.
func runWorkers(t *testing.T, c *configs.Config, setup func(w, stage int, rt *Runtime)) string {
	t.Helper()
	return runWorkersIn(t, c, t.TempDir(), setup)
}

// runWorkersIn is runWorkers with the run directory dir.
func runWorkersIn(t *testing.T, c *configs.Config, dir string, setup func(w, stage int, rt *Runtime)) string {
	t.Helper()
	_, errs := runPSGridIn(t, c, dir, false, func(w, stage int, rt *Runtime, _ func()) {
		if setup != nil {
			setup(w, stage, rt)
		}
	})
	for w := range errs {
		for i, err := range errs[w] {
			if err != nil {
				t.Errorf("worker %d stage %d: %v", w, i, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return dir
}

// runPSGrid is runWorkers with each worker under a context of its own,
// which kill (handed to setup) cancels and a failure of one of its
// stages cancels too; it returns every stage's error.
func runPSGrid(t *testing.T, c *configs.Config, setup func(w, stage int, rt *Runtime, kill func())) (string, [][]error) {
	t.Helper()
	return runPSGridIn(t, c, t.TempDir(), false, setup)
}

// runPSGridIn is runPSGrid in the run directory dir, resuming from its
// newest checkpoint with resume.
func runPSGridIn(t *testing.T, c *configs.Config, dir string, resume bool, setup func(w, stage int, rt *Runtime, kill func())) (string, [][]error) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := c.Replicas()
	workers := make([]*psTestWorker, m)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctxs, kills := make([]context.Context, m), make([]context.CancelFunc, m)
	for w := range m {
		ctxs[w], kills[w] = context.WithCancel(ctx)
		defer kills[w]()
	}
	for w := range m {
		var err error
		if workers[w], err = newPSTestWorker(c, w, dir, Options{Resume: resume}); err != nil {
			t.Fatal(err)
		}
		for i, rt := range workers[w].rts {
			setup(w, i, rt, kills[w])
		}
	}
	errs := make([][]error, m)
	var wg sync.WaitGroup
	for w, pw := range workers {
		wg.Go(func() { errs[w] = pw.run(ctxs[w], kills[w]) })
	}
	wg.Wait()
	return dir, errs
}

// psTestWorker is one worker's stages, built in this process and linked
// by in-memory pipes.
type psTestWorker struct {
	rts   []*Runtime
	links [][2]transport.Link
}

// newPSTestWorker builds worker w's stages of c, writing into dir, with
// base's Resume, Rejoin and RejoinAt.
func newPSTestWorker(c *configs.Config, w int, dir string, base Options) (*psTestWorker, error) {
	p := len(c.Stages)
	train, test := synthetic(96, 8, 3, 1), synthetic(30, 8, 3, 2)
	pw := &psTestWorker{rts: make([]*Runtime, p), links: make([][2]transport.Link, p)}
	layouts := make([]*Layout, p)
	for i := range p {
		l, err := NewReplicaLayout(c, i, w)
		if err != nil {
			return nil, err
		}
		layouts[i] = l
	}
	for i := 0; i+1 < p; i++ {
		a, b := transport.Pipe(layouts[i].Down, layouts[i+1].Up, c.Transport.QueueDepth)
		pw.links[i][1], pw.links[i+1][0] = a, b
	}
	for i, l := range layouts {
		rt, err := New(Options{Layout: l, Config: c, RunDir: dir, Prev: pw.links[i][0], Next: pw.links[i][1], Train: train, Test: test,
			Resume: base.Resume, Rejoin: base.Rejoin, RejoinAt: base.RejoinAt})
		if err != nil {
			return nil, fmt.Errorf("worker %d stage %d: %w", w, i, err)
		}
		pw.rts[i] = rt
	}
	return pw, nil
}

// run runs the worker's stages until all return, kill (cancelling ctx)
// once one fails, and returns each stage's error.
func (pw *psTestWorker) run(ctx context.Context, kill func()) []error {
	errs := make([]error, len(pw.rts))
	var wg sync.WaitGroup
	for i, rt := range pw.rts {
		wg.Go(func() {
			errs[i] = rt.Run(ctx)
			if errs[i] != nil {
				kill()
			}
			for _, l := range pw.links[i] {
				if l != nil {
					l.Close()
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// serversHoldReference checks that the servers hold the reference's final weights,
// bit for bit, between them every one once, and that the workers saved
// them too.
func serversHoldReference(t *testing.T, servers []*ps.Server, ref, run string) {
	t.Helper()
	want := readWeights(t, ref)
	held := map[string]checkpoint.Tensor{}
	for i, s := range servers {
		ws := s.Weights()
		if len(ws) == 0 {
			t.Errorf("server %d holds no tensors", i)
		}
		for name, v := range ws {
			if _, dup := held[name]; dup {
				t.Errorf("%s held by two servers", name)
			}
			tt := checkpoint.Tensor{Name: name, Shape: v.Shape().Clone()}
			switch d := v.Data().(type) {
			case []float32:
				tt.F32 = d
			case []float64:
				tt.F64 = d
			}
			held[name] = tt
		}
	}
	if err := checkpoint.Diff(want, held); err != nil {
		t.Errorf("servers' weights differ from the reference's: %v", err)
	}
	if err := checkpoint.Diff(want, readWeights(t, run)); err != nil {
		t.Errorf("worker 0's saved weights differ from the reference's: %v", err)
	}
}

// TestSyncPSEqualsReference: 3 workers of a 2-stage pipeline with 2
// parameter servers train the same weights, log the same losses and
// evaluate the same as the one-process reference, bit for bit, with each
// optimizer, in sync mode and in async mode with max_staleness 0.
func TestSyncPSEqualsReference(t *testing.T) {
	for _, name := range []string{"sync/sgd", "sync/adam", "async/adam"} {
		mode, opt, _ := strings.Cut(name, "/")
		t.Run(name, func(t *testing.T) {
			c := psConfig(3, 2, opt)
			c.ParameterServers.Mode = mode
			servers := startServers(t, c, nil)
			run := runWorkers(t, c, nil)
			ref := runInProcess(t, c, true)
			serversHoldReference(t, servers, ref, run)
			sameMLPRun(t, c, ref, run)
		})
	}
}

// runReference runs c's one-process reference with layout changes made
// by adjust, and returns its run directory.
func runReference(t *testing.T, c *configs.Config, adjust func(*Layout)) string {
	t.Helper()
	l, err := ReferenceLayout(c)
	if err != nil {
		t.Fatal(err)
	}
	adjust(l)
	dir := t.TempDir()
	rt, err := New(Options{Layout: l, Config: c, Reference: true, RunDir: dir, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.Run(ctx); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBackupWorkersDropTheLateWorker: with aggregate 2 of 3 workers and
// worker 2 held back until each step's update is made, every update sums
// workers 0 and 1, exactly worker 2's pushes are dropped (and counted, on
// the servers and the worker), and the weights equal the reference that
// sums only workers 0 and 1, bit for bit.
func TestBackupWorkersDropTheLateWorker(t *testing.T) {
	c := psConfig(3, 2, "adam")
	c.ParameterServers.Aggregate = 2
	var mu sync.Mutex
	updated := sync.NewCond(&mu)
	made := map[[2]int]int64{}  // updates made, by server and stage
	drops := map[[3]int]int64{} // pushes dropped, by server, stage and worker
	servers := startServers(t, c, func(s int, e ps.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Departed {
			t.Errorf("server %d: worker %d stage %d left without a bye", s, e.Dropped, e.Stage)
			return
		}
		if e.Update == nil {
			drops[[3]int{s, e.Stage, e.Dropped}]++
			return
		}
		if !slices.Equal(e.Update.Workers, []int{0, 1}) {
			t.Errorf("server %d stage %d: update of step %d sums workers %v, want [0 1]", s, e.Stage, e.Step+1, e.Update.Workers)
		}
		made[[2]int{s, e.Stage}] = e.Step + 1
		updated.Broadcast()
	})
	var late []*Runtime
	run := runWorkers(t, c, func(w, stage int, rt *Runtime) {
		if w != 2 {
			return
		}
		late = append(late, rt)
		rt.ps.beforePush = func(step int) {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range rt.ps.servers {
				for made[[2]int{s, stage}] <= int64(step) {
					updated.Wait()
				}
			}
		}
	})
	steps := int64(c.Train.Steps)
	for key, n := range drops {
		if key[2] != 2 || n != steps {
			t.Errorf("server %d stage %d dropped %d pushes of worker %d; want only worker 2's, all %d", key[0], key[1], n, key[2], steps)
		}
	}
	if len(late) != len(c.Stages) {
		t.Fatalf("%d stages of worker 2 delayed", len(late))
	}
	for _, rt := range late {
		if want := steps * int64(len(rt.ps.servers)); rt.ps.dropped != want {
			t.Errorf("worker 2 stage %d counted %d dropped pushes, want %d", rt.stage, rt.ps.dropped, want)
		}
		for _, s := range rt.ps.servers {
			if n := drops[[3]int{s, rt.stage, 2}]; n != steps {
				t.Errorf("server %d dropped %d of stage %d's pushes from worker 2, want %d", s, n, rt.stage, steps)
			}
			if n := servers[s].Dropped(rt.stage, 2); n != steps {
				t.Errorf("server %d counts %d drops of worker 2 stage %d, want %d", s, n, rt.stage, steps)
			}
		}
	}
	ref := runReference(t, c, func(l *Layout) { l.PSKept = func(int) []int { return []int{0, 1} } })
	serversHoldReference(t, servers, ref, run)
	sameFile(t, ref+"/eval.json", run+"/eval.json")
}

// TestAsyncAppliesEveryPushOnce: in async mode with max_staleness 2 and
// worker 2 slowed down, the run ends with every worker's push of every
// step applied exactly once on each server, and worker 0 saves the
// servers' final weights. A worker's weights miss at most the others'
// last 2 steps when it pulls, and they push at most 2 steps beyond its
// own before its push lands, so no push is more than (2·2+1)·2 = 10
// updates stale.
func TestAsyncAppliesEveryPushOnce(t *testing.T) {
	c := psConfig(3, 2, "adam")
	c.ParameterServers.Mode, c.ParameterServers.MaxStaleness = "async", 2
	var mu sync.Mutex
	applied := map[[3]int]int{} // pushes applied, by server, stage and worker
	var maxStale int64
	servers := startServers(t, c, func(s int, e ps.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Departed {
			t.Errorf("server %d: worker %d stage %d left without a bye", s, e.Dropped, e.Stage)
			return
		}
		if e.Update == nil {
			t.Errorf("server %d dropped worker %d's push of step %d in async mode", s, e.Dropped, e.Step+1)
			return
		}
		for k, w := range e.Update.Workers {
			applied[[3]int{s, e.Stage, w}]++
			maxStale = max(maxStale, e.Update.Staleness[k])
		}
	})
	var stages [][2]int // the (server, stage) groups, from worker 0's stages
	run := runWorkers(t, c, func(w, stage int, rt *Runtime) {
		if w == 0 {
			for _, s := range rt.ps.servers {
				stages = append(stages, [2]int{s, stage})
			}
		}
		if w == 2 {
			rt.ps.beforePush = func(int) { time.Sleep(20 * time.Millisecond) }
		}
	})
	for _, g := range stages {
		for w := range 3 {
			if n := applied[[3]int{g[0], g[1], w}]; n != c.Train.Steps {
				t.Errorf("server %d stage %d applied %d of worker %d's %d pushes", g[0], g[1], n, w, c.Train.Steps)
			}
		}
	}
	for _, g := range stages {
		var n int64
		for st, k := range servers[g[0]].Staleness(g[1]) {
			n += k
			if st > maxStale {
				t.Errorf("server %d stage %d counts a push %d updates stale; the most the updates said is %d", g[0], g[1], st, maxStale)
			}
		}
		if n != int64(3*c.Train.Steps) {
			t.Errorf("server %d stage %d's staleness histogram counts %d pushes, want %d", g[0], g[1], n, 3*c.Train.Steps)
		}
	}
	if maxStale > 10 {
		t.Errorf("an update was %d updates stale; max_staleness 2 of 3 workers allows 10", maxStale)
	}
	t.Logf("most stale update: %d", maxStale)
	worker0SavedServersWeights(t, servers, run)
}

// TestAsyncSurvivesAKilledWorker: in async mode (max_staleness 1) worker 2
// is killed before its stage 1 pushes step 3. The servers note its streams
// ending without a bye and stop waiting for it: workers 0 and 1 train to
// the end with every push of theirs applied exactly once, worker 2's
// pushes before the kill applied once each, and worker 0 saves the
// servers' final weights.
func TestAsyncSurvivesAKilledWorker(t *testing.T) {
	c := psConfig(3, 2, "adam")
	c.ParameterServers.Mode, c.ParameterServers.MaxStaleness = "async", 1
	var mu sync.Mutex
	applied := map[[3]int]int{} // pushes applied, by server, stage and worker
	departed := map[[3]int]bool{}
	servers := startServers(t, c, func(s int, e ps.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e.Departed:
			departed[[3]int{s, e.Stage, e.Dropped}] = true
		case e.Update == nil:
			t.Errorf("server %d dropped worker %d's push in async mode", s, e.Dropped)
		default:
			for _, w := range e.Update.Workers {
				applied[[3]int{s, e.Stage, w}]++
			}
		}
	})
	var groups [][2]int // (server, stage)
	dir, errs := runPSGrid(t, c, func(w, stage int, rt *Runtime, kill func()) {
		if w == 0 {
			for _, s := range rt.ps.servers {
				groups = append(groups, [2]int{s, stage})
			}
		}
		if w == 2 && stage == 1 {
			rt.ps.beforePush = func(step int) {
				if step == 2 {
					kill()
				}
			}
		}
	})
	for w := range 2 {
		for i, err := range errs[w] {
			if err != nil {
				t.Errorf("worker %d stage %d: %v", w, i, err)
			}
		}
	}
	if errs[2][1] == nil || !strings.Contains(errs[2][1].Error(), "context canceled") {
		t.Errorf("killed worker 2 stage 1: %v", errs[2][1])
	}
	steps := c.Train.Steps
	for _, g := range groups {
		for w := range 2 {
			if n := applied[[3]int{g[0], g[1], w}]; n != steps {
				t.Errorf("server %d stage %d applied %d of worker %d's %d pushes", g[0], g[1], n, w, steps)
			}
		}
		n := applied[[3]int{g[0], g[1], 2}]
		if lo, hi := 2, map[int]int{0: 3, 1: 2}[g[1]]; n < lo || n > hi {
			t.Errorf("server %d stage %d applied %d of killed worker 2's pushes, want %d-%d", g[0], g[1], n, lo, hi)
		}
		if !departed[[3]int{g[0], g[1], 2}] {
			t.Errorf("server %d did not note worker 2 stage %d leaving", g[0], g[1])
		}
	}
	worker0SavedServersWeights(t, servers, dir)
}

// TestAsyncWorkerRejoins kills worker 2 of 3 (async, max_staleness 1) at
// step 3, builds its stages again with Rejoin at step 4 while worker 0
// waits before its push of step 4, and runs them: each stage rejoins the
// servers at step 4, starts from the servers' weights rather than its
// initial ones, and trains to the end; every server applies each push
// once, worker 2's being those before its death and one for each step from
// 4 on, and worker 0 saves the servers' final weights.
func TestAsyncWorkerRejoins(t *testing.T) {
	c := psConfig(3, 2, "adam")
	c.ParameterServers.Mode, c.ParameterServers.MaxStaleness = "async", 1
	const at = 3 // the step (0-based) worker 2 rejoins at
	shares, err := PSShares(c)
	if err != nil {
		t.Fatal(err)
	}
	groups := 0 // (server, stage) pairs
	for _, sh := range shares {
		groups += len(sh.Stages)
	}
	var mu sync.Mutex
	applied := map[[3]int]int{} // pushes applied, by server, stage and worker
	before := map[[2]int]int{}  // worker 2's pushes applied when it departed, by server and stage
	rejoined := map[[2]int]int64{}
	gone := make(chan struct{}) // closed once every group noted worker 2's departure
	noteGone := sync.OnceFunc(func() { close(gone) })
	servers := startServers(t, c, func(s int, e ps.Event) {
		mu.Lock()
		defer mu.Unlock()
		g := [2]int{s, e.Stage}
		switch {
		case e.Departed && e.Dropped == 2:
			before[g] = applied[[3]int{s, e.Stage, 2}]
			if len(before) == groups {
				noteGone()
			}
		case e.Rejoined:
			rejoined[g] = e.Step
		case e.Update != nil:
			for _, w := range e.Update.Workers {
				applied[[3]int{s, e.Stage, w}]++
			}
		}
	})
	back := make(chan struct{}) // closed once worker 2's stages have rejoined
	release := sync.OnceFunc(func() { close(back) })
	var again *psTestWorker
	var againErrs []error
	var initial, pulled []compute.Weight // stage 0's weights at the start, and once rejoined
	rejoinDone := make(chan struct{})
	dir, errs := runPSGrid(t, c, func(w, stage int, rt *Runtime, kill func()) {
		switch {
		case w == 0 && stage == 0:
			rt.ps.beforePush = func(step int) {
				if step == at {
					<-back
				}
			}
		case w == 2 && stage == 1:
			rt.ps.beforePush = func(step int) {
				if step == at-1 {
					kill()
				}
			}
		case w == 2 && stage == 0:
			initial = cloneWeights(rt.chunks[0].Weights())
			go func() {
				defer close(rejoinDone)
				defer release()
				<-gone
				var err error
				if again, err = newPSTestWorker(c, 2, rt.runDir, Options{Rejoin: true, RejoinAt: at}); err != nil {
					againErrs = []error{err}
					return
				}
				pulled = cloneWeights(again.rts[0].chunks[0].Weights())
				release()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				againErrs = again.run(ctx, cancel)
			}()
		}
	})
	<-rejoinDone
	for w := range 2 {
		for i, err := range errs[w] {
			if err != nil {
				t.Errorf("worker %d stage %d: %v", w, i, err)
			}
		}
	}
	for i, err := range againErrs {
		if err != nil {
			t.Errorf("rejoined worker 2 stage %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if sameValues(initial, pulled) {
		t.Error("the rejoined stage 0 computes with its initial weights, not the servers'")
	}
	steps := c.Train.Steps
	for g, n := range before {
		for w := range 2 {
			if got := applied[[3]int{g[0], g[1], w}]; got != steps {
				t.Errorf("server %d stage %d applied %d of worker %d's %d pushes", g[0], g[1], got, w, steps)
			}
		}
		if got, want := applied[[3]int{g[0], g[1], 2}], n+steps-at; got != want {
			t.Errorf("server %d stage %d applied %d of worker 2's pushes, want the %d before its death and %d from step %d on", g[0], g[1], got, n, steps-at, at+1)
		}
		if r, ok := rejoined[g]; !ok || r != at {
			t.Errorf("server %d stage %d: worker 2 rejoined at step %d (noted %v), want %d", g[0], g[1], r+1, ok, at+1)
		}
	}
	worker0SavedServersWeights(t, servers, dir)
}

// cloneWeights copies ws's values.
func cloneWeights(ws []compute.Weight) []compute.Weight {
	out := make([]compute.Weight, len(ws))
	for i, w := range ws {
		out[i] = compute.Weight{Name: w.Name, Value: w.Value.Clone().(*tensor.Dense)}
	}
	return out
}

// sameValues reports whether a and b hold the same values.
func sameValues(a, b []compute.Weight) bool {
	for i := range a {
		if !slices.Equal(a[i].Value.Data().([]float32), b[i].Value.Data().([]float32)) {
			return false
		}
	}
	return len(a) == len(b)
}

// TestPSMetricsCountServerBytes: a worker stage's Prometheus metrics count
// the gradient bytes it pushed and the weight bytes it pulled, every step
// all of its parameters each way, its push and pull time and its staleness,
// and its event log records the pushes.
func TestPSMetricsCountServerBytes(t *testing.T) {
	c := psConfig(2, 2, "sgd")
	startServers(t, c, nil)
	var rts []*Runtime
	dir := runWorkers(t, c, func(w, stage int, rt *Runtime) {
		if w == 0 {
			rts = append(rts, rt)
		}
	})
	for _, rt := range rts {
		var params int64
		for _, ch := range rt.chunks {
			params += weightBytes(ch.Weights())
		}
		var b strings.Builder
		if _, err := rt.Metrics().WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		want := int64(c.Train.Steps) * params
		for _, m := range []string{"sent", "received"} {
			line := fmt.Sprintf("pipetrain_%s_bytes_total{stage=\"%d\",link=\"servers\"} %d\n", m, rt.stage, want)
			if !strings.Contains(b.String(), line) {
				t.Errorf("stage %d metrics lack %q:\n%s", rt.stage, line, b.String())
			}
		}
		// Sync pushes are never stale; the times are the run's own.
		for _, line := range []string{fmt.Sprintf("pipetrain_ps_staleness{stage=\"%d\"} 0\n", rt.stage),
			fmt.Sprintf("pipetrain_ps_push_seconds_total{stage=\"%d\"} ", rt.stage), fmt.Sprintf("pipetrain_ps_pull_seconds_total{stage=\"%d\"} ", rt.stage)} {
			if !strings.Contains(b.String(), line) {
				t.Errorf("stage %d metrics lack %q:\n%s", rt.stage, line, b.String())
			}
		}
	}
	raw, err := os.ReadFile(runlog.EventsFile(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	pushes := 0
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var e runlog.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if e.Kind == runlog.Optimizer && e.BytesSent > 0 {
			pushes++
		}
	}
	if pushes != c.Train.Steps {
		t.Errorf("stage 1's events show %d pushes, want %d", pushes, c.Train.Steps)
	}
}

// TestSlowWorkerCosts measures how long worker 0 takes to reach its last
// push of 12 steps, of 3 workers with worker 2 slowed by 40 ms before each
// push of each of its two stages: sync waits for it every step; backup
// workers (aggregate 2) do not, and drop its pushes; async with
// max_staleness k lets the others run k steps ahead of it and no more, so
// a worker slow at every step still sets their pace, k steps later. It
// logs the times (docs/parameter-servers.md quotes a run) and checks the
// one bound no scheduling can break: sync cannot reach worker 0's last push
// before worker 2 has slept before each of its first 11.
func TestSlowWorkerCosts(t *testing.T) {
	const delay = 40 * time.Millisecond
	cases := []struct {
		name      string
		mode      string
		aggregate int
		staleness int
	}{{"sync", "sync", 0, 0}, {"backup 2 of 3", "sync", 2, 0}, {"async k=1", "async", 0, 1}, {"async k=4", "async", 0, 4}}
	took := map[string]time.Duration{}
	for _, tc := range cases {
		c := psConfig(3, 2, "adam")
		c.Train.Steps, c.Train.Evaluate = 12, false
		c.ParameterServers.Mode, c.ParameterServers.Aggregate, c.ParameterServers.MaxStaleness = tc.mode, tc.aggregate, tc.staleness
		startServers(t, c, nil)
		start := time.Now()
		var last time.Time
		runWorkers(t, c, func(w, stage int, rt *Runtime) {
			switch {
			case w == 2:
				rt.ps.beforePush = func(int) { time.Sleep(delay) }
			case w == 0 && stage == 0:
				rt.ps.beforePush = func(step int) {
					if step == c.Train.Steps-1 {
						last = time.Now()
					}
				}
			}
		})
		took[tc.name] = last.Sub(start)
		t.Logf("%-14s worker 0 at its last push after %v (worker 2 slowed by %v before each push)", tc.name, took[tc.name].Round(time.Millisecond), delay)
	}
	if floor := 11 * delay; took["sync"] < floor {
		t.Errorf("sync took %v, less than the slow worker's own %v", took["sync"], floor)
	}
	// How much sooner backup workers and async finish is a timing of this
	// machine, logged above and quoted by docs/parameter-servers.md, never
	// asserted (timings vary ±40% between runs here); that backup workers
	// drop exactly the slow worker's pushes is TestBackupWorkersDropTheLateWorker's.
}

// TestPSSharesCoverTheModelOnce: the servers' shares hold every parameter
// once, and each stage's servers are those a worker stage dials.
func TestPSSharesCoverTheModelOnce(t *testing.T) {
	c := psConfig(2, 2, "sgd")
	c.ParameterServers.Addresses = []string{"127.0.0.1:7100", "127.0.0.1:7101"}
	shares, err := PSShares(c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ReferenceLayout(c)
	if err != nil {
		t.Fatal(err)
	}
	all, err := modelTensors(l.Model)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, tt := range all {
		bytes += tt.Bytes
	}
	n, b := 0, int64(0)
	for _, sh := range shares {
		n, b = n+sh.Tensors, b+sh.Bytes
	}
	if n != len(all) || b != bytes || n != 2*(len(c.Model.Hidden)+1) {
		t.Errorf("shares hold %d tensors of %d bytes; the model %d of %d", n, b, len(all), bytes)
	}
	for st := range c.Stages {
		sl, err := NewLayout(c, st)
		if err != nil {
			t.Fatal(err)
		}
		owners, err := PSOwners(c, sl.Model)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := layerTensors(sl.Model)
		if err != nil {
			t.Fatal(err)
		}
		for s, sh := range shares {
			holds := false
			for _, tt := range slices.Concat(layers[sl.Ranges[0][0]:sl.Ranges[0][1]]...) {
				holds = holds || owners[tt.Name] == s
			}
			if holds != slices.Contains(sh.Stages, st) {
				t.Errorf("server %d: holds stage %d's tensors %v, its share lists stages %v", s, st, holds, sh.Stages)
			}
		}
	}
}

// TestSlowReplicaEnv: PIPETRAIN_BENCH_SLOW_REPLICA slows the replica it
// names, and a value that names none is an error naming the variable.
func TestSlowReplicaEnv(t *testing.T) {
	t.Setenv(SlowReplicaEnv, "2")
	for r, want := range []bool{false, false, true} {
		if got, err := slowReplica(r); got != want || err != nil {
			t.Errorf("replica %d: slow %v, %v; want %v", r, got, err, want)
		}
	}
	t.Setenv(SlowReplicaEnv, "two")
	if _, err := slowReplica(0); err == nil || !strings.Contains(err.Error(), SlowReplicaEnv+`="two": want a replica's index`) {
		t.Errorf("a bad value: %v", err)
	}
}

// worker0SavedServersWeights checks that the final weights worker 0 saved
// in run are those the servers hold.
func worker0SavedServersWeights(t *testing.T, servers []*ps.Server, run string) {
	t.Helper()
	held := map[string]checkpoint.Tensor{}
	for _, s := range servers {
		for name, v := range s.Weights() {
			held[name] = checkpoint.Tensor{Name: name, Shape: v.Shape().Clone(), F32: v.Data().([]float32)}
		}
	}
	if err := checkpoint.Diff(held, readWeights(t, run)); err != nil {
		t.Errorf("worker 0 saved other weights than the servers hold: %v", err)
	}
}
