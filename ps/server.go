package ps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/transport"
)

// Service is the servers' gRPC stream service: guarded like every link
// (transport.Service).
var Service = transport.Service{Name: "pipetrain.ps.ParameterServer", Noun: "parameter server"}

// Settings configure a server.
type Settings struct {
	// Index is the server's place among the servers, for messages.
	Index int
	Rule  Rule
	// Optimizer is the run's (train.optimizer), applied to each stage's
	// tensors in the order the stage holds them, as the stage would.
	Optimizer optim.Spec
	// LR is the learning rate of the update of a step (the run's schedule).
	LR func(step int64) float64
	// Threads share each large tensor's update (optim.SetWorkers); the
	// bits do not depend on it.
	Threads int
	// CheckpointAt, if set, names the versions (updates made) after which
	// the server keeps a copy of a group's state for a checkpoint
	// (Snapshot): a copy made as the update is, before any later push can
	// change the group.
	CheckpointAt func(version int64) bool
}

// Event is what a server reports of its updates and drops (Server.Observe).
type Event struct {
	Stage  int
	Update *Update // nil for a drop or a departure
	// Dropped is the worker whose push was dropped, or which departed or
	// rejoined, when Update is nil.
	Dropped int
	// Departed: the worker's stream ended without a bye.
	Departed bool
	// Rejoined: the worker, restarted after it left, is back, computing
	// from Step on; Version is the update its first pull gets.
	Rejoined bool
	Step     int64
	Version  int64
	// Start and End bound an update's sum and optimizer step: the
	// server's work. Zero for a drop or a departure.
	Start, End time.Time
	// Bytes is what the update's pushes, or the dropped push, carried on
	// the wire.
	Bytes int64
}

// Pull is a pull the server answered (Server.ObservePull).
type Pull struct {
	Stage, Worker int
	// Step is the step the worker is about to compute; -1 for the final
	// weights.
	Step int64
	// Asked is when the request came, Ready when its weights were ready
	// to send: Waited of it went by waiting for updates.
	Asked, Ready time.Time
	Waited       time.Duration
	// Bytes is what the weights take on the wire.
	Bytes int64
}

// Server holds its shard of the weights and optimizer state, one group
// per pipeline stage it serves, and answers the workers' pushes and
// pulls. Each group's Machine decides the updates; the server sums the
// gradients they name, in worker order, and steps the optimizer.
type Server struct {
	set Settings
	// Observe, if set, hears each update and drop, under the server's
	// lock, in the order they happen.
	Observe func(Event)
	// ObservePull, if set, hears each pull answered, under the server's
	// lock.
	ObservePull func(Pull)

	mu      sync.Mutex
	changed chan struct{} // closed and replaced after each update
	groups  map[int]*group
	err     error // a failed update: every later request gets it
	// snaps are the groups' states kept for checkpoints, by version and
	// stage, until Snapshot takes them.
	snaps map[int64]map[int]GroupState
}

// group is one stage's tensors on this server.
type group struct {
	names  []string
	params []*tensor.Dense
	sums   []*tensor.Dense
	grads  [][]*tensor.Dense // each worker's push of the step in progress, nil when none
	// pushed is what each worker's push of the step in progress carried
	// on the wire.
	pushed []int64
	opt    *optim.Optimizer
	m      *Machine
	// losses are each worker's micro-batch losses pushed with the step in
	// progress, and lastLosses the last update's workers', in worker
	// order: what pulls answer with.
	losses     [][]float64
	lastLosses []float64
	// staleness counts the pushes applied by how many updates stale they
	// were (Update.Staleness).
	staleness map[int64]int64
}

// NewServer makes an empty server; the workers' hellos bring the tensors.
func NewServer(s Settings) *Server {
	return &Server{set: s, changed: make(chan struct{}), groups: map[int]*group{}, snaps: map[int64]map[int]GroupState{}}
}

// Serve serves the workers' streams at addr with o's security until
// the returned server is closed.
func (s *Server) Serve(addr string, o transport.Options) (*transport.ServiceServer, error) {
	return Service.Serve(addr, o, s.handle)
}

func (s *Server) name() string { return fmt.Sprintf("parameter server %d", s.set.Index) }

