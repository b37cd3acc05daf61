package stages

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/ps"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// Parameter servers (docs/parameter-servers.md). With parameter_servers
// set, each replica of the pipeline is a worker: at the end of a step each
// of its stages pushes its summed gradients to the servers holding its
// tensors (PSOwners), instead of all-reducing them over the replicas'
// ring, and pulls the updated weights before the next step; the servers
// run the optimizer. The reference sums the replicas' shares in worker
// order, (g0 + g1) + g2 ..., as the servers do (sumWorkerShares), and
// steps once, so a sync run equals it bit for bit.

// PSOwners assigns each of the model's parameters, by name, to one of
// the config's servers, balanced by bytes (ps.Assign over the parameters
// in model order). Workers and tests compute it alike.
func PSOwners(c *configs.Config, model *models.Model) (map[string]int, error) {
	ts, err := modelTensors(model)
	if err != nil {
		return nil, err
	}
	owners := map[string]int{}
	for i, s := range ps.Assign(ts, c.ParameterServers.Count) {
		owners[ts[i].Name] = s
	}
	return owners, nil
}

// layerTensors lists each layer's parameters in order, by name and bytes,
// building each layer's graph as models.ParamCount does.
func layerTensors(m *models.Model) (out [][]ps.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("listing the model's parameters: %v", r)
		}
	}()
	g := G.NewGraph()
	in := m.ShapeAt(0, 1)
	h := G.NewTensor(g, m.DType, len(in), G.WithShape(in...), G.WithName("input"))
	for _, layer := range m.Layers {
		b, err := layer.Build(g, h, 0)
		if err != nil {
			return nil, err
		}
		var ts []ps.Tensor
		for _, p := range b.Params {
			ts = append(ts, ps.Tensor{Name: p.Name(), Bytes: int64(p.Shape().TotalSize() * dtypeSize(m))})
		}
		out = append(out, ts)
		h = b.Out
	}
	return out, nil
}

// modelTensors lists the model's parameters in order.
func modelTensors(m *models.Model) ([]ps.Tensor, error) {
	layers, err := layerTensors(m)
	return slices.Concat(layers...), err
}

// PSSettings are server i's settings from the config: the run's
// optimizer and learning-rate schedule, and the workers it waits for.
func PSSettings(c *configs.Config, i int) ps.Settings {
	p := c.ParameterServers
	return ps.Settings{Index: i, Rule: ps.Rule{Workers: c.Replicas(), Aggregate: p.Aggregate, Async: p.Mode == "async", MaxStaleness: p.MaxStaleness},
		Optimizer: c.Train.Optimizer, LR: c.LearningRate, Threads: c.Threads(0)}
}

// psWorker is a worker stage's side of the servers.
type psWorker struct {
	cfg           *configs.Config
	worker, stage int
	chunks        []compute.Stage
	owners        map[string]int
	model         *models.Model
	halved        bool               // pushes and pulls travel as 16-bit floats (transport.compression)
	servers       []int              // the servers holding some of the stage's tensors, in order
	clients       map[int]*ps.Client // by server
	dropped       int64              // the stage's pushes the servers dropped
	// beforePush, if set, runs before each step's push: tests delay a
	// worker with it.
	beforePush func(step int)
	// slow halves the worker's speed (SlowReplicaEnv, for benchmarks).
	slow bool
}

// newPSWorker joins a worker stage to the servers; nil without servers
// and in the reference. rejoin is the step a worker restarted in an async
// run trains from (Options.Rejoin), -1 at the run's start.
func newPSWorker(l *Layout, chunks []compute.Stage, rejoin int) (*psWorker, error) {
	c := l.Config
	if !c.PSEnabled() || l.Reference {
		return nil, nil
	}
	owners, err := PSOwners(c, l.Model)
	if err != nil {
		return nil, err
	}
	w := &psWorker{cfg: c, worker: l.Replica, stage: l.Stage, chunks: chunks, owners: owners, model: l.Model}
	if w.slow, err = slowReplica(l.Replica); err != nil {
		return nil, err
	}
	for _, ch := range chunks {
		for _, wt := range ch.Weights() {
			s, ok := owners[wt.Name]
			if !ok {
				return nil, fmt.Errorf("%s: weight %s is no parameter of the model's", c.ProcessName(l.Stage, l.Replica), wt.Name)
			}
			if !slices.Contains(w.servers, s) {
				w.servers = append(w.servers, s)
			}
		}
	}
	slices.Sort(w.servers)
	for _, s := range w.servers {
		if c.PSAddress(s) == "" {
			return nil, fmt.Errorf("parameter_servers.addresses: no address for server %d, which holds weights of stage %d", s, l.Stage)
		}
	}
	// Before the first step, so that its forwards compute with the
	// servers' weights; within connect_timeout, as a stage's links.
	ctx, cancel := context.WithTimeout(context.Background(), c.Transport.ConnectTimeout)
	defer cancel()
	if err := w.connect(ctx, rejoin); err != nil {
		return nil, fmt.Errorf("%s: %w", c.ProcessName(l.Stage, l.Replica), err)
	}
	return w, nil
}

