package stages

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// fakeCompute is a Computer with no model: every tensor is one float32 that
// says where it was made, so a test can tell whether each action got the
// tensor the schedule routes to it. A forward of micro-batch i on model stage
// k sends actValue(i, k); a full or input-gradient backward sends
// gradValue(i, k).
type fakeCompute struct {
	p, v  int
	top   schedule.Topology // Loop unless set
	ran   []schedule.Action
	wrong []string // actions that got another tensor than their own
	// reduced lists, per ReduceGrad op, the chunk and how many of its
	// actions had run by then.
	reduced [][2]int
}

func actValue(mb, ms int) float32  { return float32(100*mb + ms) }
func gradValue(mb, ms int) float32 { return float32(10000 + 100*mb + ms) }

func (f *fakeCompute) Compute(step int, a schedule.Action, in *tensor.Dense) (*tensor.Dense, string, error) {
	f.ran = append(f.ran, a)
	top := f.top
	if top.Stages == 0 {
		top = schedule.Topology{Stages: f.p, Chunks: f.v}
	}
	ms, last := top.ModelStageOf(a), f.p*f.v-1
	expect := func(want float32) {
		if in == nil || in.Data().([]float32)[0] != want {
			f.wrong = append(f.wrong, fmt.Sprintf("step %d %v got %v, want %v", step, a, in, want))
		}
	}
	one := func(v float32) *tensor.Dense {
		return tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{v}))
	}
	switch a.Kind {
	case schedule.Forward:
		if ms > 0 {
			expect(actValue(a.MicroBatch, ms-1))
		}
		if ms == last {
			return nil, "F", nil
		}
		return one(actValue(a.MicroBatch, ms)), "F", nil
	case schedule.Backward, schedule.Input:
		if ms < last {
			expect(gradValue(a.MicroBatch, ms+1))
		}
		if ms == 0 {
			return nil, a.Kind.String(), nil
		}
		return one(gradValue(a.MicroBatch, ms)), a.Kind.String(), nil
	}
	return nil, "W", nil
}

func (f *fakeCompute) SyncTied(context.Context, int, schedule.Op) error { return nil }
func (f *fakeCompute) ClipNorm(context.Context, int) error              { return nil }

func (f *fakeCompute) ReduceGrad(_ context.Context, _, chunk int) error {
	n := 0
	for _, a := range f.ran {
		if a.Chunk == chunk {
			n++
		}
	}
	f.reduced = append(f.reduced, [2]int{chunk, n})
	return nil
}

// fakeHellos are the handshakes of stage s's links in a p-stage, v-chunk
// pipeline whose tensors are all of shape [1].
func fakeHellos(p, v, s int) (up, down transport.Hello) {
	return fakeHellosIn(schedule.Topology{Stages: p, Chunks: v}, s)
}

// fakeHellosIn is fakeHellos under any placement: a link carries one tag
// per boundary whose activation crosses it (see LinkShapes).
func fakeHellosIn(top schedule.Topology, s int) (up, down transport.Hello) {
	p := top.Stages
	tags := func(from int) [][]int {
		var out [][]int
		for k := 0; k+1 < top.ModelStages(); k++ {
			a, _ := top.Locate(k)
			b, _ := top.Locate(k + 1)
			if d, ok := linkDialer(top, a, b); ok && d == from {
				out = append(out, []int{1})
			}
		}
		return out
	}
	hello := func(from int) transport.Hello {
		return transport.Hello{Stage: s, Stages: p, ConfigDigest: "fake", DType: transport.Float32, Shapes: tags(from), Ring: top.Ring(false)}
	}
	return hello((s + p - 1) % p), hello(s)
}

// fakePipeline connects p executors of a lowered schedule by in-memory links,
// each with a fakeCompute.
func fakePipeline(t *testing.T, l *schedule.Lowered) ([]*executor, []*fakeCompute) {
	t.Helper()
	p, v, top := l.Stages, l.Chunks, l.Topology()
	prev, next := make([]*peer, p), make([]*peer, p)
	for s := range p {
		if s+1 == p && !top.Ring(false) {
			break
		}
		_, down := fakeHellosIn(top, s)
		up, _ := fakeHellosIn(top, (s+1)%p)
		a, b := transport.Pipe(down, up, 2)
		t.Cleanup(func() { a.Close(); b.Close() })
		next[s] = newPeer(a, transport.Gradient, 10*time.Second)
		prev[(s+1)%p] = newPeer(b, transport.Activation, 10*time.Second)
		next[s].microBatches, prev[(s+1)%p].microBatches = l.MicroBatches, l.MicroBatches
	}
	var xs []*executor
	var fakes []*fakeCompute
	for s := range p {
		f := &fakeCompute{p: p, v: v, top: top}
		x := newExecutor(s, p, l.Ops[s], prev[s], next[s], f, nil)
		x.top = top
		if err := x.check(l.Ops[s]); err != nil {
			t.Fatal(err)
		}
		xs, fakes = append(xs, x), append(fakes, f)
	}
	return xs, fakes
}

