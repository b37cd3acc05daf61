package stages

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
)

// TestEvalJudgeStopsAfterPatience: an evaluation improves when it is below
// the best by more than min_delta; patience evaluations in a row that do
// not stop the run. Its state survives a checkpoint's metadata.
func TestEvalJudgeStopsAfterPatience(t *testing.T) {
	j := &evalJudge{patience: 2, minDelta: 0.05}
	for i, c := range []struct {
		v    float64
		stop bool
	}{{1.0, false}, {0.9, false}, {0.88, false}, {0.95, true}} {
		if got := j.observe(10*(i+1), c.v); got != c.stop {
			t.Fatalf("evaluation %d (%v): stop %v, want %v (%+v)", i+1, c.v, got, c.stop, j)
		}
	}
	if j.best != 0.9 || j.bestStep != 20 || j.since != 2 {
		t.Errorf("judge %+v: want best 0.9 after step 20, 2 evaluations since", j)
	}
	meta := map[string]string{}
	j.record(40, meta, checkpoint.MetricKey)
	if meta[checkpoint.MetricKey] != "0.95" {
		t.Errorf("the checkpoint of step 40 records %q as its metric, want 0.95", meta[checkpoint.MetricKey])
	}
	back := &evalJudge{patience: 2, minDelta: 0.05}
	if err := back.restore(meta, "part"); err != nil {
		t.Fatal(err)
	}
	if back.best != j.best || back.bestStep != j.bestStep || back.since != j.since || !back.seen {
		t.Errorf("restored %+v, want %+v", back, j)
	}
	if fresh := (&evalJudge{patience: 2}); fresh.restore(map[string]string{}, "part") != nil || fresh.seen {
		t.Error("a checkpoint before any evaluation restored a judged state")
	}
}

// TestEarlyStopEqualsReference: a run whose evaluations stop improving
// stops after patience of them, at the same step pipelined and in one
// process, with the same losses and weights bit for bit; its final weights
// say the step it stopped at and count as finished, and keep_best keeps
// the checkpoint of the best evaluation beside the newest.
func TestEarlyStopEqualsReference(t *testing.T) {
	judged := func(c *configs.Config) *configs.Config {
		c.Train.Steps, c.Train.EvalEvery = 12, 2
		// No evaluation can improve by 10: the run stops after the first
		// and two more, at step 6.
		c.Train.EarlyStop = configs.EarlyStop{Metric: "val_loss", Patience: 2, MinDelta: 10}
		c.Checkpoint = configs.Checkpoint{Every: 2, Keep: 1, KeepBest: 1}
		return c
	}
	cases := []struct {
		name string
		cfg  *configs.Config
		mlp  bool
	}{
		{"1f1b/3 stages", judged(testConfig("1f1b", plain("0-1", "2", "3-4"), 2, "float32", "adam")), true},
		{"zb-v", judged(testConfig("zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 4, "float32", "sgd")), true},
		{"interleaved", judged(testConfig("interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 2, "float64", "adam")), true},
		{"gpt tied", judged(gptConfig("1f1b", plain("0-1", "2-4"), true)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			ref := runInProcess(t, cfg, true)
			pipe := runInProcess(t, cfg, false)
			ms, err := ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != 6 {
				t.Fatalf("the pipeline logged %d steps, want 6: it should stop after step 6", len(ms))
			}
			stopped := *cfg
			stopped.Train.Steps = 6 // what the comparisons expect
			if tc.mlp {
				sameMLPRun(t, &stopped, ref, pipe)
			} else {
				sameRun(t, ref, pipe)
			}
			if !Finished(cfg, pipe) {
				t.Error("a run stopped early does not count as finished")
			}
			meta, err := checkpoint.ReadMeta(weightsFile(pipe, 0))
			if err != nil || meta["step"] != "6" {
				t.Errorf("final weights say step %q (%v), want 6", meta["step"], err)
			}
			// Checkpoints of steps 2, 4, 6: the newest (6) and the best.
			best := 0
			for _, m := range ms {
				if m.Eval != nil && (best == 0 || m.Eval.Loss < ms[best-1].Eval.Loss) {
					best = m.Step
				}
			}
			dirs, _ := filepath.Glob(filepath.Join(pipe, "checkpoints", "step-*"))
			var kept []int
			for _, d := range dirs {
				if _, err := os.Stat(filepath.Join(d, checkpoint.ManifestName)); err == nil {
					n, _ := strconv.Atoi(filepath.Base(d)[len("step-"):])
					kept = append(kept, n)
				}
			}
			want := []int{best, 6}
			if best == 6 {
				want = []int{6}
			}
			if !slices.Equal(kept, want) {
				t.Errorf("checkpoints kept %v, want %v (the best evaluation was after step %d)", kept, want, best)
			}
		})
	}
}
