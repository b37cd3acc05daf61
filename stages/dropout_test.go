package stages

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
)

// dropoutConfig is sequentialConfig with dropout on the image (stack[2],
// in unit 0), after the first linear (stack[6], unit 1) and inside the
// residual group (stack[7].stack[2], units 2 and 3, one mask each): still
// 5 units.
func dropoutConfig(sched string, layers [][]string) *configs.Config {
	return withDropout(sequentialConfig(sched, layers), func(p float64) map[string]any { return map[string]any{"type": "dropout", "p": p} })
}

// withDropout inserts the entries that entryFor(p) gives into c's
// sequential stack where dropoutConfig puts its dropouts.
func withDropout(c *configs.Config, entryFor func(p float64) map[string]any) *configs.Config {
	stack := c.Model.Own["stack"].([]any)
	group := stack[5].(map[string]any)
	body := slices.Insert(slices.Clone(group["stack"].([]any)), 2, any(entryFor(0.25)))
	group = map[string]any{"type": "residual", "repeat": group["repeat"], "stack": body}
	out := slices.Concat(stack[:2], []any{entryFor(0.3)}, stack[2:5], []any{entryFor(0.5), group}, stack[6:])
	c.Model.Own = map[string]any{"input_shape": c.Model.Own["input_shape"], "stack": out}
	return c
}

// identityConfig is dropoutConfig without dropout but with the same module
// indices, parameters and names: each dropout on flat features a flatten
// (which leaves them as they are), the image's a second relu (relu∘relu is
// relu).
func identityConfig(sched string, layers [][]string) *configs.Config {
	c := withDropout(sequentialConfig(sched, layers), func(float64) map[string]any { return map[string]any{"type": "flatten"} })
	c.Model.Own["stack"].([]any)[2] = map[string]any{"type": "relu"}
	return c
}

// TestSequentialDropoutEqualsReference: a sequential model with dropout,
// split over stages under gpipe, 1f1b, zb-h1, zb-v, interleaved and
// dualpipev, trains bit for bit
// as the one-process reference does: each micro-batch draws its masks from
// (seed, step, its index in the global batch, the entry), wherever it is
// computed, and its backward (zb's input pass, much later) draws the same
// again. The dropout is live: the same model without it trains to other
// losses.
func TestSequentialDropoutEqualsReference(t *testing.T) {
	for _, tc := range []struct {
		sched  string
		layers [][]string
	}{
		{"1f1b", plain("0-1", "2-4")},
		{"zb-h1", plain("0", "1-4")},
		{"gpipe", plain("0", "1", "2", "3-4")},
		{"zb-v", [][]string{{"0", "4"}, {"1-2", "3"}}},
		{"interleaved", [][]string{{"0", "2"}, {"1", "3-4"}}},
		{"dualpipev", [][]string{{"0", "4"}, {"1-2", "3"}}},
	} {
		t.Run(fmt.Sprintf("%s/p%d", tc.sched, len(tc.layers)), func(t *testing.T) {
			cfg := dropoutConfig(tc.sched, tc.layers)
			ref := runInProcess(t, cfg, true)
			sameRun(t, ref, runInProcess(t, cfg, false))
			if tc.sched != "1f1b" {
				return
			}
			without := readLosses(t, runInProcess(t, identityConfig(tc.sched, tc.layers), true))
			with := readLosses(t, ref)
			if len(with) == 0 || with[0] == without[0] {
				t.Errorf("losses with dropout %v, without %v: the dropout drew nothing", with, without)
			}
		})
	}
}

// TestSequentialDropoutRecomputes: stages that recompute their forwards
// (full) draw the forward's masks again, so the run equals the reference,
// which keeps every activation.
func TestSequentialDropoutRecomputes(t *testing.T) {
	for _, tc := range []struct {
		sched  string
		layers [][]string
		modes  []string
	}{
		{"1f1b", plain("0-1", "2-4"), []string{"full", "full"}},
		{"zb-h1", plain("0", "1-4"), []string{"full", "none"}},
	} {
		t.Run(tc.sched, func(t *testing.T) {
			cfg := dropoutConfig(tc.sched, tc.layers)
			for i, m := range tc.modes {
				cfg.Stages[i].Recompute = m
			}
			pipe := runInProcess(t, cfg, false)
			sameRun(t, runInProcess(t, cfg, true), pipe)
			checkRecomputeEvents(t, pipe, tc.modes, cfg.Data.MicroBatches)
		})
	}
}

