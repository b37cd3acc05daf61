package collective

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/transport"
)

// Every rank ends with Sum's bits for several host layouts, sizes and
// buckets, and Sum's hierarchical fold is each host's parts in rank order,
// then the hosts' sums round a ring of leaders.
func TestHierarchicalEqualsSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	layouts := [][]int{{2}, {1, 1}, {2, 2}, {1, 3}, {3, 1}, {2, 1, 2}, {1, 1, 1, 1}, {4}}
	for _, groups := range layouts {
		for _, c := range []struct{ n, bucket int }{{1, 0}, {7, 3}, {1001, 97}, {333, 1}} {
			t.Run(fmt.Sprintf("%v/n=%d/bucket=%d", groups, c.n, c.bucket), func(t *testing.T) {
				ranks := 0
				for _, s := range groups {
					ranks += s
				}
				p, err := NewPlan(c.n, c.bucket, ranks)
				if err != nil {
					t.Fatal(err)
				}
				if p, err = p.WithAlgorithm(Hierarchical); err != nil {
					t.Fatal(err)
				}
				if p, err = p.WithGroups(groups); err != nil {
					t.Fatal(err)
				}
				parts := randomParts(rng, ranks, c.n)
				want := make([]float32, c.n)
				if err := Sum(p, parts, want); err != nil {
					t.Fatal(err)
				}
				checkHierarchicalFold(t, p, parts, want)
				for _, streams := range []bool{false, true} {
					got := make([][]float32, ranks)
					for r := range got {
						got[r] = append([]float32(nil), parts[r]...)
					}
					rings, closeRings, err := Loopback(context.Background(), ranks, p, streams)
					if err != nil {
						t.Fatal(err)
					}
					for r, err := range runAll(rings, func(x *Ring) error {
						return AllReduce(context.Background(), x, 3, 0, p, got[x.Rank])
					}) {
						if err != nil {
							t.Fatalf("streams %v rank %d: %v", streams, r, err)
						}
					}
					closeRings()
					for r := range got {
						for i := range want {
							if math.Float32bits(got[r][i]) != math.Float32bits(want[i]) {
								t.Fatalf("streams %v rank %d element %d: %v, Sum gives %v", streams, r, i, got[r][i], want[i])
							}
						}
					}
				}
			})
		}
	}
}

// checkHierarchicalFold recomputes the documented fold element by element,
// apart from Sum's code: chunk c of G of each bucket starts at host c.
func checkHierarchicalFold(t *testing.T, p Plan, parts [][]float32, want []float32) {
	t.Helper()
	var hosts [][]float32
	start := 0
	for _, s := range p.Groups {
		h := make([]float32, p.N)
		for i := range h {
			h[i] = parts[start][i]
			for r := start + 1; r < start+s; r++ {
				h[i] += parts[r][i]
			}
		}
		hosts = append(hosts, h)
		start += s
	}
	G := len(hosts)
	for b, bk := range p.Buckets {
		n := bk[1] - bk[0]
		for i := bk[0]; i < bk[1]; i++ {
			// the chunk of element i among G, as Chunk cuts
			c, lo := 0, bk[0]
			for ; c < G; c++ {
				size := n / G
				if c < n%G {
					size++
				}
				if i < lo+size {
					break
				}
				lo += size
			}
			v := hosts[c][i]
			for k := 1; k < G; k++ {
				v += hosts[(c+k)%G][i]
			}
			if math.Float32bits(v) != math.Float32bits(want[i]) {
				t.Fatalf("bucket %d element %d: fold %v, Sum %v", b, i, v, want[i])
			}
		}
	}
}

// Under bfloat16 compression every rank still ends with the same bits.
func TestCompressedHierarchicalLeavesRanksIdentical(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	p, err := NewPlan(1001, 97, 5)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithAlgorithm(Hierarchical); err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithGroups([]int{2, 1, 2}); err != nil {
		t.Fatal(err)
	}
	got := randomParts(rng, 5, p.N)
	rings := ringOf(5, transport.BFloat16, p.Shapes())
	for r, err := range runAll(rings, func(x *Ring) error {
		return AllReduce(context.Background(), x, 1, 0, p, got[x.Rank])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := 1; r < 5; r++ {
		for i := range got[0] {
			if math.Float32bits(got[r][i]) != math.Float32bits(got[0][i]) {
				t.Fatalf("rank %d element %d: %v, rank 0 %v", r, i, got[r][i], got[0][i])
			}
		}
	}
}

func TestWithGroupsRefusesWrongSizes(t *testing.T) {
	p, err := NewPlan(10, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range [][]int{{2, 1}, {2, 0, 2}, {5}} {
		if _, err := p.WithGroups(g); err == nil {
			t.Errorf("groups %v of 4 ranks accepted", g)
		}
	}
}

// With ranks 0-1 on 127.0.0.1 and 2-3 on 127.0.0.2, two hosts, the ring
// streams within each host run on the listeners' Unix stream sockets and
// the two host links on TCP, and every rank ends each step with Sum's bits,
// as when every stream is on TCP.
func TestHierarchicalStreamsWithinHostsOnUnixSockets(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("stream sockets are abstract Unix sockets, which only Linux has")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := NewPlan(1001, 97, 4)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithAlgorithm(Hierarchical); err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithGroups([]int{2, 2}); err != nil {
		t.Fatal(err)
	}
	hosts := []string{"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, overTCP := range []bool{false, true} {
		rings, closeRings, err := loopbackWith(ctx, 4, p, loopbackOptions{streams: true, dt: transport.Float32, overTCP: overTCP, hosts: hosts})
		if err != nil {
			t.Fatal(err)
		}
		defer closeRings()
		for r, x := range rings {
			want := "tcp"
			if !overTCP && hosts[r] == hosts[(r+1)%4] {
				want = "unix"
			}
			if x.Out.Network() != want || rings[(r+1)%4].In.Network() != want {
				t.Errorf("over TCP %v: the stream from rank %d runs on %s / %s, want %s", overTCP, r, x.Out.Network(), rings[(r+1)%4].In.Network(), want)
			}
		}
		for step := range 2 {
			parts := randomParts(rng, 4, p.N)
			want := make([]float32, p.N)
			if err := Sum(p, parts, want); err != nil {
				t.Fatal(err)
			}
			everyRankGetsSum(t, rings, p, int64(step), parts, want)
		}
	}
}
