package schedule

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestRingAllReduceTime(t *testing.T) {
	tests := []struct {
		r     RingAllReduce
		bytes int64
		want  float64
	}{
		{RingAllReduce{Replicas: 1, Bandwidth: 100, Latency: 1}, 1000, 0},
		{RingAllReduce{Replicas: 0, Bandwidth: 100, Latency: 1}, 1000, 0},
		{RingAllReduce{Replicas: 2, Bandwidth: 100, Latency: 1}, 0, 0},
		// 2·1/2·1000/100 + 2·1 messages.
		{RingAllReduce{Replicas: 2, Bandwidth: 100, Latency: 1}, 1000, 12},
		// 2·3/4·1000/100, and 4 buckets of 2·3 messages each.
		{RingAllReduce{Replicas: 4, Bandwidth: 100, Latency: 1, BucketBytes: 300}, 1000, 15 + 24},
		{RingAllReduce{Replicas: 4, Bandwidth: 100, Latency: 1, BucketBytes: 1000}, 1000, 15 + 6},
		{RingAllReduce{Replicas: 3, Latency: 0.5}, 1 << 30, 2},
		// Reduce-to-one, two replicas, one bucket: two hops of the whole
		// 1000 bytes, one after the other.
		{RingAllReduce{Replicas: 2, Bandwidth: 100, Latency: 1, ReduceToOne: true}, 1000, 2 + 20},
		// Four replicas, 4 buckets (the last 100 bytes): 4+6-1 steps; the
		// busiest rank sends 2·1000 bytes, and the last bucket's 5 later
		// hops add 5 buckets of 300.
		{RingAllReduce{Replicas: 4, Bandwidth: 100, Latency: 1, BucketBytes: 300, ReduceToOne: true}, 1000, 9 + (2000+1500)/100.0},
		{RingAllReduce{Replicas: 3, Latency: 0.5, ReduceToOne: true}, 1 << 30, 2},
	}
	for _, tt := range tests {
		if got := tt.r.Time(tt.bytes); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%+v.Time(%d) = %v, want %v", tt.r, tt.bytes, got, tt.want)
		}
	}
}

// allReduceCosts gives every chunk of every stage the same all-reduce time.
func allReduceCosts(p, v int, d float64) [][]float64 {
	out := make([][]float64, p)
	for st := range out {
		out[st] = make([]float64, v)
		for c := range out[st] {
			out[st][c] = d
		}
	}
	return out
}

// TestSimulateAllReduceByHand: 1F1B on two stages, two micro-batches, F = 1,
// B = 2, no transfer. Stage 1 runs 1F0 [1,2] 1B0 [2,4] 1F1 [4,5] 1B1 [5,7]
// and stage 0 ends with 0B1 [7,9], so stage 1's all-reduce, from 7, has two
// units of bubble to hide in, and stage 0's, from 9, none.
func TestSimulateAllReduceByHand(t *testing.T) {
	s := mustBuild(t, "1f1b", 2, 2, 1)
	tests := []struct {
		what     string
		ar       [][]float64
		makespan float64
		exposed  []float64
	}{
		{"nothing to reduce (one replica)", [][]float64{{0}, {0}}, 9, []float64{0, 0}},
		{"stage 1's fits in its bubble", [][]float64{{0}, {2}}, 9, []float64{0, 0}},
		{"stage 1's one unit longer than its bubble", [][]float64{{0}, {3}}, 10, []float64{0, 1}},
		{"stage 0's has nothing to hide behind", [][]float64{{1.5}, {0}}, 10.5, []float64{1.5, 0}},
		{"both exposed, the larger counts", [][]float64{{0.5}, {4}}, 11, []float64{0.5, 2}},
	}
	for _, tt := range tests {
		c := UniformCosts(2, 1, 2, 0)
		c.AllReduce = tt.ar
		tl, err := Simulate(s, c)
		if err != nil {
			t.Fatal(err)
		}
		if tl.Makespan != tt.makespan || !reflect.DeepEqual(tl.Exposed, tt.exposed) {
			t.Errorf("%s: makespan %v, exposed %v; want %v, %v", tt.what, tl.Makespan, tl.Exposed, tt.makespan, tt.exposed)
		}
		want := [][]Reduction{{{Chunk: 0, Start: 9, End: 9 + tt.ar[0][0]}}, {{Chunk: 0, Start: 7, End: 7 + tt.ar[1][0]}}}
		if !reflect.DeepEqual(tl.Reductions, want) {
			t.Errorf("%s: reductions %v, want %v", tt.what, tl.Reductions, want)
		}
		for st := range 2 {
			if tl.AllReduce(st) != tt.ar[st][0] {
				t.Errorf("%s: stage %d all-reduce %v, want %v", tt.what, st, tl.AllReduce(st), tt.ar[st][0])
			}
			if want := 1 - 6/tt.makespan; math.Abs(tl.Bubble[st]-want) > 1e-12 {
				t.Errorf("%s: stage %d bubble %v, want %v (idle while reducing)", tt.what, st, tl.Bubble[st], want)
			}
		}
	}
}