// handle serves one worker stage's stream.
func (s *Server) handle(st *transport.ServiceStream) error {
	var joined *header // the stream's hello; nil once it said bye
	defer func() {
		if joined != nil {
			// Gone without a bye (killed, failed, or its connection lost): in
			// async mode the others stop waiting for it.
			s.depart(*joined)
		}
	}()
	for {
		h, err := recv(st)
		if err != nil {
			return err
		}
		var reply header
		switch h.op {
		case opHello:
			if reply, err = s.hello(h); err == nil && !reply.final {
				joined = &header{worker: h.worker, stage: h.stage}
			}
		case opPush:
			reply, err = s.push(h)
		case opPull:
			reply, err = s.pull(st.Context(), h)
		case opLeave:
			reply, err = header{op: opOK}, s.leave(h)
		case opBye:
			joined = nil
			if err := s.leave(h); err != nil {
				return fmt.Errorf("%s, worker %d stage %d: %w", s.name(), h.worker, h.stage, err)
			}
			return st.Send(header{op: opOK}.marshal())
		default:
			err = fmt.Errorf("unknown request %d", h.op)
		}
		if err != nil {
			return fmt.Errorf("%s, worker %d stage %d: %w", s.name(), h.worker, h.stage, err)
		}
		if err := send(st, reply); err != nil {
			return err
		}
	}
}