// shard is the stage's tensors held by server s, in the stage's order,
// from each chunk's list (Weights or Gradients).
func (w *psWorker) shard(s int, lists [][]compute.Weight) []compute.Weight {
	var out []compute.Weight
	for _, ws := range lists {
		for _, wt := range ws {
			if w.owners[wt.Name] == s {
				out = append(out, wt)
			}
		}
	}
	return out
}

// connect says hello to each server with the stage's weights, which
// every worker holds alike at the start (the servers check). A worker
// that finds the servers further on (a late backup worker) pulls their
// weights before it computes, as does one that rejoins an async run at
// step rejoin (-1: none), whose weights the servers check by shape only.
func (w *psWorker) connect(ctx context.Context, rejoin int) error {
	opts, err := LinkOptions(w.cfg, w.stage)
	if err != nil {
		return err
	}
	half, err := WireDType(w.cfg, w.model)
	if err != nil {
		return err
	}
	weights := make([][]compute.Weight, len(w.chunks))
	for i, ch := range w.chunks {
		weights[i] = ch.Weights()
	}
	w.clients = map[int]*ps.Client{}
	for _, s := range w.servers {
		var cl *ps.Client
		if rejoin >= 0 {
			cl, err = ps.Rejoin(ctx, w.cfg.PSAddress(s), opts, w.worker, w.stage, int64(rejoin), w.shard(s, weights))
		} else {
			cl, err = ps.Dial(ctx, w.cfg.PSAddress(s), opts, w.worker, w.stage, 0, w.shard(s, weights))
		}
		if err != nil {
			w.close(ctx) // a bye to the servers that took it back
			return fmt.Errorf("%s: %w", configs.PSName(s), err)
		}
		w.clients[s] = cl
		if half != transport.Float32 && half != transport.Float64 {
			cl.Compress(half)
			w.halved = true
		}
	}
	for _, cl := range w.clients {
		if rejoin >= 0 || cl.Version() > 0 {
			_, err := w.pull(ctx, max(rejoin, 0))
			return err
		}
	}
	return nil
}

