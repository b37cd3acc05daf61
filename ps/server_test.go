package ps

import (
	"context"
	"errors"
	"fmt"
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