// TestSimulateAllReduceNilIsZero: without all-reduce costs the timeline is
// the one it always was, and zero costs change nothing in it but the
// reductions it lists.
func TestSimulateAllReduceNilIsZero(t *testing.T) {
	s := mustBuild(t, "zb-h1", 4, 6, 1)
	bare, err := Simulate(s, UniformCosts(4, 1, 2, 0.25))
	if err != nil {
		t.Fatal(err)
	}
	if bare.Reductions != nil || bare.Exposed != nil || bare.AllReduce(0) != 0 {
		t.Fatalf("reductions without all-reduce costs: %v %v", bare.Reductions, bare.Exposed)
	}
	c := UniformCosts(4, 1, 2, 0.25)
	c.AllReduce = allReduceCosts(4, 1, 0)
	zero, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(zero.Reductions) != 4 || !reflect.DeepEqual(zero.Exposed, []float64{0, 0, 0, 0}) {
		t.Fatalf("zero all-reduces: %v %v", zero.Reductions, zero.Exposed)
	}
	zero.Reductions, zero.Exposed = nil, nil
	if !reflect.DeepEqual(zero, bare) {
		t.Errorf("zero all-reduces changed the timeline: makespan %v, want %v", zero.Makespan, bare.Makespan)
	}
}

// TestSimulateAllReduceInterleaved: a stage's chunks are reduced one after
// another on its one ring, in the order their gradients become final
// (interleaved's backwards run the later chunk first), each starting when
// its chunk is done or the previous reduction ends.
func TestSimulateAllReduceInterleaved(t *testing.T) {
	s := mustBuild(t, "interleaved", 2, 2, 2)
	c := UniformCosts(2, 1, 2, 0)
	bare, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	c.AllReduce = [][]float64{{40, 1}, {40, 30}}
	tl, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	for st, rs := range tl.Reductions {
		if len(rs) != 2 || rs[0].Chunk != 1 || rs[1].Chunk != 0 {
			t.Fatalf("stage %d reductions %v, want chunk 1's then chunk 0's", st, rs)
		}
		done := lastGradientEnds(bare.Spans[st], 2)
		if rs[0].Start != done[1] || rs[1].Start != max(done[0], rs[0].End) {
			t.Errorf("stage %d reductions %v; chunks done at %v", st, rs, done)
		}
	}
	// Stage 1's chunk 1 is done first and its 30 units hold up chunk 0's 40.
	if want := tl.Reductions[1][0].End + 40; tl.Makespan != want {
		t.Errorf("makespan %v, want %v", tl.Makespan, want)
	}
}

// lastGradientEnds returns, per chunk, when its last B or W ends.
func lastGradientEnds(spans []Span, v int) []float64 {
	out := make([]float64, v)
	for _, sp := range spans {
		if sp.Action.Kind == Backward || sp.Action.Kind == Weight {
			out[sp.Action.Chunk] = sp.End
		}
	}
	return out
}

