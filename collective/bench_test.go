package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// loopbackRing joins ranks ranks by gRPC replica-ring links on loopback,
// and with streams by ring streams beside them.
func loopbackRing(tb testing.TB, ranks int, p Plan, streams bool) []*Ring {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rings, close, err := Loopback(ctx, ranks, p, streams)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(close)
	return rings
}

// forEachTransport runs test over gRPC links and over ring streams.
func forEachTransport(t *testing.T, test func(t *testing.T, streams bool)) {
	for _, streams := range []bool{false, true} {
		name := "grpc"
		if streams {
			name = "stream"
		}
		t.Run(name, func(t *testing.T) { test(t, streams) })
	}
}

// BenchmarkRingAllReduce reports the bus bandwidth (2(R-1)/R · S / t) of
// the ring over real gRPC links and over ring streams on loopback.
func BenchmarkRingAllReduce(b *testing.B) {
	for _, ranks := range []int{2, 4} {
		for _, c := range []struct{ size, bucket int }{{1 << 20, 0}, {4 << 20, 1 << 20}, {16 << 20, 0}, {16 << 20, 1 << 20}, {16 << 20, 256 << 10}, {4 << 20, 256 << 10}} {
			for _, over := range []string{"grpc", "stream"} {
				size := c.size
				b.Run(fmt.Sprintf("R=%d/%dMiB/bucket=%dKiB/%s", ranks, size>>20, c.bucket>>10, over), func(b *testing.B) {
					p, _ := NewPlan(size/4, c.bucket/4, ranks)
					rings := loopbackRing(b, ranks, p, over == "stream")
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
}

// TestRingOverGRPCAlternatingBuffers runs consecutive all-reduces over real
// links, and over ring streams, neither of which copies what it sends: with
// two buffers alternating, every result must equal Sum of what each rank
// put in, bit for bit.
func TestRingOverGRPCAlternatingBuffers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, streams bool) {
		for _, ranks := range []int{2, 3, 4} {
			t.Run(fmt.Sprint(ranks), func(t *testing.T) { testAlternatingBuffers(t, ranks, streams) })
		}
	})
}

func testAlternatingBuffers(t *testing.T, ranks int, streams bool) {
	const steps = 6
	p, _ := NewPlan(50001, 7000, ranks)
	rings := loopbackRing(t, ranks, p, streams)
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

// TestRingOverStreamsSmallPlans: over ring streams, plans whose chunks are
// empty or one element long (fewer elements than ranks, odd buckets) give
// every rank Sum's bits, as over links.
func TestRingOverStreamsSmallPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, ranks := range []int{2, 3, 5} {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1001, 97}} {
			t.Run(fmt.Sprintf("R=%d/n=%d/bucket=%d", ranks, c.n, c.bucket), func(t *testing.T) {
				p, err := NewPlan(c.n, c.bucket, ranks)
				if err != nil {
					t.Fatal(err)
				}
				parts := randomParts(rng, ranks, c.n)
				want := make([]float32, c.n)
				if err := Sum(p, parts, want); err != nil {
					t.Fatal(err)
				}
				rings := loopbackRing(t, ranks, p, true)
				for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(context.Background(), x, 9, 0, p, parts[x.Rank]) }) {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
				for r := range parts {
					for i := range want {
						if math.Float32bits(parts[r][i]) != math.Float32bits(want[i]) {
							t.Fatalf("rank %d element %d: %v, Sum gives %v", r, i, parts[r][i], want[i])
						}
					}
				}
			})
		}
	}
}
