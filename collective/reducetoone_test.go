package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

func reduceToOnePlan(t *testing.T, n, bucket, ranks int) Plan {
	t.Helper()
	p, err := NewPlan(n, bucket, ranks)
	if err != nil {
		t.Fatal(err)
	}
	p, err = p.WithAlgorithm(ReduceToOne)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every rank ends with Sum's bits, which are the plain left-to-right sum
// in rank order, for several ranks, odd sizes and buckets.
func TestReduceToOneEqualsRankOrderSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for ranks := 2; ranks <= 5; ranks++ {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1001, 97}, {4099, 1024}, {333, 1}} {
			t.Run(fmt.Sprintf("R=%d/n=%d/bucket=%d", ranks, c.n, c.bucket), func(t *testing.T) {
				p := reduceToOnePlan(t, c.n, c.bucket, ranks)
				parts := randomParts(rng, ranks, c.n)
				want := make([]float32, c.n)
				if err := Sum(p, parts, want); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					plain := parts[0][i]
					for r := 1; r < ranks; r++ {
						plain += parts[r][i]
					}
					if math.Float32bits(plain) != math.Float32bits(want[i]) {
						t.Fatalf("element %d: Sum %v, rank order %v", i, want[i], plain)
					}
				}
				everyRankGetsSum(t, ringOf(ranks, transport.Float32, p.Shapes()), p, 3, copyParts(parts), want)
			})
		}
	}
}

// The data of TestSumFollowsTheRingsOrderNotTheRanks: folded in rank order
// every element is (1e8+1)-1e8 = 0, where the ring gives one element 1.
func TestReduceToOneFoldsInRankOrder(t *testing.T) {
	p := reduceToOnePlan(t, 3, 0, 3)
	parts := [][]float32{{1e8, 1e8, 1e8}, {1, 1, 1}, {-1e8, -1e8, -1e8}}
	out := make([]float32, 3)
	if err := Sum(p, parts, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != 0 || out[1] != 0 || out[2] != 0 {
		t.Fatalf("Sum = %v, want [0 0 0]", out)
	}
	rings := ringOf(3, transport.Float32, p.Shapes())
	for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(context.Background(), x, 0, 0, p, parts[x.Rank]) }) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range parts {
		if parts[r][0] != 0 || parts[r][1] != 0 || parts[r][2] != 0 {
			t.Fatalf("rank %d holds %v, want [0 0 0]", r, parts[r])
		}
	}
}

// float64 values, over the ring streams of a loopback ring, many buckets,
// two steps on alternating buffers as a stage's replicas run them.
func TestReduceToOneOverStreamsFloat64(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ranks, n = 4, 1013
	p := reduceToOnePlan(t, n, 50, ranks)
	rings, closeAll, err := loopback(ctx, ranks, p, true, transport.Float64)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	for step := range 2 {
		parts := make([][]float64, ranks)
		for r := range parts {
			parts[r] = make([]float64, n)
			for i := range parts[r] {
				parts[r][i] = float64(r*1000+i+step) / 7 * math.Pow(10, float64((i+r)%9-4))
			}
		}
		want := make([]float64, n)
		if err := Sum(p, parts, want); err != nil {
			t.Fatal(err)
		}
		for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(ctx, x, int64(step), 0, p, parts[x.Rank]) }) {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", step, r, err)
			}
		}
		for r := range parts {
			for i := range want {
				if math.Float64bits(parts[r][i]) != math.Float64bits(want[i]) {
					t.Fatalf("step %d rank %d element %d: %v, want %v", step, r, i, parts[r][i], want[i])
				}
			}
		}
	}
}

// Under compression every rank still ends with the same bits, over links
// and over streams, and close to the uncompressed sum.
func TestCompressedReduceToOneLeavesRanksIdentical(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, streams := range []bool{false, true} {
		p := reduceToOnePlan(t, 999, 200, 4)
		parts := randomParts(rand.New(rand.NewPCG(3, 4)), 4, 999)
		orig := randomParts(rand.New(rand.NewPCG(3, 4)), 4, 999)
		rings := ringOf(4, transport.BFloat16, p.Shapes())
		if streams {
			var closeAll func()
			var err error
			if rings, closeAll, err = loopback(ctx, 4, p, true, transport.BFloat16); err != nil {
				t.Fatal(err)
			}
			defer closeAll()
		}
		for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(ctx, x, 0, 0, p, parts[x.Rank]) }) {
			if err != nil {
				t.Fatalf("streams %v rank %d: %v", streams, r, err)
			}
		}
		for r := 1; r < 4; r++ {
			for i := range parts[0] {
				if math.Float32bits(parts[r][i]) != math.Float32bits(parts[0][i]) {
					t.Fatalf("streams %v: rank %d element %d is %v, rank 0 has %v", streams, r, i, parts[r][i], parts[0][i])
				}
			}
		}
		for i := range parts[0] {
			// Each hop rounds the running sum to bf16's 8 bits.
			exact, scale := exactSum(orig, i)
			if d := math.Abs(float64(parts[0][i]) - exact); d > 4*0x1p-8*scale {
				t.Fatalf("streams %v element %d: %v, exact %v", streams, i, parts[0][i], exact)
			}
		}
	}
}

// The ring's halves are refused by name for a reduce-to-one plan, and an
// unknown algorithm is refused with the known ones.
func TestReduceToOneRefusesRingHalves(t *testing.T) {
	p := reduceToOnePlan(t, 10, 0, 2)
	rings := ringOf(2, transport.Float32, p.Shapes())
	err := ReduceScatter(context.Background(), rings[0], 0, 0, p, make([]float32, 10))
	if err == nil || !strings.Contains(err.Error(), "reduce-to-one") {
		t.Fatalf("ReduceScatter of a reduce-to-one plan: %v", err)
	}
	if _, err := ParseAlgorithm("tree"); err == nil || !strings.Contains(err.Error(), "reduce-to-one") {
		t.Fatalf("ParseAlgorithm(tree): %v", err)
	}
}