// TestSimulateAllReduceInvariants: on every built-in schedule with random
// costs, the all-reduces leave the spans alone; each stage's reductions run
// one per chunk, one at a time, each from its chunk's last gradient; the
// step ends at the later of the bare step and the last reduction, which is
// the bare step plus the largest Exposed; and the lowered schedule gives the
// same timeline.
func TestSimulateAllReduceInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for _, name := range Names() {
		for _, size := range [][3]int{{1, 3, 1}, {2, 4, 1}, {4, 8, 1}, {3, 3, 1}, {2, 4, 2}, {4, 8, 3}} {
			p, m, v := size[0], size[1], size[2]
			if !allowed(name, p, m, v) {
				continue
			}
			s := mustBuild(t, name, p, m, v)
			for k := range 20 {
				what := fmt.Sprintf("%s p%d m%d v%d #%d", name, p, m, v, k)
				c := randomCosts(rng, p, s.SplitsBackward())
				bare, err := Simulate(s, c)
				if err != nil {
					t.Fatal(err)
				}
				c.AllReduce = allReduceCosts(p, v, 0)
				for st := range p {
					for ch := range v {
						c.AllReduce[st][ch] = bare.Makespan * rng.Float64() * rng.Float64()
					}
				}
				tl, err := Simulate(s, c)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(tl.Spans, bare.Spans) {
					t.Fatalf("%s: the all-reduces moved the compute", what)
				}
				end, exposed := bare.Makespan, 0.0
				for st, rs := range tl.Reductions {
					if len(rs) != v {
						t.Fatalf("%s: stage %d has %d reductions for %d chunks", what, st, len(rs), v)
					}
					done, free := lastGradientEnds(tl.Spans[st], v), 0.0
					for _, r := range rs {
						if r.Start != max(done[r.Chunk], free) || r.End != r.Start+c.AllReduce[st][r.Chunk] {
							t.Errorf("%s: stage %d reduction %+v; chunk done at %v, ring free at %v", what, st, r, done[r.Chunk], free)
						}
						free = r.End
					}
					if want := max(0, free-bare.Makespan); tl.Exposed[st] != want {
						t.Errorf("%s: stage %d exposed %v, want %v", what, st, tl.Exposed[st], want)
					}
					end, exposed = max(end, free), max(exposed, tl.Exposed[st])
				}
				if tl.Makespan != end || math.Abs(tl.Makespan-(bare.Makespan+exposed)) > 1e-9 {
					t.Errorf("%s: makespan %v, want %v = bare %v + exposed %v", what, tl.Makespan, end, bare.Makespan, exposed)
				}
				l, err := Lower(s)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := l.Simulate(c); err != nil || !reflect.DeepEqual(got, tl) {
					t.Fatalf("%s: the lowered schedule's timeline differs (%v)", what, err)
				}
			}
		}
	}
}

// TestSimulateAllReduceTied: a tied weight's exchange sums reduced
// gradients, so it waits for its stage's all-reduces. 1F1B on two stages,
// one micro-batch, F = 1, B = 2, transfer 0.5: 0B0 ends at 7 and 1B0 at
// 4.5. Stage 0 reduces [7, 8] and stage 1 [4.5, 14.5]; stage 1 sends its
// half at 14.5, which stage 0 has at 15. Without all-reduces the exchange
// ends at 7.5 (stage 0's half, sent at 7, on stage 1).
func TestSimulateAllReduceTied(t *testing.T) {
	l, err := Lower(mustBuild(t, "1f1b", 2, 1, 1), AddSendRecv, AddReduceGrad, AddTiedSync(1))
	if err != nil {
		t.Fatal(err)
	}
	c := UniformCosts(2, 1, 2, 0.5)
	c.AllReduce = [][]float64{{1}, {10}}
	tl, err := l.Simulate(c)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]Reduction{{{Start: 7, End: 8}}, {{Start: 4.5, End: 14.5}}}
	if tl.Makespan != 15 || !reflect.DeepEqual(tl.Reductions, want) || !reflect.DeepEqual(tl.Exposed, []float64{0.5, 7}) {
		t.Errorf("makespan %v, reductions %v, exposed %v; want 15, %v, [0.5 7]", tl.Makespan, tl.Reductions, tl.Exposed, want)
	}
}

func TestSimulateAllReduceCostErrors(t *testing.T) {
	s := mustBuild(t, "interleaved", 2, 2, 2)
	tests := []struct {
		ar   [][]float64
		want string
	}{
		{[][]float64{{1, 1}}, "costs have 1 all-reduce entries, want 2 (one per stage, or none)"},
		{[][]float64{{1, 1}, {1}}, "stage 1: costs have 1 all-reduce entries, want one per chunk, 2"},
		{[][]float64{{1, -1}, {1, 1}}, "stage 0 chunk 1: all-reduce cost must be finite and >= 0, got -1"},
		{[][]float64{{1, 1}, {math.NaN(), 1}}, "stage 1 chunk 0: all-reduce cost must be finite and >= 0, got NaN"},
	}
	l, err := Lower(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		c := UniformCosts(2, 1, 2, 0)
		c.AllReduce = tt.ar
		if _, err := Simulate(s, c); err == nil || err.Error() != tt.want {
			t.Errorf("Simulate with %v = %v, want %q", tt.ar, err, tt.want)
		}
		if _, err := l.Simulate(c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Lowered.Simulate with %v = %v, want %q", tt.ar, err, tt.want)
		}
	}
}

