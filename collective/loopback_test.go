package collective

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestFitFiguresRecoversTheModel: times made from known figures give those
// figures back, and noise that would make one negative falls back to the
// bandwidth of the larger size.
func TestFitFiguresRecoversTheModel(t *testing.T) {
	const bw, lat = 1.5e9, 80e-6
	xs, ms := [2]float64{262144, 8 << 20}, [2]float64{2, 16}
	var ts [2]float64
	for i := range ts {
		ts[i] = xs[i]/bw + ms[i]*lat
	}
	f := fitFigures(xs, ms, ts)
	if math.Abs(f.BytesPerSecond-bw)/bw > 1e-9 || math.Abs(f.Latency.Seconds()-lat) > 1e-9 {
		t.Fatalf("fit %v, want %v B/s and %v s", f, bw, lat)
	}
	// The small size took longer than the model allows: latency alone
	// cannot explain both points.
	ts[0] = ts[1]
	f = fitFigures(xs, ms, ts)
	if f.Latency != 0 || math.Abs(f.BytesPerSecond-xs[1]/ts[1]) > 1e-6 {
		t.Fatalf("with inconsistent times: %v, want latency 0 and %v B/s", f, xs[1]/ts[1])
	}
}

// TestMeasureLoopback times a real ring and checks that its figures are
// physical and reproduce the larger measurement's order of magnitude.
func TestMeasureLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, streams := range []bool{false, true} {
		f, err := MeasureLoopback(ctx, 3, 256<<10, 3, streams)
		if err != nil {
			t.Fatal(err)
		}
		if f.BytesPerSecond <= 1e6 || f.BytesPerSecond > 1e12 || f.Latency < 0 || f.Latency > time.Second {
			t.Fatalf("streams %t: implausible figures %+v", streams, f)
		}
	}
	if _, err := MeasureLoopback(ctx, 1, 1<<20, 1, false); err == nil {
		t.Fatal("a ring of one rank was measured")
	}
}

// TestRunLinksOnlyMovesTheRingsTraffic: the links-only baseline sends
// exactly the bytes an all-reduce of the same plan sends, on every rank,
// over links and over streams.
func TestRunLinksOnlyMovesTheRingsTraffic(t *testing.T) {
	forEachTransport(t, testRunLinksOnlyMovesTheRingsTraffic)
}

func testRunLinksOnlyMovesTheRingsTraffic(t *testing.T, streams bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := NewPlan(30001, 4000, 3)
	if err != nil {
		t.Fatal(err)
	}
	rings := loopbackRing(t, 3, p, streams)
	trial := NewTrial(rings, p)
	if _, err := trial.Run(ctx, 2); err != nil {
		t.Fatal(err)
	}
	reduced := make([]int64, len(rings))
	for r, ring := range rings {
		reduced[r], ring.Sent = ring.Sent, 0
	}
	if _, err := trial.RunLinksOnly(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for r, ring := range rings {
		if ring.Sent != reduced[r] || ring.Sent == 0 {
			t.Errorf("rank %d: links only sent %d bytes, the all-reduce %d", r, ring.Sent, reduced[r])
		}
	}
}
