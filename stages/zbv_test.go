package stages

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// zbvLayers places layers [0, 2p) in a V: stage s holds layer s on chunk 0
// and layer 2p-1-s on chunk 1.
func zbvLayers(p int) [][]string {
	out := make([][]string, p)
	for s := range out {
		out[s] = []string{fmt.Sprint(s), fmt.Sprint(2*p - 1 - s)}
	}
	return out
}

// TestZBVEqualsReference: zb-v, whose forward runs down the stages and back
// up, hands each micro-batch from chunk to chunk on the last stage and
// computes the loss on stage 0, trains bit for bit the model one runtime
// trains, for p = 2, 3, 4 and several m, with both optimizers; its
// evaluation passes down and up the V too. So does dualpipev, on the same V
// in DualPipeV's order, with full backwards in its steady state and split
// ones in its warm-up and drain (each chunk's engine is split and runs a
// full backward as its input and weight passes back to back).
func TestZBVEqualsReference(t *testing.T) {
	cases := []struct {
		sched  string
		layers [][]string
		micro  []int
	}{
		{"zb-v", zbvLayers(2), []int{3, 4, 6}},
		{"zb-v", [][]string{{"0-1", "5"}, {"2", "3-4"}}, []int{3}}, // uneven chunks
		{"zb-v", zbvLayers(3), []int{4, 5, 6}},
		{"zb-v", zbvLayers(4), []int{6, 8}},
		{"dualpipev", zbvLayers(2), []int{4, 6}},
		{"dualpipev", [][]string{{"0-1", "5"}, {"2", "3-4"}}, []int{4}},
		{"dualpipev", zbvLayers(3), []int{6, 7}},
		{"dualpipev", zbvLayers(4), []int{8, 9}},
	}
	for _, c := range cases {
		for _, micro := range c.micro {
			for _, opt := range []string{"adam", "sgd"} {
				t.Run(fmt.Sprintf("%s/p%d/m%d/%v/%s", c.sched, len(c.layers), micro, c.layers, opt), func(t *testing.T) {
					cfg := testConfig(c.sched, c.layers, micro, "float64", opt)
					ref := runInProcess(t, cfg, true)
					pipe := runInProcess(t, cfg, false)
					sameZBVRun(t, cfg, ref, pipe)
				})
			}
		}
	}
}

// sameZBVRun compares a zb-v run with the reference's: evaluation, weights
// and every step's loss, which stage 0 logs.
func sameZBVRun(t *testing.T, cfg *configs.Config, ref, pipe string) {
	t.Helper()
	sameMLPRun(t, cfg, ref, pipe)
	for _, f := range Outputs(cfg, 0, 0) {
		if _, err := os.Stat(filepath.Join(pipe, f)); err != nil {
			t.Errorf("stage 0 computes the loss, but %v", err)
		}
	}
}

