package stages

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/optim"
)

// TestRecipePipelineEqualsReference: a nanoGPT-style recipe, adamw with
// weight decay, a warmup then cosine (or step) learning rate, and gradient
// clipping by the global norm, pipelined equals its one-process reference
// bit for bit; metrics.jsonl logs each step's rate, which is the
// schedule's for the step and changes over the run.
func TestRecipePipelineEqualsReference(t *testing.T) {
	recipe := func(c *configs.Config, kind string) *configs.Config {
		c.Train.Optimizer.Name, c.Train.Optimizer.WeightDecay = "adamw", 0.1
		c.Train.LRSchedule = optim.Schedule{Kind: kind, WarmupSteps: 2, MinLR: c.Train.Optimizer.LR / 10}
		if kind == "step" {
			c.Train.LRSchedule = optim.Schedule{Kind: kind, WarmupSteps: 2, StepSize: 2, Gamma: 0.5}
		}
		c.Train.ClipGradNorm = 0.5
		return c
	}
	cases := []struct {
		name string
		cfg  *configs.Config
		mlp  bool
	}{
		{"mlp/1f1b/cosine", recipe(testConfig("1f1b", plain("0-1", "2", "3-4"), 4, "float32", "adam"), "cosine"), true},
		{"mlp/zb-v/linear", recipe(testConfig("zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 4, "float32", "adam"), "linear"), true},
		{"mlp/interleaved/step", recipe(testConfig("interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 4, "float64", "adam"), "step"), true},
		{"gpt tied/zb-h1/cosine", recipe(gptConfig("zb-h1", plain("0-1", "2-4"), true), "cosine"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			ref := runInProcess(t, cfg, true)
			pipe := runInProcess(t, cfg, false)
			if tc.mlp {
				sameMLPRun(t, cfg, ref, pipe)
			} else {
				sameRun(t, ref, pipe)
			}
			ms, err := ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			sched := cfg.Train.LRSchedule.Resolve(cfg.Train.Steps)
			rates := map[float64]bool{}
			for i, m := range ms {
				want := sched.LR(cfg.Train.Optimizer.LR, int64(i))
				if m.LR == nil || *m.LR != want {
					t.Errorf("step %d: lr %v, want the schedule's %v", m.Step, m.LR, want)
					continue
				}
				rates[*m.LR] = true
			}
			if len(rates) < 3 {
				t.Errorf("the rate took %d values over %d steps: the schedule did not drive it", len(rates), len(ms))
			}
		})
	}
}

// TestProgressLineGivesETAAndTokens: before the last step the line says when
// the run should end at the pace of the steps this process ran, a language
// model's its tokens per second too; the last step's line has no ETA.
func TestProgressLineGivesETAAndTokens(t *testing.T) {
	for _, c := range []struct {
		done, steps, first, tokens int
		elapsed                    time.Duration
		want                       string
	}{
		{10, 20, 0, 1, 5 * time.Second, "step 10/20  loss 1.2500  2532 samples/s  ETA 5s"},
		// Resumed at step 50: 10 steps in 20 s, 40 to go.
		{60, 100, 50, 1, 20 * time.Second, "step 60/100  loss 1.2500  2532 samples/s  ETA 1m20s"},
		{10, 20, 0, 64, 5 * time.Second, "step 10/20  loss 1.2500  2532 samples/s (162048 tokens/s)  ETA 5s"},
		{20, 20, 0, 1, 9 * time.Second, "step 20/20  loss 1.2500  2532 samples/s"},
	} {
		if got := progressLine(c.done, c.steps, c.first, 1.25, 2532, c.elapsed, c.tokens); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}