// TestHierarchicalAllReduceTime: the hierarchical schedule step by step,
// by hand.
func TestHierarchicalAllReduceTime(t *testing.T) {
	fast := LinkFigures{Bandwidth: 1000, Latency: 0.1}
	tests := []struct {
		what  string
		r     RingAllReduce
		bytes int64
		want  float64
	}{
		// Replica 0 sends 1000 bytes to its leader within the host (1.1);
		// then three rounds of a 500-byte chunk across hosts (1 + 5 each),
		// the first two relayed to the other host's leader (0.1 + 0.5),
		// the last stopping at the relaying replica.
		{"2 hosts × 2", RingAllReduce{Replicas: 4, Bandwidth: 100, Latency: 1, Hosts: []int{2, 2}, Within: fast}, 1000,
			1.1 + 6.6 + 6.6 + 6},
		// One host of 3: each 300-byte bucket makes 4 whole hops within
		// the host (1 + 3 each): down to the leader and round to replica 1.
		{"1 host × 3, 2 buckets", RingAllReduce{Replicas: 3, Bandwidth: 5, Latency: 7, BucketBytes: 300, Hosts: []int{3},
			Within: LinkFigures{Bandwidth: 100, Latency: 1}}, 600, 2 * 4 * 4},
		// Unequal hosts are charged at the longest run: as 2 × 2.
		{"hosts of 1 and 2", RingAllReduce{Replicas: 3, Bandwidth: 100, Latency: 1, Hosts: []int{1, 2}, Within: fast}, 1000,
			1.1 + 6.6 + 6.6 + 6},
		// Bandwidth 0 within hosts: their hops cost their latency alone.
		{"latency alone within", RingAllReduce{Replicas: 4, Bandwidth: 100, Latency: 1, Hosts: []int{2, 2},
			Within: LinkFigures{Latency: 0.5}}, 1000, 0.5 + 6.5 + 6.5 + 6},
		{"one replica", RingAllReduce{Replicas: 1, Bandwidth: 100, Latency: 1, Hosts: []int{1}, Within: fast}, 1000, 0},
	}
	for _, tt := range tests {
		if got := tt.r.Time(tt.bytes); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: Time(%d) = %v, want %v", tt.what, tt.bytes, got, tt.want)
		}
	}
	// One replica a host is the ring, whatever the links within hosts.
	ring := RingAllReduce{Replicas: 3, Bandwidth: 100, Latency: 1, BucketBytes: 400}
	hier := ring
	hier.Hosts, hier.Within = []int{1, 1, 1}, fast
	if got, want := hier.Time(1000), ring.Time(1000); math.Abs(got-want) > 1e-9 {
		t.Errorf("3 hosts of 1: %v, want the ring's %v", got, want)
	}
}

// TestParameterServersTime: a push and a pull, each the latency plus the
// busier of the worker's link (all its bytes) and the busiest server's
// (every worker's share of it).
func TestParameterServersTime(t *testing.T) {
	link := LinkFigures{Bandwidth: 100, Latency: 1}
	tests := []struct {
		what  string
		p     ParameterServers
		bytes []int64
		want  float64
	}{
		{"one server, 3 workers", ParameterServers{Workers: 3, Link: link}, []int64{1000}, 2 * (1 + 30)},
		{"two servers, balanced", ParameterServers{Workers: 3, Link: link}, []int64{500, 500}, 2 * (1 + 15)},
		{"two servers, one holds most", ParameterServers{Workers: 2, Link: link}, []int64{900, 100}, 2 * (1 + 18)},
		// Many servers: the worker's own link is the busier.
		{"4 servers, 2 workers", ParameterServers{Workers: 2, Link: link}, []int64{250, 250, 250, 250}, 2 * (1 + 10)},
		{"a server holding none of the stage", ParameterServers{Workers: 3, Link: link}, []int64{0, 1000}, 2 * (1 + 30)},
		{"nothing to push", ParameterServers{Workers: 3, Link: link}, []int64{0, 0}, 0},
		{"latency alone", ParameterServers{Workers: 3, Link: LinkFigures{Latency: 2}}, []int64{1000}, 4},
	}
	for _, tt := range tests {
		if got := tt.p.Time(tt.bytes); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: Time(%v) = %v, want %v", tt.what, tt.bytes, got, tt.want)
		}
	}
}