// TestZBVStashAndLinks: each zb-v stage holds what the schedule's
// PeakInFlight says (its two chunks together), every stage's activations
// leave on the link the V takes, and no stage but stage 0 logs losses.
func TestZBVStashAndLinks(t *testing.T) {
	cfg := testConfig("zb-v", zbvLayers(4), 8, "float32", "adam")
	dir, rts := runStages(t, cfg, false)
	info, events, err := profile.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Placement != "v" || profile.RunPlacement(info) != schedule.V {
		t.Errorf("run.json placement %q", info.Placement)
	}
	// The profile pairs the V's messages: three links, no ring, each
	// carrying chunk 0's activations and chunk 1's gradients down, the
	// others up, m of each a step; the turn's hand-offs use no link.
	rep, err := profile.Analyse(info, events, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Links) != 3 {
		t.Fatalf("%d links, want 3", len(rep.Links))
	}
	for i, l := range rep.Links {
		want := 2 * 8 * rep.StepsAnalysed
		if l.Ring || l.From != i || l.To != i+1 || l.Down.Messages != want || l.Up.Messages != want {
			t.Errorf("link %d: %+v, want %d messages each way", i, l, want)
		}
	}
	sched, err := schedule.Build("zb-v", 4, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := sched.PeakInFlight()
	for s, evs := range events {
		peak := 0
		for _, e := range evs {
			peak = max(peak, e.Stashed)
		}
		if peak != want[s] || peak != 2*4 {
			t.Errorf("stage %d: peak stash %d chunks, schedule says %d", s, peak, want[s])
		}
	}
	for s, rt := range rts {
		// What the stage logs at the end is its two chunks' peak together,
		// not the sum of each chunk's own (chunk 0 reaches 8-s, chunk 1 s+1).
		if rt.peakStash != want[s] {
			t.Errorf("stage %d logs a peak of %d, the schedule says %d", s, rt.peakStash, want[s])
		}
		if (rt.prev != nil) != (s > 0) || (rt.next != nil) != (s < 3) {
			t.Errorf("stage %d: links prev %v next %v; a V links neighbours only", s, rt.prev != nil, rt.next != nil)
		}
		if rt.holdsLoss() != (s == 0) || rt.holdsFirst() != (s == 0) {
			t.Errorf("stage %d: holds the loss %v, the data %v", s, rt.holdsLoss(), rt.holdsFirst())
		}
	}
	if NeedsRing(cfg, rts[0].layout.Model) {
		t.Error("a V needs no ring")
	}
	if _, err := os.Stat(filepath.Join(dir, "metrics.jsonl")); err != nil {
		t.Errorf("stage 0 logs the losses: %v", err)
	}
	for s := range 4 {
		if got, wantAt := len(LinkShapes(cfg, rts[s].layout.Model, s)), map[bool]int{true: 2, false: 0}[s < 3]; got != wantAt {
			t.Errorf("the link stage %d dials carries %d tags, want %d (chunk 0 down, chunk 1 up)", s, got, wantAt)
		}
	}
}

// TestZBVOverGRPC runs zb-v's stages in this process over gRPC links on
// 127.0.0.1, connected as pipetrain stage connects them (handshakes
// included): the V's two directions share each link, and the run equals the
// reference bit for bit.
func TestZBVOverGRPC(t *testing.T) {
	cfg := testConfig("zb-v", zbvLayers(3), 5, "float64", "adam")
	p := len(cfg.Stages)
	listeners := make([]net.Listener, p)
	for i := range listeners {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[i] = lis
		cfg.Stages[i].Address = lis.Addr().String()
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pipe := t.TempDir()
	train, test := synthetic(96, 8, 3, 1), synthetic(30, 8, 3, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg sync.WaitGroup
	for i := range p {
		wg.Go(func() {
			errs[i] = func() error {
				l, err := NewLayout(cfg, i)
				if err != nil {
					return err
				}
				l.Listener = listeners[i]
				links, err := Connect(ctx, l)
				if err != nil {
					return err
				}
				defer links.Close()
				rt, err := New(Options{Layout: l, Config: cfg, Stage: i, RunDir: pipe, Prev: links.Prev, Next: links.Next, Train: train, Test: test})
				if err != nil {
					return err
				}
				return rt.Run(ctx)
			}()
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	sameZBVRun(t, cfg, runInProcess(t, cfg, true), pipe)
}

// TestTiedUnderV: a V-shaped schedule with whole backwards runs the tied
// GPT (zb-v itself, which splits them, is in TestGPTPipelineEqualsReference): stage 0 holds
// both the embedding and the head, sums the tied gradients alone (no ring,
// no exchange) and trains exactly the reference's model.
func TestTiedUnderV(t *testing.T) {
	// zb-v itself runs the GPT (TestGPTPipelineEqualsReference); here the
	// V with whole backwards, which no layer needs to split for.
	if err := gptConfig("zb-v", [][]string{{"0", "4"}, {"1", "2-3"}}, true).Validate(); err != nil {
		t.Fatalf("zb-v with the GPT: %v", err)
	}
	// zb-v's order with each input-gradient pass made whole and the weight
	// passes dropped.
	zbv, err := schedule.Build("zb-v", 2, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	for st, list := range zbv.Actions {
		var whole []schedule.Action
		for _, a := range list {
			switch a.Kind {
			case schedule.Input:
				a.Kind = schedule.Backward
			case schedule.Weight:
				continue
			}
			whole = append(whole, a)
		}
		zbv.Actions[st] = whole
	}
	file := filepath.Join(t.TempDir(), "v.txt")
	if err := os.WriteFile(file, []byte(zbv.Grid()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := gptConfig("custom", [][]string{{"0", "4"}, {"1", "2-3"}}, true)
	cfg.ScheduleFile = file
	ref := runInProcess(t, cfg, true)
	pipe, rts := runStages(t, cfg, false)
	sameRun(t, ref, pipe)
	var tied []string
	for _, o := range rts[0].ops {
		if o.Kind == schedule.SyncTied {
			tied = append(tied, o.String())
		}
	}
	if fmt.Sprint(tied) != "[0T0]" || NeedsRing(cfg, rts[0].layout.Model) || rts[1].next != nil {
		t.Errorf("stage 0's tied ops %v, ring %v: the sum is stage 0's alone", tied, NeedsRing(cfg, rts[0].layout.Model))
	}
	w := readWeights(t, pipe)
	if err := checkpoint.DiffTensor(w["embed.tok"], w["head.tok"]); err != nil {
		t.Fatalf("tied copies differ after training: %v", err)
	}
}

// TestZBVStalledNeighbourNamesWhatItWaitsFor: stage 0 of a zb-v waits first
// for micro-batch 0 to come back up the V on chunk 1; it arrives on the link
// stage 0 dials, the way gradients come, but the error calls it what it is.
func TestZBVStalledNeighbourNamesWhatItWaitsFor(t *testing.T) {
	c := testConfig("zb-v", zbvLayers(2), 3, "float32", "sgd")
	c.Transport.RecvTimeout = 200 * time.Millisecond
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	_, down, err := Hellos(c, 0)
	if err != nil {
		t.Fatal(err)
	}
	up, _, err := Hellos(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	link, silent := transport.Pipe(down, up, 16) // room for every forward stage 0 sends before it waits
	defer silent.Close()
	rt, err := New(Options{Config: c, Stage: 0, RunDir: t.TempDir(), Next: link, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
	if err != nil {
		t.Fatal(err)
	}
	err = rt.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "waiting for activation of step 1 micro-batch 0 chunk 1 from stage 1") {
		t.Errorf("error %v, want the wait for chunk 1's activation named", err)
	}
}