// TestExecutorRoutesEveryBuiltin runs every built-in schedule, lowered, over
// executors joined by in-memory links and computing nothing: for two steps,
// every stage must run exactly its compute actions in its order, and every
// action must get the very tensor its schedule routes to it.
func TestExecutorRoutesEveryBuiltin(t *testing.T) {
	for _, name := range schedule.Names() {
		for p := 1; p <= 4; p++ {
			for m := 1; m <= 8; m++ {
				for v := 1; v <= 2; v++ {
					s, err := schedule.Build(name, p, m, v)
					if err != nil {
						continue // a size this schedule does not take
					}
					l, err := schedule.Lower(s)
					if err != nil {
						t.Fatal(err)
					}
					t.Run(fmt.Sprintf("%s/p%d/m%d/v%d", name, p, m, v), func(t *testing.T) {
						runFakePipeline(t, s, l, 2)
					})
				}
			}
		}
	}
}

func runFakePipeline(t *testing.T, s *schedule.Schedule, l *schedule.Lowered, steps int) {
	t.Helper()
	xs, fakes := fakePipeline(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, len(xs))
	var wg sync.WaitGroup
	for i, x := range xs {
		wg.Go(func() {
			for step := range steps {
				if errs[i] = x.run(ctx, step); errs[i] != nil {
					cancel() // the others would wait for it
					return
				}
			}
		})
	}
	wg.Wait()
	for i, f := range fakes {
		if errs[i] != nil {
			t.Fatalf("stage %d: %v", i, errs[i])
		}
		want := slices.Repeat(s.Actions[i], steps)
		if !slices.Equal(f.ran, want) {
			t.Errorf("stage %d ran %v, want %v", i, f.ran, want)
		}
		if len(f.wrong) > 0 {
			t.Errorf("stage %d: %v", i, f.wrong)
		}
		// Each chunk's gradients are reduced once a step, when every one of
		// its actions of the step has run.
		perStep := map[int]int{}
		for _, a := range s.Actions[i] {
			perStep[a.Chunk]++
		}
		if len(f.reduced) != steps*len(perStep) {
			t.Errorf("stage %d reduced %v, want each of its %d chunks once a step", i, f.reduced, len(perStep))
		}
		seen := map[int]int{}
		for _, r := range f.reduced {
			seen[r[0]]++
			if want := seen[r[0]] * perStep[r[0]]; r[1] != want {
				t.Errorf("stage %d reduced chunk %d after %d of its actions, want %d", i, r[0], r[1], want)
			}
		}
	}
}

// TestExecutorMessagesInAndOut plays stages 0 and 2 around stage 1 of a
// 3-stage 1F1B: the activations fed in produce exactly the gradients the
// lowered schedule says, in its order, with its tags.
func TestExecutorMessagesInAndOut(t *testing.T) {
	s, err := schedule.Build("1f1b", 3, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := schedule.Lower(s)
	if err != nil {
		t.Fatal(err)
	}
	_, down0 := fakeHellos(3, 1, 0)
	up1, down1 := fakeHellos(3, 1, 1)
	up2, _ := fakeHellos(3, 1, 2)
	test0, link0 := transport.Pipe(down0, up1, 8) // the test plays stage 0
	link2, test2 := transport.Pipe(down1, up2, 8) // and stage 2
	f := &fakeCompute{p: 3, v: 1}
	x := newExecutor(1, 3, l.Ops[1], newPeer(link0, transport.Activation, 5*time.Second), newPeer(link2, transport.Gradient, 5*time.Second), f, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for mb := range 3 {
		a, _ := transport.FromFloat32s(transport.Activation, 0, int32(mb), []int{1}, []float32{actValue(mb, 0)})
		g, _ := transport.FromFloat32s(transport.Gradient, 0, int32(mb), []int{1}, []float32{gradValue(mb, 2)})
		if err := test0.Send(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := test2.Send(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if len(f.wrong) > 0 {
		t.Fatal(f.wrong)
	}
	// Out of stage 1: micro-batch i's activation to stage 2 and its
	// gradient to stage 0, each in the order of stage 1's ops.
	var wantDown, wantUp []string
	for _, o := range l.Ops[1] {
		switch o.Kind {
		case schedule.SendAct:
			wantDown = append(wantDown, fmt.Sprintf("activation mb%d tag%d %v", o.Action.MicroBatch, o.Tag(3), actValue(o.Action.MicroBatch, 1)))
		case schedule.SendGrad:
			wantUp = append(wantUp, fmt.Sprintf("gradient mb%d tag%d %v", o.Action.MicroBatch, o.Tag(3), gradValue(o.Action.MicroBatch, 1)))
		}
	}
	got := func(l transport.Link, n int) []string {
		var out []string
		for range n {
			m, err := l.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%v mb%d tag%d %v", m.Kind, m.MicroBatch, m.Chunk, m.Float32s()[0]))
		}
		return out
	}
	if down := got(test2, len(wantDown)); !slices.Equal(down, wantDown) {
		t.Errorf("to stage 2: %v, want %v", down, wantDown)
	}
	if up := got(test0, len(wantUp)); !slices.Equal(up, wantUp) {
		t.Errorf("to stage 0: %v, want %v", up, wantUp)
	}
	if want := s.Actions[1]; !slices.Equal(f.ran, want) {
		t.Errorf("ran %v, want %v", f.ran, want)
	}
}
