package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// grpcRing joins ranks ranks by gRPC replica-ring links on loopback.
func grpcRing(tb testing.TB, ranks int, p Plan) []*Ring {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rings, close, err := Loopback(ctx, ranks, p)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(close)
	return rings
}

// BenchmarkRingAllReduce reports the bus bandwidth (2(R-1)/R · S / t) of
// the ring over real gRPC links on loopback.
func BenchmarkRingAllReduce(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		for _, c := range []struct{ size, bucket int }{{1 << 20, 0}, {16 << 20, 0}, {16 << 20, 1 << 20}, {16 << 20, 256 << 10}, {4 << 20, 256 << 10}} {
			size := c.size
			b.Run(fmt.Sprintf("R=%d/%dMiB/bucket=%dKiB", ranks, size>>20, c.bucket>>10), func(b *testing.B) {
				p, _ := NewPlan(size/4, c.bucket/4, ranks)
				rings := grpcRing(b, ranks, p)
				bufs := make([][2][]float32, ranks)
				for r := range bufs {
					bufs[r] = [2][]float32{make([]float32, p.N), make([]float32, p.N)}
				}
				b.SetBytes(int64(2 * (ranks - 1) * size / ranks))
				b.ResetTimer()
				var wg sync.WaitGroup
				errs := make([]error, ranks)
				for r := range ranks {
					wg.Go(func() {
						for i := range b.N {
							if errs[r] = AllReduce(context.Background(), rings[r], int64(i), 0, p, bufs[r][i%2]); errs[r] != nil {
								return
							}
						}
					})
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestRingOverGRPCAlternatingBuffers runs consecutive all-reduces over real
// links, whose sends are not copied: with two buffers alternating, every
// result must equal Sum of what each rank put in.
func TestRingOverGRPCAlternatingBuffers(t *testing.T) {
	const ranks, steps = 3, 6
	p, _ := NewPlan(50001, 7000, ranks)
	rings := grpcRing(t, ranks, p)
	bufs := make([][2][]float32, ranks)
	for r := range bufs {
		bufs[r] = [2][]float32{make([]float32, p.N), make([]float32, p.N)}
	}
	for step := range steps {
		parts := make([][]float32, ranks)
		for r := range ranks {
			b := bufs[r][step%2]
			for i := range b {
				b[i] = float32((step+1)*(r+1)) + float32(i%113)*0.37
			}
			parts[r] = append([]float32(nil), b...)
		}
		want := make([]float32, p.N)
		if err := Sum(p, parts, want); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, ranks)
		for r := range ranks {
			wg.Go(func() { errs[r] = AllReduce(context.Background(), rings[r], int64(step), 0, p, bufs[r][step%2]) })
		}
		wg.Wait()
		for r := range ranks {
			if errs[r] != nil {
				t.Fatalf("step %d rank %d: %v", step, r, errs[r])
			}
			for i, v := range bufs[r][step%2] {
				if v != want[i] {
					t.Fatalf("step %d rank %d element %d: %v, want %v", step, r, i, v, want[i])
				}
			}
		}
	}
}