// TestSimulateBucketsDuringLastWeightPass: zb-h1 on one stage, one
// micro-batch, F = 1, I = W = 1: F [0,1], I [1,2], W [2,3]. Per chunk, the
// 3 units of all-reduce start at 3 and end at 6; per layer, a bucket ready
// halfway through W runs [2.5, 4.5] and the last [4.5, 5.5]: 0.5 less
// exposed.
func TestSimulateBucketsDuringLastWeightPass(t *testing.T) {
	s := mustBuild(t, "zb-h1", 1, 1, 1)
	l, err := Lower(s, AddSendRecv, AddReduceGrad)
	if err != nil {
		t.Fatal(err)
	}
	c := UniformCosts(1, 1, 2, 0)
	c.AllReduce = [][]float64{{3}}
	chunk, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	c.Buckets = [][][]Bucket{{{{Ready: 0.5, Time: 2}, {Ready: 1, Time: 1}}}}
	layer, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	if chunk.Makespan != 6 || !reflect.DeepEqual(chunk.Exposed, []float64{3}) {
		t.Errorf("per chunk: makespan %v, exposed %v; want 6, [3]", chunk.Makespan, chunk.Exposed)
	}
	want := [][]Reduction{{{Start: 2.5, End: 4.5}, {Start: 4.5, End: 5.5}}}
	if layer.Makespan != 5.5 || !reflect.DeepEqual(layer.Exposed, []float64{2.5}) || !reflect.DeepEqual(layer.Reductions, want) {
		t.Errorf("per layer: makespan %v, exposed %v, reductions %v; want 5.5, [2.5], %v", layer.Makespan, layer.Exposed, layer.Reductions, want)
	}
	if layer.AllReduce(0) != 3 {
		t.Errorf("per layer: all-reduce %v, want the buckets' 3", layer.AllReduce(0))
	}
	if got, err := l.Simulate(c); err != nil || !reflect.DeepEqual(got, layer) {
		t.Errorf("the lowered schedule's timeline differs: %+v (%v)", got, err)
	}
	// A fused backward reports no layer: its buckets start at its end.
	fused := mustBuild(t, "1f1b", 1, 1, 1)
	got, err := Simulate(fused, c)
	if err != nil {
		t.Fatal(err)
	}
	c.Buckets = nil
	whole, err := Simulate(fused, c)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, whole) {
		t.Errorf("1f1b with buckets: %+v, want as per chunk %+v", got, whole)
	}
}

// TestSimulateBucketsNeverExposeMore: on every zero-bubble schedule with
// random costs, buckets ready within the last weight pass never leave more
// of the all-reduce exposed than the whole chunk's at the pass's end, and
// the lowered schedule agrees.
func TestSimulateBucketsNeverExposeMore(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, size := range [][4]int{{0, 2, 4, 1}, {0, 4, 8, 1}, {1, 2, 4, 2}, {2, 2, 4, 2}} {
		name := []string{"zb-h1", "zb-v", "interleaved-zb"}[size[0]]
		p, m, v := size[1], size[2], size[3]
		s := mustBuild(t, name, p, m, v)
		l, err := Lower(s, AddSendRecv, AddReduceGrad)
		if err != nil {
			t.Fatal(err)
		}
		for k := range 20 {
			c := randomCosts(rng, p, true)
			c.AllReduce = allReduceCosts(p, v, 0)
			c.Buckets = make([][][]Bucket, p)
			for st := range p {
				c.Buckets[st] = make([][]Bucket, v)
				for ch := range v {
					n, total, ready := 1+rng.IntN(4), 0.0, 1.0
					for range n {
						ready *= rng.Float64()
						b := Bucket{Ready: 1 - ready, Time: 5 * rng.Float64()}
						c.Buckets[st][ch] = append(c.Buckets[st][ch], b)
						total += b.Time
					}
					c.AllReduce[st][ch] = total
				}
			}
			layer, err := Simulate(s, c)
			if err != nil {
				t.Fatal(err)
			}
			whole := c
			whole.Buckets = nil
			chunk, err := Simulate(s, whole)
			if err != nil {
				t.Fatal(err)
			}
			for st := range p {
				if layer.Exposed[st] > chunk.Exposed[st]+1e-9 {
					t.Errorf("%s #%d stage %d: %v exposed per layer, %v per chunk", name, k, st, layer.Exposed[st], chunk.Exposed[st])
				}
			}
			if got, err := l.Simulate(c); err != nil || !reflect.DeepEqual(got, layer) {
				t.Fatalf("%s #%d: the lowered schedule's timeline differs (%v)", name, k, err)
			}
		}
	}
}

