package collective

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

// ringOf connects size ranks in a ring of in-memory links whose handshakes
// list shapes, as a stage's replica ring does.
func ringOf(size int, dt transport.DType, shapes [][]int) []*Ring {
	rings := make([]*Ring, size)
	for i := range rings {
		rings[i] = &Ring{Rank: i, Size: size, DType: dt, Name: func(r int) string { return fmt.Sprintf("replica %d", r) }}
	}
	for i := range rings {
		h := func(r int) transport.Hello {
			return transport.Hello{Stage: r, Stages: size, DType: dt, Shapes: shapes}
		}
		a, b := transport.Pipe(h(i), h((i+1)%size), 2)
		rings[i].Next, rings[(i+1)%size].Prev = a, b
	}
	return rings
}

// runAll runs f on every rank at once and returns the ranks' errors.
func runAll(rings []*Ring, f func(r *Ring) error) []error {
	errs := make([]error, len(rings))
	var wg sync.WaitGroup
	for i, r := range rings {
		wg.Go(func() { errs[i] = f(r) })
	}
	wg.Wait()
	return errs
}

func randomParts(rng *rand.Rand, ranks, n int) [][]float32 {
	parts := make([][]float32, ranks)
	for r := range parts {
		parts[r] = make([]float32, n)
		for i := range parts[r] {
			// Mixed magnitudes make the fold order visible in the bits.
			parts[r][i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
		}
	}
	return parts
}

// exactSum is element i's sum over parts in float64, and the sum of the
// magnitudes, which bounds any float32 fold's rounding error.
func exactSum(parts [][]float32, i int) (sum, scale float64) {
	for r := range parts {
		sum += float64(parts[r][i])
		scale += math.Abs(float64(parts[r][i]))
	}
	return sum, scale
}

func TestRingAllReduceEqualsSumForTwoToEightRanks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for ranks := 2; ranks <= 8; ranks++ {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1000, 0}, {1001, 97}, {4099, 1024}} {
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
				// Against the plain sum in rank order: equal where the fold
				// order cannot matter (two ranks), close otherwise.
				for i := range want {
					var plain float32
					for r := range parts {
						plain += parts[r][i]
					}
					if ranks == 2 && plain != want[i] {
						t.Fatalf("element %d: ring order %v, rank order %v", i, want[i], plain)
					}
					exact, scale := exactSum(parts, i)
					if d := math.Abs(float64(want[i]) - exact); d > float64(ranks)*0x1p-23*scale {
						t.Fatalf("element %d: %v, exact sum %v", i, want[i], exact)
					}
				}
				everyRankGetsSum(t, ringOf(ranks, transport.Float32, p.Shapes()), p, 5, copyParts(parts), want)
			})
		}
	}
}

// The fold order is the plan's, so it must show for three ranks: a
// rank-order sum differs from Sum somewhere on such data, and the ring
// follows Sum, not the rank order.
func TestSumFollowsTheRingsOrderNotTheRanks(t *testing.T) {
	p, _ := NewPlan(3, 0, 3)
	parts := [][]float32{{1e8, 1e8, 1e8}, {1, 1, 1}, {-1e8, -1e8, -1e8}}
	out := make([]float32, 3)
	if err := Sum(p, parts, out); err != nil {
		t.Fatal(err)
	}
	// chunk 0 folds ranks 0,1,2: (1e8+1)-1e8 = 0 in float32;
	// chunk 1 folds 1,2,0: (1-1e8)+1e8 = 0; chunk 2 folds 2,0,1: (-1e8+1e8)+1 = 1.
	if want := []float32{0, 0, 1}; out[0] != want[0] || out[1] != want[1] || out[2] != want[2] {
		t.Fatalf("Sum = %v, want %v", out, want)
	}
}

func TestRingAllReduceFloat64(t *testing.T) {
	p, _ := NewPlan(101, 10, 3)
	parts := make([][]float64, 3)
	for r := range parts {
		parts[r] = make([]float64, 101)
		for i := range parts[r] {
			parts[r][i] = float64(r*1000+i) / 7
		}
	}
	want := make([]float64, 101)
	if err := Sum(p, parts, want); err != nil {
		t.Fatal(err)
	}
	rings := ringOf(3, transport.Float64, p.Shapes())
	for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(context.Background(), x, 0, 0, p, parts[x.Rank]) }) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range parts {
		for i := range want {
			if parts[r][i] != want[i] {
				t.Fatalf("rank %d element %d: %v, want %v", r, i, parts[r][i], want[i])
			}
		}
	}
}