// TestSequentialDropoutEvaluates: evaluation draws nothing. The run's own
// final evaluation (by the engines that trained with dropout) equals the
// evaluation of its weights by the same model and by the model without
// dropout (identityConfig), bit for bit.
func TestSequentialDropoutEvaluates(t *testing.T) {
	cfg := dropoutConfig("1f1b", plain("0-1", "2-4"))
	run := runInProcess(t, cfg, false)
	want := readEvalJSON(t, run)
	for name, c := range map[string]*configs.Config{"with dropout": cfg, "without": identityConfig("1f1b", plain("0-1", "2-4"))} {
		got, err := EvaluateWeights(context.Background(), evalData(t, c), run)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if *got != want {
			t.Errorf("%s: evaluated %+v, the run's eval.json %+v", name, *got, want)
		}
	}
}

// TestSequentialDropoutReplicas: 2 stages × 2 replicas in process, each
// replica's micro-batches keyed by their index in the global batch (replica
// 1's first is micro_batches), train bit for bit as the reference does with
// the whole batch.
func TestSequentialDropoutReplicas(t *testing.T) {
	cfg := dropoutConfig("zb-h1", plain("0-1", "2-4"))
	cfg.DataParallel, cfg.Data.BatchSize = 2, 2*cfg.Data.BatchSize
	cfg.AllReduce.BucketBytes, cfg.AllReduce.CheckEvery = 256, 2
	for s := range cfg.Stages {
		addrs := []string{fmt.Sprintf("127.0.0.1:%d", 7000+2*s), fmt.Sprintf("127.0.0.1:%d", 7001+2*s)}
		cfg.Stages[s].Address, cfg.Stages[s].Addresses = addrs[0], addrs
	}
	ref := runInProcess(t, cfg, true)
	dir := t.TempDir()
	runGrid(t, cfg, dir, false)
	sameRun(t, ref, dir)
}

// blindDevice opens the cpu engine behind a plain compute.Stage, which
// cannot be told the training forwards' keys.
type blindDevice struct{}

func (blindDevice) Kind() string { return "blind" }

func (blindDevice) Open(s compute.Spec) (compute.Stage, error) {
	e, err := engine.NewEngine(s.Model, s.First, s.Last, s.Batch, s.Seed, s.Options)
	return struct{ compute.Stage }{e}, err
}

func init() { compute.Register(blindDevice{}) }

// TestSequentialDropoutNeedsADrawingDevice: a stage whose layers hold a
// dropout refuses a device that cannot be told the keys, rather than
// train without the dropout; the model without dropout trains on it as the
// reference does.
func TestSequentialDropoutNeedsADrawingDevice(t *testing.T) {
	cfg := dropoutConfig("1f1b", plain("0-1", "2-4"))
	cfg.Stages[0].Device = "blind"
	_, err := New(Options{Config: cfg, Stage: 0, RunDir: t.TempDir(), Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
	want := `stage 0 chunk 0: layers [0, 2) hold dropout, whose masks device "blind" cannot draw: its compute.Stage is not a compute.Drawing`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	cfg = identityConfig("1f1b", plain("0-1", "2-4"))
	cfg.Stages[0].Device = "blind"
	sameRun(t, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
}

// TestSequentialDropoutResumes: the masks are keyed by the step itself, not
// drawn from a generator a checkpoint would have to hold, so a run stopped
// after 4 of 6 steps and resumed from its checkpoint ends as the run never
// stopped.
func TestSequentialDropoutResumes(t *testing.T) {
	cfg := dropoutConfig("zb-h1", plain("0-1", "2-4"))
	cfg.Train.Steps = 6
	cfg.Checkpoint.Every, cfg.Checkpoint.Keep = 2, 2
	full := runInProcess(t, cfg, false)
	dir := t.TempDir()
	cfg.Train.Steps = 4
	runStagesIn(t, cfg, false, dir, false)
	cfg.Train.Steps = 6
	runStagesIn(t, cfg, false, dir, true)
	sameWeights(t, full, dir)
	sameLosses(t, full, dir)
}