// TestSimulateReduceAtStepEnd: parameter servers' exchange starts when the
// stage's last action ends. Interleaved on two stages, two micro-batches:
// each stage's chunks are reduced one after the other from its end.
func TestSimulateReduceAtStepEnd(t *testing.T) {
	s := mustBuild(t, "interleaved", 2, 2, 2)
	c := UniformCosts(2, 1, 2, 0)
	bare, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	c.AllReduce = [][]float64{{4, 0}, {3, 0}}
	c.ReduceAtStepEnd = true
	tl, err := Simulate(s, c)
	if err != nil {
		t.Fatal(err)
	}
	for st, rs := range tl.Reductions {
		spans := bare.Spans[st]
		end := spans[len(spans)-1].End
		want := []Reduction{{Chunk: 0, Start: end, End: end + c.AllReduce[st][0]}, {Chunk: 1, Start: end + c.AllReduce[st][0], End: end + c.AllReduce[st][0]}}
		if !reflect.DeepEqual(rs, want) {
			t.Errorf("stage %d: reductions %v, want %v", st, rs, want)
		}
	}
	if want := bare.Makespan + 4; tl.Makespan != want {
		t.Errorf("makespan %v, want %v (stage 0 ends last, then its 4)", tl.Makespan, want)
	}
	l, err := Lower(s, AddSendRecv, AddReduceGrad)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := l.Simulate(c); err != nil || !reflect.DeepEqual(got, tl) {
		t.Errorf("the lowered schedule's timeline differs (%v)", err)
	}
}

// TestLayerBuckets: 4000 bytes in layers of 3000 and 1000, buckets of
// 1000, handed over last first. The last bucket lies in layer 1, which the
// weight pass (layers last to first) finishes after its own work: a
// quarter of the pass by bytes, or 1 of 3 units of work given. The others
// touch layer 0 and wait for the pass's end.
func TestLayerBuckets(t *testing.T) {
	r := RingAllReduce{Replicas: 2, Bandwidth: 100, Latency: 1, BucketBytes: 1000}
	each := r.Time(1000)
	tests := []struct {
		what  string
		work  []float64
		bytes []int64
		want  []Bucket
	}{
		{"by bytes", nil, []int64{3000, 1000}, []Bucket{{0.25, each}, {1, each}, {1, each}, {1, each}}},
		{"by work", []float64{2, 1}, []int64{3000, 1000}, []Bucket{{1.0 / 3, each}, {1, each}, {1, each}, {1, each}}},
		// A bucket of 500 bytes last, straddling nothing.
		{"a short last bucket", nil, []int64{1000, 1500}, []Bucket{{0.6, r.Time(500)}, {0.6, each}, {1, each}}},
		{"a layer without gradients", []float64{1, 0, 1}, []int64{1000, 0, 1000}, []Bucket{{0.5, each}, {1, each}}},
		{"nothing to reduce", nil, []int64{0}, nil},
	}
	for _, tt := range tests {
		if got := r.LayerBuckets(tt.bytes, tt.work); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.what, got, tt.want)
		}
	}
	if got := (RingAllReduce{Replicas: 2, Bandwidth: 100}).LayerBuckets([]int64{300, 100}, nil); !reflect.DeepEqual(got, []Bucket{{1, 4}}) {
		t.Errorf("no bucket size, one bucket from byte 0: %v", got)
	}
}