// Under compression every rank must still end with the same bits, or the
// replicas' weights would drift apart.
func TestCompressedRingLeavesRanksIdentical(t *testing.T) {
	for _, dt := range []transport.DType{transport.BFloat16, transport.Float16} {
		p, _ := NewPlan(999, 200, 4)
		parts := randomParts(rand.New(rand.NewPCG(3, 4)), 4, 999)
		orig := randomParts(rand.New(rand.NewPCG(3, 4)), 4, 999)
		exact := make([]float32, 999)
		if err := Sum(p, parts, exact); err != nil {
			t.Fatal(err)
		}
		rings := ringOf(4, dt, p.Shapes())
		for r, err := range runAll(rings, func(x *Ring) error { return AllReduce(context.Background(), x, 0, 0, p, parts[x.Rank]) }) {
			if err != nil {
				t.Fatalf("%s rank %d: %v", dt, r, err)
			}
		}
		for r := 1; r < 4; r++ {
			for i := range parts[0] {
				if math.Float32bits(parts[r][i]) != math.Float32bits(parts[0][i]) {
					t.Fatalf("%s: rank %d element %d is %v, rank 0 has %v", dt, r, i, parts[r][i], parts[0][i])
				}
			}
		}
		for i := range exact {
			// Each hop rounds the running sum to 8 (bf16) or 11 (fp16) bits.
			_, scale := exactSum(orig, i)
			if d := math.Abs(float64(parts[0][i] - exact[i])); d > 4*0x1p-8*scale {
				t.Fatalf("%s element %d: %v, uncompressed %v", dt, i, parts[0][i], exact[i])
			}
		}
	}
}

func TestAllGatherReturnsBlocksInRankOrder(t *testing.T) {
	for _, size := range []int{1, 2, 5} {
		rings := ringOf(size, transport.BFloat16, [][]int{BytesShape(transport.BFloat16, 9)})
		out := make([][][]byte, size)
		for r, err := range runAll(rings, func(x *Ring) error {
			var err error
			out[x.Rank], err = x.AllGather(context.Background(), 3, 0, []byte(fmt.Sprintf("block %03d", x.Rank)))
			return err
		}) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		for r := range out {
			for k, b := range out[r] {
				if want := fmt.Sprintf("block %03d", k); !bytes.Equal(b, []byte(want)) {
					t.Fatalf("size %d rank %d: block %d is %q, want %q", size, r, k, b, want)
				}
			}
		}
	}
}

func TestSilentRankIsNamed(t *testing.T) {
	p, _ := NewPlan(10, 0, 3)
	rings := ringOf(3, transport.Float32, p.Shapes())
	for _, r := range rings {
		r.Timeout = 50 * time.Millisecond
	}
	vals := make([]float32, 10)
	// Rank 1 never takes part: rank 2 waits for it.
	err := AllReduce(context.Background(), rings[2], 0, 0, p, vals)
	if err == nil || !strings.Contains(err.Error(), "replica 1 sent nothing") {
		t.Fatalf("err = %v, want it to name replica 1", err)
	}
}

func TestMismatchedStepsAreRefused(t *testing.T) {
	p, _ := NewPlan(10, 0, 2)
	rings := ringOf(2, transport.Float32, p.Shapes())
	errs := runAll(rings, func(x *Ring) error {
		return AllReduce(context.Background(), x, int64(x.Rank), 0, p, make([]float32, 10)) // ranks on different steps
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "expected step 0") {
		t.Fatalf("rank 0: %v", errs[0])
	}
}

func TestBucketElemsHoldsWholeElements(t *testing.T) {
	for _, c := range []struct{ bytes, size, want int }{
		{1 << 20, 4, 1 << 18}, // float32
		{1 << 20, 8, 1 << 17}, // float64
		{10, 4, 2},            // a partial element is left out
		{3, 8, 1},             // at least one element
	} {
		if got := BucketElems(c.bytes, c.size); got != c.want {
			t.Errorf("BucketElems(%d, %d) = %d, want %d", c.bytes, c.size, got, c.want)
		}
	}
}

// TestAllGatherOwnedSharesEachOwnersChunks: after an all-reduce, each rank
// overwrites the chunks it owns (as a sharded optimizer updates them) and
// AllGatherOwned, on the same ring in the same step, hands every rank each
// owner's values; the owned ranges of the ranks cover the vector once.
func TestAllGatherOwnedSharesEachOwnersChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for ranks := 2; ranks <= 5; ranks++ {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1001, 97}} {
			p, err := NewPlan(c.n, c.bucket, ranks)
			if err != nil {
				t.Fatal(err)
			}
			owner := make([]int, c.n)
			for i := range owner {
				owner[i] = -1
			}
			for r := range ranks {
				for _, o := range Owned(p, r) {
					for i := o[0]; i < o[1]; i++ {
						if owner[i] >= 0 {
							t.Fatalf("R=%d n=%d: element %d owned by ranks %d and %d", ranks, c.n, i, owner[i], r)
						}
						owner[i] = r
					}
				}
			}
			if i := slices.Index(owner, -1); i >= 0 {
				t.Fatalf("R=%d n=%d: element %d owned by no rank", ranks, c.n, i)
			}
			grads := randomParts(rng, ranks, c.n)
			updated := randomParts(rng, ranks, c.n)
			weights := make([][]float32, ranks)
			for r := range weights {
				weights[r] = make([]float32, c.n)
			}
			rings := ringOf(ranks, transport.Float32, p.Shapes())
			for r, err := range runAll(rings, func(x *Ring) error {
				if err := AllReduce(context.Background(), x, 9, 0, p, grads[x.Rank]); err != nil {
					return err
				}
				for _, o := range Owned(p, x.Rank) {
					copy(weights[x.Rank][o[0]:o[1]], updated[x.Rank][o[0]:o[1]])
				}
				return AllGatherOwned(context.Background(), x, 9, 0, p, weights[x.Rank])
			}) {
				if err != nil {
					t.Fatalf("R=%d n=%d: rank %d: %v", ranks, c.n, r, err)
				}
			}
			for r := range weights {
				for i, w := range weights[r] {
					if want := updated[owner[i]][i]; math.Float32bits(w) != math.Float32bits(want) {
						t.Fatalf("R=%d n=%d: rank %d element %d is %v, its owner %d's %v", ranks, c.n, r, i, w, owner[i], want)
					}
				}
			}
		}
	}
}

