package ps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/transport"
)

func vec(name string, v ...float32) []engine.Weight {
	return []engine.Weight{{Name: name, Value: tensor.New(tensor.WithBacking(v), tensor.WithShape(len(v)))}}
}

// TestServerSumsPushesAndServesPulls: two workers push over the
// authenticated stream; the pull of step 1 waits for both and returns
// w - lr·(g0 + g1); a dialer without the token is refused.
func TestServerSumsPushesAndServesPulls(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := NewServer(Settings{Rule: Rule{Workers: 2}, Optimizer: optim.Spec{Name: "sgd", LR: 0.5}})
	o := transport.Options{Token: "s3cret"}
	ss, err := srv.Serve("127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()

	if _, err := Dial(ctx, ss.Addr(), transport.Options{Token: "wrong"}, 0, 0, 0, vec("w", 1, 2)); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v", err)
	}
	var clients [2]*Client
	for w := range clients {
		if clients[w], err = Dial(ctx, ss.Addr(), o, w, 0, 0, vec("w", 1, 2)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	got := make([][]engine.Weight, 2)
	errs := make([]error, 2)
	for w, c := range clients {
		wg.Go(func() {
			if _, err := c.Push(ctx, 0, vec("w", float32(w+1), 4), []float64{float64(w) + 0.5}); err != nil {
				errs[w] = err
				return
			}
			var p Pulled
			p, errs[w] = c.Pull(ctx, 1)
			got[w] = p.Weights
			if fmt.Sprint(p.Losses) != "[0.5 1.5]" {
				errs[w] = fmt.Errorf("pulled losses %v, want both workers' in worker order", p.Losses)
			}
		})
	}
	wg.Wait()
	for w := range clients {
		if errs[w] != nil {
			t.Fatalf("worker %d: %v", w, errs[w])
		}
		// 1 - 0.5·(1+2) = -0.5; 2 - 0.5·(4+4) = -2.
		if v := got[w][0].Value.Data().([]float32); v[0] != -0.5 || v[1] != -2 {
			t.Errorf("worker %d pulled %v", w, v)
		}
		if err := clients[w].Close(ctx); err != nil {
			t.Errorf("worker %d bye: %v", w, err)
		}
	}
}

// roundTo is vals rounded to the 16-bit dtype half and back, as the
// transport's compression rounds a link's tensors.
func roundTo(t *testing.T, half transport.DType, vals ...float32) []float32 {
	t.Helper()
	tt, err := transport.FromFloat32sAs(half, transport.Gradient, 0, 0, []int{len(vals)}, vals)
	if err != nil {
		t.Fatal(err)
	}
	return tt.AsFloat32s()
}

// TestCompressedPushesAndPulls: with compression the gradients reach the
// server rounded to 16 bits and the pulled weights come back rounded,
// while the hello's initial weights and the server's copy stay whole.
func TestCompressedPushesAndPulls(t *testing.T) {
	for _, half := range []transport.DType{transport.Float16, transport.BFloat16} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		srv := NewServer(Settings{Rule: Rule{Workers: 1}, Optimizer: optim.Spec{Name: "sgd", LR: 1}})
		ss, err := srv.Serve("127.0.0.1:0", transport.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()
		init := []float32{1.0009765625, 2}
		c, err := Dial(ctx, ss.Addr(), transport.Options{}, 0, 0, 0, vec("w", init...))
		if err != nil {
			t.Fatal(err)
		}
		c.Compress(half)
		if got := srv.Weights()["w"].Data().([]float32); got[0] != init[0] {
			t.Fatalf("%v: the hello's weights arrived rounded: %v", half, got)
		}
		grad := []float32{1.0 / 3, 0.1}
		if _, err := c.Push(ctx, 0, vec("w", grad...), nil); err != nil {
			t.Fatal(err)
		}
		g := roundTo(t, half, grad...)
		want := []float32{init[0] - g[0], init[1] - g[1]}
		held := srv.Weights()["w"].Data().([]float32)
		if held[0] != want[0] || held[1] != want[1] {
			t.Errorf("%v: server holds %v, want %v (the rounded gradient applied)", half, held, want)
		}
		if g[0] == grad[0] {
			t.Fatalf("%v did not round 1/3", half)
		}
		p, err := c.Pull(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, wantPulled := p.Weights[0].Value.Data().([]float32), roundTo(t, half, want...); fmt.Sprint(got) != fmt.Sprint(wantPulled) {
			t.Errorf("%v: pulled %v, want the server's weights rounded, %v", half, got, wantPulled)
		}
		c.Close(ctx)
	}
}

// TestPushStalenessAndObservers: in async mode with max_staleness 1, a
// worker whose push lands after another's update of the weights it pulled
// is one update stale, on the client and in the update the server
// observes; the observers hear each update's and pull's wire bytes,
// compressed ones at 2 bytes an element.
func TestPushStalenessAndObservers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := NewServer(Settings{Rule: Rule{Workers: 2, Async: true, MaxStaleness: 1}, Optimizer: optim.Spec{Name: "sgd", LR: 1}})
	var mu sync.Mutex
	var updates []Event
	var pulls []Pull
	srv.Observe = func(e Event) {
		mu.Lock()
		updates = append(updates, e)
		mu.Unlock()
	}
	srv.ObservePull = func(p Pull) {
		mu.Lock()
		pulls = append(pulls, p)
		mu.Unlock()
	}
	ss, err := srv.Serve("127.0.0.1:0", transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	var c [2]*Client
	for w := range c {
		if c[w], err = Dial(ctx, ss.Addr(), transport.Options{}, w, 0, 0, vec("w", 1, 2, 3)); err != nil {
			t.Fatal(err)
		}
	}
	c[1].Compress(transport.BFloat16)
	push := func(w int, step int64, want int64) {
		t.Helper()
		if _, err := c[w].Push(ctx, step, vec("w", 1, 1, 1), nil); err != nil {
			t.Fatal(err)
		}
		if got := c[w].Staleness(); got != want {
			t.Errorf("worker %d's push of step %d: staleness %d, want %d", w, step+1, got, want)
		}
	}
	push(0, 0, 0) // update 1, from the initial weights
	push(1, 0, 1) // update 2, from the initial weights: update 1 came between
	if _, err := c[0].Pull(ctx, 1); err != nil {
		t.Fatal(err)
	}
	push(0, 1, 0) // update 3, from update 2's weights
	mu.Lock()
	ups, pls := slices.Clone(updates), slices.Clone(pulls)
	mu.Unlock()
	if len(ups) != 3 || len(pls) != 1 {
		t.Fatalf("observed %d updates and %d pulls, want 3 and 1", len(ups), len(pls))
	}
	for i, want := range []struct {
		stale, bytes int64
	}{{0, 12}, {1, 6}, {0, 12}} {
		e := ups[i]
		if e.Update == nil || e.Update.Staleness[0] != want.stale || e.Bytes != want.bytes || e.End.Before(e.Start) {
			t.Errorf("update %d: %+v, want staleness %d and %d bytes", i+1, e, want.stale, want.bytes)
		}
	}
	if p := pls[0]; p.Worker != 0 || p.Step != 1 || p.Bytes != 12 || p.Ready.Before(p.Asked) {
		t.Errorf("pull: %+v", p)
	}
	for _, cl := range c {
		cl.Close(ctx)
	}
}

// TestServerTakesBackARestartedWorker: in async mode a worker whose stream
// is lost is noted as departed; a plain hello for it is then refused, a
// rejoin with other initial weights is taken (checked by shape only) and
// pulls the current weights; once every worker has left, a rejoin hears
// that the run is over (ErrOver).
func TestServerTakesBackARestartedWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv := NewServer(Settings{Rule: Rule{Workers: 2, Async: true, MaxStaleness: 1}, Optimizer: optim.Spec{Name: "sgd", LR: 1}})
	events := make(chan Event, 16)
	srv.Observe = func(e Event) {
		if e.Update == nil {
			events <- e
		}
	}
	ss, err := srv.Serve("127.0.0.1:0", transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	o := transport.Options{}
	w0, err := Dial(ctx, ss.Addr(), o, 0, 0, 0, vec("w", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	w1, err := Dial(ctx, ss.Addr(), o, 1, 0, 0, vec("w", 1, 2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w1.Push(ctx, 0, vec("w", 1, 1), nil); err != nil {
		t.Fatal(err)
	}
	w1.cancel() // its process killed: the stream ends without a bye
	if e := <-events; !e.Departed || e.Dropped != 1 {
		t.Fatalf("event %+v, want worker 1's departure", e)
	}
	if _, err := w0.Push(ctx, 0, vec("w", 1, 1), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ctx, ss.Addr(), o, 1, 0, 0, vec("w", 1, 2)); err == nil || !strings.Contains(err.Error(), "says hello as a rejoin") {
		t.Fatalf("a plain hello of the departed worker 1: %v", err)
	}
	back, err := Rejoin(ctx, ss.Addr(), o, 1, 0, 1, vec("w", 7, 7))
	if err != nil {
		t.Fatal(err)
	}
	if e := <-events; !e.Rejoined || e.Dropped != 1 || e.Step != 1 || e.Version != 2 {
		t.Fatalf("event %+v, want worker 1's rejoin at step 2, update 2", e)
	}
	p, err := back.Pull(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 1 - 1 - 1 = -1 and 2 - 1 - 1 = 0: both pushes applied, not the
	// rejoined worker's own initial weights.
	if v := p.Weights[0].Value.Data().([]float32); v[0] != -1 || v[1] != 0 || p.Version != 2 {
		t.Errorf("the rejoined worker pulled %v at version %d, want [-1 0] at 2", v, p.Version)
	}
	for _, c := range []*Client{w0, back} {
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Rejoin(ctx, ss.Addr(), o, 1, 0, 2, vec("w", 1, 2)); !errors.Is(err, ErrOver) {
		t.Errorf("a rejoin after every worker left: %v, want ErrOver", err)
	}
}
