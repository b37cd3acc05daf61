package stages

import (
	"math"
	"math/big"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/profile"
)

// TestNormSumIsExactInAnyOrder: the parts of a squared norm, from subnormal
// to huge, summed in two orders and split in two sums merged over the wire
// give the same float64, the correctly rounded exact sum.
func TestNormSumIsExactInAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vals := []float64{math.SmallestNonzeroFloat64, 3 * math.SmallestNonzeroFloat64, 1e-310, 1e300, 1, 0}
	for range 200 {
		vals = append(vals, math.Ldexp(r.Float64(), r.IntN(200)-100))
	}
	exact := new(big.Float).SetPrec(4000)
	for _, v := range vals {
		exact.Add(exact, new(big.Float).SetFloat64(v))
	}
	want, _ := exact.Float64()

	var forward, backward, a, b normSum
	for i, v := range vals {
		forward.add(v)
		backward.add(vals[len(vals)-1-i])
		if i%3 == 0 {
			a.add(v)
		} else {
			b.add(v)
		}
	}
	wire, err := b.bytes()
	if err != nil {
		t.Fatal(err)
	}
	var got normSum
	got.setBytes(wire)
	got.merge(&a)
	for name, s := range map[string]*normSum{"forward": &forward, "backward": &backward, "split": &got} {
		if v := s.float64(); v != want {
			t.Errorf("%s: %v, want %v", name, v, want)
		}
	}
	// A plain float64 sum depends on the order: the case is not trivial.
	var f, g float64
	for i, v := range vals {
		f += v
		g += vals[len(vals)-1-i]
	}
	if f == g && f == want {
		t.Log("the float64 sums happen to agree; exactness is still shown by the big.Float comparison")
	}
}

// TestClippedPipelineEqualsReference: with train.clip_grad_norm the stages
// agree on the global norm along the pipeline and clip by it; the run
// equals its one-process reference bit for bit, logs the norm per step (the
// same in both), clips at least one step, and ends elsewhere than the same
// run unclipped.
func TestClippedPipelineEqualsReference(t *testing.T) {
	mlp := func(sched string, layers [][]string, dtype, opt string) func() *configs.Config {
		return func() *configs.Config { return testConfig(sched, layers, 4, dtype, opt) }
	}
	cases := []struct {
		name string
		cfg  func() *configs.Config
		mlp  bool
	}{
		{"1f1b/3 stages/float32/sgd", mlp("1f1b", plain("0-1", "2", "3-4"), "float32", "sgd"), true},
		{"gpipe/float64/adam", mlp("gpipe", plain("0-1", "2-3"), "float64", "adam"), true},
		{"interleaved/2x2", mlp("interleaved", [][]string{{"0", "2"}, {"1", "3"}}, "float32", "adam"), true},
		{"zb-v", mlp("zb-v", [][]string{{"0", "3"}, {"1", "2"}}, "float32", "sgd"), true},
		{"gpt tied/1f1b", func() *configs.Config { return gptConfig("1f1b", plain("0-1", "2-4"), true) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg()
			unclipped := runInProcess(t, cfg, false)
			cfg.Train.ClipGradNorm = 0.05
			ref := runInProcess(t, cfg, true)
			pipe := runInProcess(t, cfg, false)
			if tc.mlp {
				sameMLPRun(t, cfg, ref, pipe)
			} else {
				sameRun(t, ref, pipe)
			}
			mr, err1 := ReadMetrics(filepath.Join(ref, "metrics.jsonl"))
			mp, err2 := ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			clipped := false
			for i := range mp {
				if mp[i].GradNorm == nil || mr[i].GradNorm == nil || *mp[i].GradNorm != *mr[i].GradNorm {
					t.Fatalf("step %d: grad_norm %v in the pipeline, %v in the reference", i+1, mp[i].GradNorm, mr[i].GradNorm)
				}
				clipped = clipped || *mp[i].GradNorm > cfg.Train.ClipGradNorm
			}
			if !clipped {
				t.Errorf("no step's norm exceeded %v: the test shows nothing", cfg.Train.ClipGradNorm)
			}
			if checkpoint.Diff(readWeights(t, unclipped), readWeights(t, pipe)) == nil {
				t.Error("the clipped run ended with the unclipped run's weights")
			}
		})
	}
}

// TestClippingIsProfiled: each stage logs its clipping per step as a
// ClipNorm event, which the profile reports apart from the busy time.
func TestClippingIsProfiled(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	cfg.Train.ClipGradNorm = 0.05
	pipe := runInProcess(t, cfg, false)
	info, events, err := profile.ReadRun(pipe)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := profile.Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if s.Clip <= 0 || s.Clip >= rep.Window {
			t.Errorf("stage %d clipped for %v of a %v window", s.Stage, s.Clip, rep.Window)
		}
	}
	if !strings.Contains(b.String(), "gradient clipping a step") {
		t.Errorf("the report does not show the clipping:\n%s", b.String())
	}
}