// hello registers a worker stage: the first brings the group's tensors
// and their values at version h.step; every other must list the same
// tensors, with the same values while the group is at that version.
func (s *Server) hello(h header) (header, error) {
	if h.worker < 0 || h.worker >= s.set.Rule.Workers {
		return header{}, fmt.Errorf("no such worker: the workers are 0-%d", s.set.Rule.Workers-1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[h.stage]
	if h.rejoin {
		return s.rejoin(g, h)
	}
	if !ok {
		var err error
		if g, err = s.newGroup(h.tensors, int64(h.step)); err != nil {
			return header{}, err
		}
		s.groups[h.stage] = g
		return header{op: opOK, step: g.m.Version()}, nil
	}
	if g.m.Left(h.worker) {
		return header{}, errors.New("the worker left the run; a worker restarted since says hello as a rejoin")
	}
	// Weights from the same version must hold the same bits; a worker
	// that says hello after an update (a late backup worker) is checked
	// by name and shape only, and pulls the newer weights.
	if err := g.same(h.tensors, g.m.Version() == h.step); err != nil {
		return header{}, fmt.Errorf("initial weights: %w", err)
	}
	return header{op: opOK, step: g.m.Version()}, nil
}

// rejoin takes back a worker stage restarted after its worker left an
// async run. Its weights are checked by name and shape only: the group's
// have moved on since the start, and the worker pulls them before its
// first step. Once every worker has left, the answer says the run is over
// (final) rather than refusing: the worker has nothing left to do.
func (s *Server) rejoin(g *group, h header) (header, error) {
	if g == nil {
		return header{}, errors.New("a rejoin before any worker's hello")
	}
	if err := g.same(h.tensors, false); err != nil {
		return header{}, fmt.Errorf("rejoining: %w", err)
	}
	err := g.m.Rejoin(h.worker, h.step)
	if errors.Is(err, ErrOver) {
		return header{op: opOK, step: g.m.Version(), final: true}, nil
	}
	if err != nil {
		return header{}, err
	}
	s.observe(Event{Stage: h.stage, Rejoined: true, Dropped: h.worker, Step: h.step, Version: g.m.Version()})
	return header{op: opOK, step: g.m.Version()}, nil
}

func (s *Server) newGroup(ts []engine.Weight, version int64) (*group, error) {
	m, err := NewMachine(s.set.Rule, version)
	if err != nil {
		return nil, err
	}
	g := &group{m: m, grads: make([][]*tensor.Dense, s.set.Rule.Workers), pushed: make([]int64, s.set.Rule.Workers), losses: make([][]float64, s.set.Rule.Workers), staleness: map[int64]int64{}}
	var shapes []tensor.Shape
	for _, t := range ts {
		g.names = append(g.names, t.Name)
		g.params = append(g.params, t.Value)
		g.sums = append(g.sums, tensor.New(tensor.Of(t.Value.Dtype()), tensor.WithShape(t.Value.Shape()...)))
		shapes = append(shapes, t.Value.Shape().Clone())
	}
	if len(ts) == 0 {
		return nil, errors.New("a hello with no tensors")
	}
	if g.opt, err = optim.NewNamed(s.set.Optimizer, ts[0].Value.Dtype(), g.names, shapes); err != nil {
		return nil, err
	}
	g.opt.SetWorkers(s.set.Threads)
	g.opt.SetSteps(version)
	return g, nil
}

// same checks that ts are the group's tensors (and, with values, hold
// the same bits).
func (g *group) same(ts []engine.Weight, values bool) error {
	if len(ts) != len(g.names) {
		return fmt.Errorf("%d tensors, the group %d", len(ts), len(g.names))
	}
	for i, t := range ts {
		p := g.params[i]
		if t.Name != g.names[i] || !t.Value.Shape().Eq(p.Shape()) || t.Value.Dtype() != p.Dtype() {
			return fmt.Errorf("tensor %d is %s %v %v, the group's %s %v %v", i, t.Name, t.Value.Shape(), t.Value.Dtype(), g.names[i], p.Shape(), p.Dtype())
		}
		if values && !slices.Equal(bytesOf(t.Value), bytesOf(p)) {
			return fmt.Errorf("%s differs from the first worker's", t.Name)
		}
	}
	return nil
}

// push feeds a worker's gradients to its group's Machine, and makes the
// update the push completes.
func (s *Server) push(h header) (header, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return header{}, s.err
	}
	g, ok := s.groups[h.stage]
	if !ok {
		return header{}, errors.New("a push before the stage's hello")
	}
	if err := g.same(h.tensors, false); err != nil {
		return header{}, fmt.Errorf("gradients of step %d: %w", h.step+1, err)
	}
	up, dropped, err := g.m.Push(h.worker, h.step)
	if err != nil {
		return header{}, err
	}
	if dropped {
		s.observe(Event{Stage: h.stage, Dropped: h.worker, Step: h.step, Bytes: h.payload()})
		return header{op: opOK, step: g.m.Version(), dropped: true}, nil
	}
	grads := make([]*tensor.Dense, len(h.tensors))
	for i, t := range h.tensors {
		grads[i] = t.Value
	}
	g.grads[h.worker], g.losses[h.worker], g.pushed[h.worker] = grads, h.losses, h.payload()
	if err := s.update(h.stage, g, up); err != nil {
		return header{}, err
	}
	return header{op: opOK, step: g.m.Version()}, nil
}

// update makes up (nil: nothing to make) and wakes the waiting pulls.
func (s *Server) update(stage int, g *group, up *Update) error {
	if up == nil {
		return nil
	}
	start := time.Now()
	var bytes int64
	for _, w := range up.Workers {
		bytes += g.pushed[w]
	}
	if err := s.apply(g, up); err != nil {
		s.err = fmt.Errorf("update of step %d: %w", up.Step+1, err)
		return s.err
	}
	end := time.Now()
	if err := s.keep(stage, g); err != nil {
		s.err = err
		return s.err
	}
	s.observe(Event{Stage: stage, Update: up, Step: up.Step, Start: start, End: end, Bytes: bytes})
	s.wake()
	return nil
}

// wake tells the waiting pulls that something changed.
func (s *Server) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// depart records that a worker stage's stream ended without a bye.
func (s *Server) depart(h header) {
	s.mu.Lock()
	s.observe(Event{Stage: h.stage, Departed: true, Dropped: h.worker})
	s.mu.Unlock()
	s.leave(h)
}

// leave records a worker stage's bye: in async mode the others stop
// waiting for it.
func (s *Server) leave(h header) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[h.stage]
	if !ok {
		return nil
	}
	defer s.wake() // final pulls wait for the last to leave
	return s.update(h.stage, g, g.m.Leave(h.worker))
}

func (s *Server) observe(e Event) {
	if s.Observe != nil {
		s.Observe(e)
	}
}

