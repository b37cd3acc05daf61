package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/transport"
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
				everyRankGetsSum(t, loopbackRing(t, ranks, p, true), p, 9, parts, want)
			})
		}
	}
}

// TestStreamsEqualLinksForEveryWireDType: float64 values, and float32
// values compressed to bfloat16 or float16 on the wire (which the streams
// cast block by block instead of moving in place), end every rank with the
// bits the same all-reduce over gRPC links gives, for three ranks and
// several buckets; float64 ones equal Sum.
func TestStreamsEqualLinksForEveryWireDType(t *testing.T) {
	const ranks = 3
	p, _ := NewPlan(20011, 3000, ranks)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []transport.DType{transport.Float64, transport.BFloat16, transport.Float16} {
		t.Run(dt.String(), func(t *testing.T) {
			var got [2][][]float64 // by transport, by rank
			parts := make([][]float64, ranks)
			for r := range parts {
				parts[r] = make([]float64, p.N)
				for i := range parts[r] {
					parts[r][i] = rng.NormFloat64() * float64(1+i%7)
				}
			}
			for k, streams := range []bool{false, true} {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				rings, close, err := loopback(ctx, ranks, p, streams, dt)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(close)
				got[k] = make([][]float64, ranks)
				errs := runAll(rings, func(x *Ring) error {
					if dt == transport.Float64 {
						v := slices.Clone(parts[x.Rank])
						got[k][x.Rank] = v
						return AllReduce(context.Background(), x, 1, 0, p, v)
					}
					v := make([]float32, p.N)
					for i := range v {
						v[i] = float32(parts[x.Rank][i])
					}
					err := AllReduce(context.Background(), x, 1, 0, p, v)
					got[k][x.Rank] = make([]float64, p.N)
					for i := range v {
						got[k][x.Rank][i] = float64(v[i])
					}
					return err
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("streams %t rank %d: %v", streams, r, err)
					}
				}
			}
			if dt == transport.Float64 {
				want := make([]float64, p.N)
				if err := Sum(p, parts, want); err != nil {
					t.Fatal(err)
				}
				got[0] = append(got[0], want)
			}
			for r := range got[1] {
				for i, v := range got[1][r] {
					for _, ref := range got[0] {
						if math.Float64bits(v) != math.Float64bits(ref[i]) {
							t.Fatalf("rank %d element %d over streams: %v, over links or Sum: %v", r, i, v, ref[i])
						}
					}
				}
			}
		})
	}
}
