package stages

import (
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// TestDivergingRunStopsAtTheStep: with a huge learning rate the loss of step
// 4 is NaN. The stage that computes it stops there with an error naming the
// step and itself, before sending a gradient made of it; its neighbour stops
// at the same step on the closed link; metrics.jsonl holds the finite steps
// before it.
func TestDivergingRunStopsAtTheStep(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2"), 2, "float32", "sgd")
	c.Train.Optimizer.LR = 1e20
	c.Train.Steps = 20
	dir := t.TempDir()
	_, errs := runPausable(t, c, false, dir, false, nil)
	if !errors.Is(errs[1], ErrNonFinite) || errs[1].Error() != "loss became NaN at step 4 (stage 1)" {
		t.Errorf("stage 1: %v; want the loss's NaN at step 4", errs[1])
	}
	if errs[0] == nil || errors.Is(errs[0], ErrNonFinite) || !strings.HasPrefix(errs[0].Error(), "stage 0, step 4: ") {
		t.Errorf("stage 0: %v; want it stopped at step 4 by the lost link", errs[0])
	}
	ms, err := ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil || len(ms) != 3 {
		t.Fatalf("metrics: %v, %v; want steps 1-3", ms, err)
	}
	for _, m := range ms {
		if !finite(m.Loss) {
			t.Errorf("step %d logged loss %v", m.Step, m.Loss)
		}
	}
}

// TestNonFiniteGradientIsNamed: a gradient holding a NaN or an infinity
// stops the step, naming the parameter, the step and the stage.
func TestNonFiniteGradientIsNamed(t *testing.T) {
	c := testConfig("gpipe", plain("0-1", "2"), 2, "float32", "sgd")
	_, rts := runStages(t, c, false)
	rt := rts[0]
	if err := rt.checkGradients(6); err != nil {
		t.Fatalf("finite gradients refused: %v", err)
	}
	_, grads, err := stepGrads(rt.chunks[0])
	if err != nil {
		t.Fatal(err)
	}
	name := rt.chunks[0].Weights()[1].Name
	for _, tc := range []struct {
		v    float32
		want string
	}{{float32(math.NaN()), "NaN"}, {float32(math.Inf(1)), "+Inf"}, {float32(math.Inf(-1)), "-Inf"}} {
		g := grads[1].Data().([]float32)
		g[len(g)-1] = tc.v
		err := rt.checkGradients(6)
		if want := "gradient of " + name + " became " + tc.want + " at step 7 (stage 0)"; !errors.Is(err, ErrNonFinite) || err.Error() != want {
			t.Errorf("%v: error %v, want %q", tc.v, err, want)
		}
		g[len(g)-1] = 0
	}
}

func TestFirstNonFinite(t *testing.T) {
	big := float32(math.MaxFloat32)
	for _, tc := range []struct {
		data []float32
		bad  bool
	}{
		{[]float32{1, -2, 3}, false},
		{[]float32{big, big, big}, false}, // the float64 sum does not overflow
		{[]float32{float32(math.Inf(1)), float32(math.Inf(-1))}, true},
	} {
		_, bad := firstNonFinite(tensor.New(tensor.WithShape(len(tc.data)), tensor.WithBacking(tc.data)))
		if bad != tc.bad {
			t.Errorf("%v: non-finite %v, want %v", tc.data, bad, tc.bad)
		}
	}
	if v, bad := firstNonFinite(tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{math.MaxFloat64, math.MaxFloat64}))); bad {
		t.Errorf("finite float64 elements whose sum overflows: %v reported", v)
	}
}

// TestMetricsCarryNonFiniteValues: a metrics line is written whatever its
// values (a JSON number cannot be NaN), reads back the same, and a finite
// one is written as it always was.
func TestMetricsCarryNonFiniteValues(t *testing.T) {
	type plainMetric Metric // without the methods: encoding/json's own form
	type plainEval EvalResult
	finiteOne := Metric{Step: 3, Loss: 0.4380123, SamplesPerSec: 18822.5, ElapsedSec: 3.1, Eval: &EvalResult{Examples: 10, Correct: 8, Accuracy: 0.8, Loss: 0.43, Perplexity: 1.5}}
	got, err := json.Marshal(finiteOne)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(struct {
		plainMetric
		Eval *plainEval `json:"eval,omitempty"`
	}{plainMetric(finiteOne), (*plainEval)(finiteOne.Eval)})
	if string(got) != string(want) {
		t.Errorf("finite metric written as\n%s\nnot\n%s", got, want)
	}
	odd := Metric{Step: 4, Loss: math.NaN(), SamplesPerSec: math.Inf(1), ElapsedSec: 1, Eval: &EvalResult{Loss: math.Inf(-1), Perplexity: math.Inf(1)}}
	b, err := json.Marshal(odd)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var back Metric
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if !math.IsNaN(back.Loss) || !math.IsInf(back.SamplesPerSec, 1) || back.Step != 4 || !math.IsInf(back.Eval.Loss, -1) || !math.IsInf(back.Eval.Perplexity, 1) {
		t.Errorf("%s read back as %+v %+v", b, back, back.Eval)
	}
}