// apply sums the update's gradients in worker order, (g0 + g1) + g2 ...,
// as the one-process reference sums the replicas' shares, and steps the
// optimizer with the step's learning rate.
func (s *Server) apply(g *group, up *Update) error {
	for i, sum := range g.sums {
		for k, w := range up.Workers {
			switch v := sum.Data().(type) {
			case []float32:
				accumulate(k == 0, v, g.grads[w][i].Data().([]float32))
			case []float64:
				accumulate(k == 0, v, g.grads[w][i].Data().([]float64))
			}
		}
	}
	for _, st := range up.Staleness {
		g.staleness[st]++
	}
	g.lastLosses = nil
	for _, w := range up.Workers {
		g.lastLosses = append(g.lastLosses, g.losses[w]...)
	}
	for w := range g.grads {
		g.grads[w], g.losses[w], g.pushed[w] = nil, nil, 0
	}
	if s.set.LR != nil {
		g.opt.SetLR(s.set.LR(up.Step))
	}
	return g.opt.Step(g.params, g.sums)
}

// accumulate sets acc = v (first) or acc = acc + v.
func accumulate[T float32 | float64](first bool, acc, v []T) {
	if first {
		copy(acc, v)
		return
	}
	for i := range acc {
		acc[i] += v[i]
	}
}

// pull waits until the worker may compute step h.step, then answers with
// the group's weights.
func (s *Server) pull(ctx context.Context, h header) (header, error) {
	asked := time.Now()
	var waited time.Duration
	for {
		s.mu.Lock()
		if s.err != nil {
			s.mu.Unlock()
			return header{}, s.err
		}
		g, ok := s.groups[h.stage]
		if !ok {
			s.mu.Unlock()
			return header{}, errors.New("a pull before the stage's hello")
		}
		if (!h.final && g.m.Pullable(h.worker, h.step)) || (h.final && g.m.Done()) {
			g.m.Pulled(h.worker)
			out := header{op: opWeights, step: g.m.Version(), losses: slices.Clone(g.lastLosses), half: h.half}
			for i, p := range g.params {
				out.tensors = append(out.tensors, engine.Weight{Name: g.names[i], Value: p.Clone().(*tensor.Dense)})
			}
			s.observePull(h, asked, waited, out.payload())
			s.mu.Unlock()
			return out, nil
		}
		changed := s.changed
		s.mu.Unlock()
		t := time.Now()
		select {
		case <-changed:
			waited += time.Since(t)
		case <-ctx.Done():
			return header{}, context.Cause(ctx)
		}
	}
}

// observePull tells ObservePull of a pull answered.
func (s *Server) observePull(h header, asked time.Time, waited time.Duration, bytes int64) {
	if s.ObservePull == nil {
		return
	}
	step := h.step
	if h.final {
		step = -1
	}
	s.ObservePull(Pull{Stage: h.stage, Worker: h.worker, Step: step, Asked: asked, Ready: time.Now(), Waited: waited, Bytes: bytes})
}

// Weights are the server's tensors of every stage, by name: for tests and
// checkpoints.
func (s *Server) Weights() map[string]*tensor.Dense {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]*tensor.Dense{}
	for _, g := range s.groups {
		for i, p := range g.params {
			out[g.names[i]] = p.Clone().(*tensor.Dense)
		}
	}
	return out
}

// Finished waits until groups groups have every worker gone (each
// worker stage said bye or leave) with its pushes applied: the run's
// training is over.
func (s *Server) Finished(ctx context.Context, groups int) error {
	for {
		s.mu.Lock()
		done, changed := s.finished(groups), s.changed
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// finished says whether groups groups have every worker gone with its
// pushes applied; under s.mu.
func (s *Server) finished(groups int) bool {
	done := len(s.groups) >= groups
	for _, g := range s.groups {
		done = done && g.m.Done()
	}
	return done
}

// Updates is how many updates stage's group has made.
func (s *Server) Updates(stage int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.groups[stage]; ok {
		return g.m.Version()
	}
	return 0
}

// Staleness is stage's histogram of the pushes applied: how many were
// applied how many updates after the weights they were computed from.
func (s *Server) Staleness(stage int) map[int64]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.groups[stage]; ok {
		return maps.Clone(g.staleness)
	}
	return nil
}

// Dropped is how many of worker w's pushes to stage's group were dropped.
func (s *Server) Dropped(stage, w int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.groups[stage]; ok {
		return g.m.Dropped(w)
	}
	return 0
}