// eachServer runs f for each of the stage's servers at once and returns
// the first error.
func (w *psWorker) eachServer(f func(s int, cl *ps.Client) error) error {
	errs := make([]error, len(w.servers))
	var wg sync.WaitGroup
	for i, s := range w.servers {
		wg.Go(func() { errs[i] = f(s, w.clients[s]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("%s: %w", configs.PSName(w.servers[i]), err)
		}
	}
	return nil
}

// push sends the step's gradients to their servers, with the step's
// micro-batch losses (nil but on the stage that computes them), then
// zeroes them for the next step's sums, as an optimizer step would.
func (w *psWorker) push(ctx context.Context, step int, losses []float64) (dropped int, sent int64, err error) {
	grads := make([][]compute.Weight, len(w.chunks))
	for i, ch := range w.chunks {
		if grads[i], err = ch.Gradients(); err != nil {
			return 0, 0, err
		}
		sent += w.wireBytes(grads[i])
	}
	var mu sync.Mutex
	err = w.eachServer(func(s int, cl *ps.Client) error {
		d, err := cl.Push(ctx, int64(step), w.shard(s, grads), losses)
		if d {
			mu.Lock()
			dropped++
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	for i, ch := range w.chunks {
		for _, g := range grads[i] {
			g.Value.Zero()
		}
		if err := ch.LoadGradients(grads[i]); err != nil {
			return 0, 0, err
		}
	}
	return dropped, sent, nil
}

// wireBytes is what ws take on the wire to and from the servers.
func (w *psWorker) wireBytes(ws []compute.Weight) int64 {
	if w.halved {
		return weightBytes(ws) / 2
	}
	return weightBytes(ws)
}

// weightBytes is the payload of ws.
func weightBytes(ws []compute.Weight) int64 {
	var n int64
	for _, w := range ws {
		n += int64(w.Value.Shape().TotalSize()) * int64(w.Value.Dtype().Size())
	}
	return n
}

// pull waits until the servers have made every update before step and
// loads their weights into the stage's chunks. It returns the micro-batch
// losses of the last update's workers, in worker order, from the first of
// the stage's servers.
func (w *psWorker) pull(ctx context.Context, step int) ([]float64, error) {
	got := map[string]*tensor.Dense{}
	var losses []float64
	var mu sync.Mutex
	final := step == w.cfg.Train.Steps && w.cfg.ParameterServers.Mode == "async"
	err := w.eachServer(func(s int, cl *ps.Client) error {
		var p ps.Pulled
		var err error
		if final {
			// The others' pushes still change the weights after this
			// worker's last: its final weights are the servers' once all
			// have left.
			if err = cl.Leave(ctx); err == nil {
				p, err = cl.PullFinal(ctx)
			}
		} else {
			p, err = cl.Pull(ctx, int64(step))
		}
		mu.Lock()
		defer mu.Unlock()
		for _, wt := range p.Weights {
			got[wt.Name] = wt.Value
		}
		if s == w.servers[0] {
			losses = p.Losses
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, ch := range w.chunks {
		ws := ch.Weights()
		for i, wt := range ws {
			v, ok := got[wt.Name]
			if !ok {
				return nil, fmt.Errorf("the servers sent no weight %s", wt.Name)
			}
			ws[i].Value = v
		}
		if err := ch.LoadWeights(ws); err != nil {
			return nil, err
		}
	}
	return losses, nil
}

// end leaves the servers as the stage's run ended: with a bye once it
// trained to the end (or stopped where the launcher asked), without one
// when it failed, so that the servers note the worker's departure as
// they do a killed one's.
func (w *psWorker) end(ctx context.Context, err error) {
	if w == nil {
		return
	}
	if err == nil || errors.Is(err, ErrPaused) {
		w.close(ctx)
		return
	}
	for _, cl := range w.clients {
		cl.Abort()
	}
}

// close says bye to every server.
func (w *psWorker) close(ctx context.Context) {
	if w == nil {
		return
	}
	for _, cl := range w.clients {
		cl.Close(ctx)
	}
}

// psStep ends a worker stage's step: the push of its gradients and the
// pull of the weights the next step computes with, in place of the
// optimizer step. The stage connects at its first step.
func (r *Runtime) psStep(ctx context.Context, step int) error {
	w := r.ps
	if w.beforePush != nil {
		w.beforePush(step)
	}
	if w.slow {
		time.Sleep(r.live.stepCompute()) // as long again as its compute took
	}
	t0 := time.Now()
	var losses []float64
	if r.holdsLoss() {
		losses = r.losses
	}
	dropped, sent, err := w.push(ctx, step, losses)
	if err != nil {
		return fmt.Errorf("pushing the gradients: %w", err)
	}
	if dropped > 0 {
		w.dropped += int64(dropped)
		fmt.Fprintf(r.log, "%s: step %d's gradients came after the update of %s, which dropped them (backup workers)\n",
			r.name(), step+1, words.Count(dropped, "server"))
	}
	t1 := time.Now()
	all, err := w.pull(ctx, step+1)
	if err != nil {
		return fmt.Errorf("pulling the weights: %w", err)
	}
	if r.holdsLoss() && len(all) == r.scaleMBs {
		// The whole batch's losses, when the update summed every
		// worker's step (sync, and async with max_staleness 0), as the
		// replicas' ring gathers them; else this worker's own.
		r.losses = all
	}
	t2 := time.Now()
	var pulled int64
	for _, ch := range w.chunks {
		pulled += w.wireBytes(ch.Weights())
	}
	stale := w.staleness()
	r.live.action(runlog.Optimizer, t2.Sub(t0), 0, r.inFlight())
	r.live.sentOn("servers", sent)
	r.live.receivedOn("servers", pulled)
	r.live.serversStep(t1.Sub(t0), t2.Sub(t1), stale)
	return r.events.add(runlog.Event{Stage: r.stage, Replica: r.replica, Step: step, Kind: runlog.Optimizer,
		StartNS: t0.UnixNano(), EndNS: t2.UnixNano(), WaitNS: t2.Sub(t1).Nanoseconds(), BytesSent: sent, Dropped: dropped,
		Servers: len(w.servers), BytesPulled: pulled, PushNS: t1.Sub(t0).Nanoseconds(), Staleness: stale})
}

// staleness is the last push's: the most updates any of the stage's
// servers made between the weights it pulled and the push's own update.
func (w *psWorker) staleness() int64 {
	var most int64
	for _, cl := range w.clients {
		most = max(most, cl.Staleness())
	}
	return most
}

// sumWorkerShares is the reference's sum of the replicas' shares under
// parameter servers: in worker order, of the workers whose pushes the
// servers keep (Layout.PSKept; every worker's without it).
func (rs *replicaSync) sumWorkerShares(step, chunk int) error {
	ws, grads, err := stepGrads(rs.chunks[chunk])
	if err != nil {
		return err
	}
	kept := make([]int, len(rs.shares))
	for i := range kept {
		kept[i] = i
	}
	if rs.layout.PSKept != nil {
		kept = rs.layout.PSKept(step)
	}
	out := flatten(grads, nil)
	for k, w := range kept {
		switch v := out.(type) {
		case []float32:
			sumInto(k == 0, v, rs.shares[w].([]float32))
		case []float64:
			sumInto(k == 0, v, rs.shares[w].([]float64))
		}
	}
	unflatten(out, grads)
	rs.gradsDone = 0
	return rs.chunks[chunk].LoadGradients(ws)
}

func sumInto[T float32 | float64](first bool, acc, v []T) {
	if first {
		copy(acc, v)
		return
	}
	for i := range acc {
		acc[i] += v[i]
	}
}

// PSServedStages lists the pipeline stages with tensors on server i.
func PSServedStages(c *configs.Config, i int) ([]int, error) {
	shares, err := PSShares(c)
	if err != nil {
		return nil, err
	}
	return shares[i].Stages, nil
}

// ServePS runs parameter server i of the config: it serves the workers'
// streams at its address, guarded like the links, until every worker
// stage it holds tensors of has finished, writes its part of each
// checkpoint under runDir, and logs what it did: its summary in log, its
// events in runDir's events/ps-<i>.jsonl (appended to on resume), and its
// metrics at its metrics address, if it has one. With resume it starts
// from its part of the newest committed checkpoint there.
func ServePS(ctx context.Context, c *configs.Config, i int, runDir string, resume bool, log io.Writer) (err error) {
	if !c.PSEnabled() || i < 0 || i >= c.ParameterServers.Count {
		return fmt.Errorf("%s has parameter_servers.count %d: no server %d", c.Path, c.ParameterServers.Count, i)
	}
	served, err := PSServedStages(c, i)
	if err != nil {
		return err
	}
	opts, err := LinkOptions(c, 0)
	if err != nil {
		return err
	}
	addr := c.PSAddress(i)
	var job *Joined
	if c.PSRanks() {
		if job, err = joinAsServer(ctx, c, i, runDir, log); err != nil {
			return err
		}
		addr, opts.Listener = job.lis.Addr().String(), job.lis
	} else if addr == "" {
		return fmt.Errorf("parameter_servers.addresses: no address for server %d", i)
	}
	settings := PSSettings(c, i)
	settings.CheckpointAt = psCheckpointAt(c)
	srv := ps.NewServer(settings)
	from := 0
	var coord Coordinator // nil: the stages commit on the shared run directory
	if job != nil {
		coord = job.coord
	}
	if resume && coord != nil {
		if from, err = restorePSAgreed(ctx, c, i, srv, runDir, coord, log); err != nil {
			return fmt.Errorf("%s: resuming: %w", configs.PSName(i), err)
		}
	} else if resume {
		if from, err = restorePS(c, i, srv, runDir, log); err != nil {
			return fmt.Errorf("%s: resuming: %w", configs.PSName(i), err)
		}
	}
	applied := observeWorkers(srv, i, c.ParameterServers.Mode == "async", log)
	var events *psEventLog
	if runDir != "" {
		if events, err = openPSEventLog(runDir, i, resume); err != nil {
			return fmt.Errorf("%s: %w", configs.PSName(i), err)
		}
		defer func() {
			if cerr := events.close(); err == nil && cerr != nil {
				err = fmt.Errorf("%s: event log %w", configs.PSName(i), cerr)
			}
		}()
	}
	metrics := NewPSMetrics(i, served, c.Replicas())
	recordServer(srv, events, metrics)
	stopMetrics, err := servePSMetrics(c, i, metrics, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	ss, err := srv.Serve(addr, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", configs.PSName(i), err)
	}
	defer ss.Close()
	start := time.Now()
	fmt.Fprintf(log, "%s: serving stages %v of %d workers at %s (%s)\n", configs.PSName(i), served, c.Replicas(), ss.Addr(), cmp.Or(c.ParameterServers.Mode, "sync"))
	// A checkpoint that cannot be written stops the server, as it stops a
	// stage: the run must not go on without the checkpoints it was asked for.
	run, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	written := make(chan error, 1)
	go func() {
		err := writePSCheckpoints(run, c, i, srv, len(served), runDir, from, coord)
		if err != nil {
			stop(err)
		}
		written <- err
	}()
	if err := srv.Finished(run, len(served)); err != nil {
		return fmt.Errorf("%s: %w", configs.PSName(i), err)
	}
	if err := <-written; err != nil {
		return fmt.Errorf("%s: %w", configs.PSName(i), err)
	}
	for _, st := range served {
		var dropped int64
		for w := range c.Replicas() {
			dropped += srv.Dropped(st, w)
		}
		fmt.Fprintf(log, "%s: stage %d: %d updates, %d pushes dropped; pushes by staleness (updates): %s; pushes applied by worker: %s\n",
			configs.PSName(i), st, srv.Updates(st), dropped, histogram(srv.Staleness(st)), applied.of(st))
	}
	if job != nil {
		// Rank 0 waits for every rank's word that its logs are in.
		if err := job.Gather(ctx, c, runDir, log); err != nil {
			return fmt.Errorf("%s: %w", configs.PSName(i), err)
		}
	}
	fmt.Fprintf(log, "%s: done in %.1fs\n", configs.PSName(i), time.Since(start).Seconds())
	return nil
}

// appliedPushes counts each worker's pushes applied, per stage.
type appliedPushes struct {
	mu sync.Mutex
	n  map[int]map[int64]int64 // stage -> worker -> pushes
}

// of writes stage's counts as "0: 20, 1: 20, 2: 7", workers in order.
func (a *appliedPushes) of(stage int) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return histogram(a.n[stage])
}

// observeWorkers has the server count each worker's applied pushes and
// log a worker that leaves without its goodbye (killed, failed, or its
// connection lost), which the others go on without in async mode, and
// one that rejoins.
func observeWorkers(srv *ps.Server, i int, async bool, log io.Writer) *appliedPushes {
	a := &appliedPushes{n: map[int]map[int64]int64{}}
	srv.Observe = func(e ps.Event) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if e.Departed {
			then := "sync mode waits for every worker, so the run stops"
			if async {
				then = "the other workers go on without it"
			}
			fmt.Fprintf(log, "%s: stage %d of worker %d left without its goodbye (killed, failed, or its connection lost) after %s applied; %s\n",
				configs.PSName(i), e.Stage, e.Dropped, words.Count(int(a.n[e.Stage][int64(e.Dropped)]), "push"), then)
			return
		}
		if e.Rejoined {
			fmt.Fprintf(log, "%s: stage %d of worker %d rejoined, restarted: it trains from step %d on, from the weights of update %d\n",
				configs.PSName(i), e.Stage, e.Dropped, e.Step+1, e.Version)
			return
		}
		if e.Update == nil {
			return
		}
		if a.n[e.Stage] == nil {
			a.n[e.Stage] = map[int64]int64{}
		}
		for _, w := range e.Update.Workers {
			a.n[e.Stage][int64(w)]++
		}
	}
	return a
}

// histogram writes counts by value as "0: 12, 1: 3", values in order.
func histogram(h map[int64]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, fmt.Sprintf("%d: %d", k, h[k]))
	}
	return strings.Join(parts, ", ")
}

// PSShare is what one parameter server holds.
type PSShare struct {
	Stages  []int // the pipeline stages whose tensors it holds
	Tensors int
	Bytes   int64
}

// PSShares is what each of the config's servers holds.
func PSShares(c *configs.Config) ([]PSShare, error) {
	out := make([]PSShare, c.ParameterServers.Count)
	for st := range c.Stages {
		l, err := NewLayout(c, st)
		if err != nil {
			return nil, err
		}
		owners, err := PSOwners(c, l.Model)
		if err != nil {
			return nil, err
		}
		layers, err := layerTensors(l.Model)
		if err != nil {
			return nil, err
		}
		for _, r := range l.Ranges {
			for _, t := range slices.Concat(layers[r[0]:r[1]]...) {
				sh := &out[owners[t.Name]]
				if !slices.Contains(sh.Stages, st) {
					sh.Stages = append(sh.Stages, st)
				}
				sh.Tensors++
				sh.Bytes += t.Bytes
			}
		}
	}
	return out, nil
}
