package stages

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
)

func TestGate(t *testing.T) {
	cases := []struct {
		asked      bool
		stop, step int
		want       verdict
	}{
		{false, -1, 0, startStep},
		{false, -1, 9, startStep},
		{true, -1, 4, waitStep}, // asked: nothing starts before the stop step is known
		{true, 6, 4, startStep}, // behind the stop step: catch up
		{true, 6, 5, startStep},
		{true, 6, 6, stopHere}, // steps 0-5 done, that is 6 steps: stop
		{true, 0, 0, stopHere},
	}
	for _, c := range cases {
		if got := gate(c.asked, c.stop, c.step); got != c.want {
			t.Errorf("gate(asked %v, stop %d, step %d) = %d, want %d", c.asked, c.stop, c.step, got, c.want)
		}
	}
}

// enterSoon runs p.enter(step) and returns its outcome, or ok false if it
// is still waiting after a moment.
func enterSoon(p *Pause, step int) (stop bool, err error, ok bool) {
	type result struct {
		stop bool
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := p.enter(context.Background(), step)
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		return r.stop, r.err, true
	case <-time.After(100 * time.Millisecond):
		return false, nil, false
	}
}

// Two stages one step apart when the pause comes: each answers the boundary
// it reaches, both are told the larger, and the one behind catches up to it
// while the one ahead starts nothing more.
func TestPauseStopsStagesAtTheLargestBoundary(t *testing.T) {
	if got := NewPause().Ask(); got != -1 {
		t.Fatalf("asked before the step loop began: answer %d, want -1", got)
	}
	ahead, behind := NewPause(), NewPause()
	ahead.begin(2)
	behind.begin(2)
	for step := 2; step <= 5; step++ {
		if stop, err := ahead.enter(context.Background(), step); stop || err != nil {
			t.Fatalf("unpaused stage at step %d: stop %v, %v", step, stop, err)
		}
	}
	for step := 2; step <= 4; step++ {
		behind.enter(context.Background(), step)
	}
	a, b := ahead.Ask(), behind.Ask()
	if a != 6 || b != 5 {
		t.Fatalf("answers %d and %d; want 6 (in step 6) and 5 (finished step 5)", a, b)
	}
	if _, _, ok := enterSoon(behind, 5); ok {
		t.Fatal("a paused stage started a step before it knew the stop step")
	}
	stop := max(a, b)
	ahead.StopAfter(stop)
	behind.StopAfter(stop)
	behind.StopAfter(9) // a repeat must not move the stop step
	if s, err, ok := enterSoon(behind, 5); !ok || s || err != nil {
		t.Fatalf("the stage behind, told to stop after 6, at step index 5: stop %v, %v, returned %v; want it to start", s, err, ok)
	}
	for name, p := range map[string]*Pause{"ahead": ahead, "behind": behind} {
		if s, err, ok := enterSoon(p, 6); !ok || !s || err != nil {
			t.Errorf("stage %s at step index 6: stop %v, %v, returned %v; want it to stop", name, s, err, ok)
		}
	}
}

func TestPausedStageStopsOnCancel(t *testing.T) {
	p := NewPause()
	p.begin(0)
	p.Ask()
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("terminated")
	time.AfterFunc(50*time.Millisecond, func() { cancel(cause) })
	if _, err := p.enter(ctx, 0); !errors.Is(err, cause) {
		t.Fatalf("paused stage cancelled: %v, want %v", err, cause)
	}
	var none *Pause
	if stop, err := none.enter(ctx, 3); stop || err != nil {
		t.Errorf("no pause: stop %v, %v", stop, err)
	}
}

// TestStopAfterWritesCheckpointAndResumes: stages told to stop after step 3,
// with checkpoint.every 2 (and 0, off), write the checkpoint of step 3, end
// with ErrPaused and no final weights, and a run resumed from it ends as the
// run never stopped, bit for bit; under zb-v stage 0 computes the loss.
func TestStopAfterWritesCheckpointAndResumes(t *testing.T) {
	cases := []struct {
		name   string
		sched  string
		layers [][]string
		every  int
	}{
		{"1f1b", "1f1b", plain("0", "1-2", "3"), 2},
		{"1f1b/checkpoints off", "1f1b", plain("0-1", "2-3"), 0},
		{"zb-v", "zb-v", zbvLayers(2), 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			micro := 2
			if tc.sched == "zb-v" {
				micro = 3
			}
			cfg := testConfig(tc.sched, tc.layers, micro, "float32", "adam")
			cfg.Train.Steps = 6
			cfg.Checkpoint.Every = tc.every
			full := runInProcess(t, cfg, false)

			dir := t.TempDir()
			pauses := make([]*Pause, len(cfg.Stages))
			for i := range pauses {
				pauses[i] = NewPause()
				pauses[i].StopAfter(3)
			}
			_, errs := runPausable(t, cfg, false, dir, false, pauses)
			for i, err := range errs {
				if !errors.Is(err, ErrPaused) {
					t.Fatalf("stage %d: %v, want ErrPaused", i, err)
				}
			}
			m, _, err := checkpoint.Latest(CheckpointDir(dir), cfg.TrainingDigest())
			if err != nil || m == nil || m.Step != 3 {
				t.Fatalf("newest checkpoint %+v, %v; want step 3", m, err)
			}
			if _, err := os.Stat(dir + "/weights/stage-0.safetensors"); !os.IsNotExist(err) {
				t.Errorf("a stopped run wrote final weights: %v", err)
			}
			runStagesIn(t, cfg, false, dir, true)
			sameWeights(t, full, dir)
			sameLosses(t, full, dir)
		})
	}
}
