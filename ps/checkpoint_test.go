package ps

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/transport"
)

// trainServer runs steps from..to-1 of two sync workers against srv (a
// fresh one, or one restored at from): each says hello with its initial
// weights, pulls what the server holds if it is further on, then pushes a
// gradient that depends on the step and the worker and pulls the update.
func trainServer(t *testing.T, ctx context.Context, srv *Server, from, to int64) {
	t.Helper()
	ss, err := srv.Serve("127.0.0.1:0", transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for w := range 2 {
		wg.Go(func() {
			c, err := Dial(ctx, ss.Addr(), transport.Options{}, w, 0, 0, vec("w", 1, 2))
			if err != nil {
				errs[w] = err
				return
			}
			defer c.Close(ctx)
			if c.Version() != from {
				errs[w] = fmt.Errorf("the server answered the hello at version %d, want %d", c.Version(), from)
				return
			}
			for step := from; step < to; step++ {
				g := vec("w", float32(step+1)*0.25, float32(w+1)*0.5)
				if _, err := c.Push(ctx, step, g, nil); err != nil {
					errs[w] = err
					return
				}
				if _, err := c.Pull(ctx, step+1); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", w, err)
		}
	}
}

// TestRestoredServerContinuesBitForBit: a server keeps its group's state
// at the checkpoint's update (weights, Adam's buffers and step count); a
// new server restored from it and trained on ends with the same bits as
// the server that never stopped.
func TestRestoredServerContinuesBitForBit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	settings := Settings{Rule: Rule{Workers: 2}, Optimizer: optim.Spec{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
		CheckpointAt: func(v int64) bool { return v == 3 }}
	whole := NewServer(settings)
	trainServer(t, ctx, whole, 0, 6)
	states, err := whole.Snapshot(ctx, 3, 1)
	if err != nil || len(states) != 1 || states[0].Version != 3 || states[0].OptSteps != 3 || len(states[0].Slots["m"]) != 1 {
		t.Fatalf("snapshot of update 3: %+v, %v", states, err)
	}
	if more, err := whole.Snapshot(ctx, 3, 1); more != nil || err != nil {
		t.Fatalf("a second snapshot of update 3: %+v, %v; want none, the run being over", more, err)
	}

	resumed := NewServer(settings)
	if err := resumed.Restore(states); err != nil {
		t.Fatal(err)
	}
	trainServer(t, ctx, resumed, 3, 6)
	want, got := whole.Weights()["w"].Data().([]float32), resumed.Weights()["w"].Data().([]float32)
	if !slices.Equal(got, want) {
		t.Errorf("restored at update 3 and trained to 6: %v; never stopped: %v", got, want)
	}
	if resumed.Updates(0) != 6 {
		t.Errorf("restored server made %d updates in all, want 6", resumed.Updates(0))
	}

	cold := NewServer(Settings{Rule: Rule{Workers: 2}, Optimizer: optim.Spec{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}})
	states[0].OptSteps = 0 // as if the checkpoint had lost Adam's step count
	if err := cold.Restore(states); err != nil {
		t.Fatal(err)
	}
	trainServer(t, ctx, cold, 3, 6)
	if slices.Equal(cold.Weights()["w"].Data().([]float32), want) {
		t.Error("Adam's step count makes no difference: the test cannot tell a restored optimizer from a fresh one")
	}
}
