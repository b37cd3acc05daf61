package stages

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/profile"
)

// slowKind is the ramp on a slow disk: each training read sleeps, readIn for
// a micro-batch's inputs and readTargets for its targets.
type slowKind struct{ rampKind }

const readIn, readTargets = 3 * time.Millisecond, 8 * time.Millisecond

func (*slowKind) Name() string { return "slow-ramp" }

func (k *slowKind) Open(s *data.Section, m *data.Model, o data.OpenOptions) (data.Source, error) {
	src, err := k.rampKind.Open(s, m, o)
	if err != nil {
		return nil, err
	}
	return &slowSource{src.(*rampSource)}, nil
}

type slowSource struct{ *rampSource }

func (s *slowSource) Train(step, mb int, x data.Inputs, targets bool) []int {
	if x.F32 != nil || x.F64 != nil {
		time.Sleep(readIn)
	}
	if targets {
		time.Sleep(readTargets)
	}
	return s.rampSource.Train(step, mb, x, targets)
}

func init() { data.Register(&slowKind{}) }

// TestSlowDataIsReadAhead: on a slow source the first stage reads each
// forward's inputs while it computes the forward before (and the last stage
// its targets), so its forwards wait for a small part of the time the reads
// take; the events record both, the profile shows them, and the pipeline,
// whose reads overlap its evaluation passes too, trains bit for bit as the
// reference fed by the ramp without delays.
func TestSlowDataIsReadAhead(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 8, "float64", "sgd")
	cfg.Train.Steps, cfg.Train.EvalEvery = 3, 1
	cfg.Data.Dataset = "ramp"
	ref := runInProcess(t, cfg, true)
	cfg.Data.Dataset = "slow-ramp"
	pipe := runInProcess(t, cfg, false)
	sameMLPRun(t, cfg, ref, pipe)

	info, events, err := profile.ReadRun(pipe)
	if err != nil {
		t.Fatal(err)
	}
	var read, waited [2]time.Duration
	for s, least := range []time.Duration{readIn, readTargets} {
		n := 0
		for _, e := range events[s] {
			if e.Kind != profile.Forward {
				if e.DataNS != 0 || e.DataWaitNS != 0 {
					t.Errorf("stage %d: %s %d of step %d records data %d ns, waited %d ns", s, e.Kind, e.MB, e.StepNumber(), e.DataNS, e.DataWaitNS)
				}
				continue
			}
			n++
			if d := time.Duration(e.DataNS); d < least {
				t.Errorf("stage %d: forward %d of step %d read its data in %v, the source sleeps %v", s, e.MB, e.StepNumber(), d, least)
			}
			if w := e.DataWaitNS; w < 0 || w > e.EndNS-e.StartNS {
				t.Errorf("stage %d: forward %d of step %d waited %d ns for its data, outside its %d ns", s, e.MB, e.StepNumber(), w, e.EndNS-e.StartNS)
			}
			read[s] += time.Duration(e.DataNS)
			waited[s] += time.Duration(e.DataWaitNS)
		}
		if want := cfg.Train.Steps * cfg.Data.MicroBatches; n != want {
			t.Errorf("stage %d logged %d forwards, want %d", s, n, want)
		}
	}
	t.Logf("reads took %v on stage 0 and %v on stage 1; their forwards waited %v and %v", read[0], read[1], waited[0], waited[1])
	// Stage 1 reads its targets one after another, each while it waits for
	// the next activation, so stage 0's forwards come no faster than one a
	// readTargets: read ahead, its inputs are ready but for its first
	// forwards. Read as it computes, every read would be waited for.
	if waited[0] > read[0]/3 {
		t.Errorf("stage 0's forwards waited %v of the %v its reads took: not read ahead", waited[0], read[0])
	}

	r, err := profile.Analyse(info, events, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	for s := range 2 {
		if got := r.Stages[s]; got.Data != read[s] || got.DataWait != waited[s] {
			t.Errorf("profile: stage %d data %v, waited %v; the events say %v and %v", s, got.Data, got.DataWait, read[s], waited[s])
		}
	}
	// Stage 1's forwards wait for most of their reads: the costs the
	// simulator reads from the run charge them.
	if f, n := profile.MeanCosts(events, 0)[1].F, time.Duration(cfg.Train.Steps*cfg.Data.MicroBatches); f < waited[1]/n {
		t.Errorf("stage 1's mean forward costs %v from the events, less than the %v it waited for its data", f, waited[1]/n)
	}
	if !strings.Contains(b.String(), "data ms") || !strings.Contains(b.String(), "data: stage 0 read for ") {
		t.Errorf("the profile shows no data time:\n%s", b.String())
	}
}

// TestReadAheadEndsWithRun: a stage stopped at a step boundary had begun
// reading the next step's first input; Run waits for that read before it
// returns and keeps its buffer as a spare, so no reader outlives it.
func TestReadAheadEndsWithRun(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	cfg.Data.Dataset = "slow-ramp"
	cfg.Train.Steps, cfg.Train.Evaluate = 6, false
	pauses := []*Pause{NewPause(), NewPause()}
	for _, p := range pauses {
		p.StopAfter(3)
	}
	rts, errs := runPausable(t, cfg, false, t.TempDir(), false, pauses)
	for i, err := range errs {
		if !errors.Is(err, ErrPaused) {
			t.Fatalf("stage %d: %v, want ErrPaused", i, err)
		}
	}
	r := rts[0]
	// Two micro-batches in flight, and the next one's read ahead.
	if r.fetching != nil || len(r.inputs) != 0 || len(r.spareInputs) != 3 {
		t.Errorf("after Run: reading %v, %d inputs held, %d spare; want none, none, 3", r.fetching != nil, len(r.inputs), len(r.spareInputs))
	}
}