// TestReduceScatterThenGatherIsAllReduce: after ReduceScatter each rank's
// owned chunks hold Sum's bits, and AllGatherOwned then leaves every rank
// with the whole of Sum, as AllReduce does.
func TestReduceScatterThenGatherIsAllReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for ranks := 2; ranks <= 5; ranks++ {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1001, 97}} {
			p, err := NewPlan(c.n, c.bucket, ranks)
			if err != nil {
				t.Fatal(err)
			}
			parts := randomParts(rng, ranks, c.n)
			want := make([]float32, c.n)
			if err := Sum(p, parts, want); err != nil {
				t.Fatal(err)
			}
			rings := ringOf(ranks, transport.Float32, p.Shapes())
			scattered := make([][]float32, ranks)
			for r, err := range runAll(rings, func(x *Ring) error {
				if err := ReduceScatter(context.Background(), x, 2, 0, p, parts[x.Rank]); err != nil {
					return err
				}
				scattered[x.Rank] = append([]float32(nil), parts[x.Rank]...)
				return AllGatherOwned(context.Background(), x, 2, 0, p, parts[x.Rank])
			}) {
				if err != nil {
					t.Fatalf("R=%d n=%d: rank %d: %v", ranks, c.n, r, err)
				}
			}
			for r := range ranks {
				for _, o := range Owned(p, r) {
					for i := o[0]; i < o[1]; i++ {
						if math.Float32bits(scattered[r][i]) != math.Float32bits(want[i]) {
							t.Fatalf("R=%d n=%d: rank %d's owned element %d after the reduce-scatter is %v, Sum %v", ranks, c.n, r, i, scattered[r][i], want[i])
						}
					}
				}
				for i := range want {
					if math.Float32bits(parts[r][i]) != math.Float32bits(want[i]) {
						t.Fatalf("R=%d n=%d: rank %d element %d after the all-gather is %v, Sum %v", ranks, c.n, r, i, parts[r][i], want[i])
					}
				}
			}
		}
	}
}

// TestAddMatchesTheLoop: the vector kernel add takes for float32 gives the
// bits of the plain loop acc[i] += v[i], whatever the length, alignment
// and values (signed zeros, infinities, NaNs, subnormals), so the ring, its
// reference Sum and earlier builds all agree.
func TestAddMatchesTheLoop(t *testing.T) {
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.MaxFloat32, 1e-39, -3.5}
	rng := rand.New(rand.NewPCG(4, 2))
	for n := range 70 {
		for off := range 3 {
			acc, v := make([]float32, n+off), make([]float32, n+off)
			for i := range acc {
				if rng.IntN(4) == 0 {
					acc[i], v[i] = specials[rng.IntN(len(specials))], specials[rng.IntN(len(specials))]
				} else {
					acc[i], v[i] = float32(rng.NormFloat64()*1e3), float32(rng.NormFloat64())
				}
			}
			want := slices.Clone(acc[off:])
			for i := range want {
				want[i] += v[off+i]
			}
			add(acc[off:], v[off:])
			for i, x := range acc[off:] {
				if math.Float32bits(x) != math.Float32bits(want[i]) && !(x != x && want[i] != want[i]) {
					t.Fatalf("n %d offset %d element %d: %v (%#x), the loop gives %v (%#x)", n, off, i, x, math.Float32bits(x), want[i], math.Float32bits(want[i]))
				}
			}
		}
	}
}

// copyParts gives each rank its own copy of its values, since an
// all-reduce overwrites them.
func copyParts(parts [][]float32) [][]float32 {
	got := make([][]float32, len(parts))
	for r := range got {
		got[r] = append([]float32(nil), parts[r]...)
	}
	return got
}

// everyRankGetsSum all-reduces got[r] in place on ring rank r (as step
// step) and checks that every rank ends with want's bits.
func everyRankGetsSum(t *testing.T, rings []*Ring, p Plan, step int64, got [][]float32, want []float32) {
	t.Helper()
	for r, err := range runAll(rings, func(x *Ring) error {
		return AllReduce(context.Background(), x, step, 0, p, got[x.Rank])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range got {
		for i := range want {
			if math.Float32bits(got[r][i]) != math.Float32bits(want[i]) {
				t.Fatalf("rank %d element %d: %v, Sum gives %v", r, i, got[r][i], want[i])
			}
		}
	}
}
