package stages

import (
	"testing"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
)

// TestMeasuredMemoryIsPredicted: the activation memory each stage's events
// record peaks where run.json's prediction (the schedule's actions over the
// chunks' measured sizes) says, for fused, split and interleaved schedules:
// never above it, and exactly at it unless an idle machine of the pool had
// let go of its micro-batch's input (a received buffer goes back to the
// link once its micro-batch is done), which leaves it within the 10% the
// prediction is held to. So too with recomputation, full or selective.
func TestMeasuredMemoryIsPredicted(t *testing.T) {
	for _, tc := range []struct {
		sched     string
		layers    [][]string
		micro     int
		gpt       bool
		recompute string // every stage's
	}{
		{"1f1b", plain("0", "1", "2-3"), 5, false, ""},
		{"gpipe", plain("0-1", "2-3"), 3, false, ""},
		{"zb-h1", plain("0", "1-2", "3"), 4, false, ""},
		{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 4, false, ""},
		{"zb-h1", plain("0-1", "2-4"), 0, true, ""},
		{"zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 4, false, ""},
		{"dualpipev", [][]string{{"0", "3"}, {"1", "2"}}, 4, false, ""},
		{"1f1b", plain("0", "1", "2-3"), 5, false, "full"},
		{"gpipe", plain("0-1", "2-3"), 3, false, "full"},
		{"zb-h1", plain("0", "1-2", "3"), 4, false, "full"},
		{"1f1b", plain("0-1", "2-4"), 0, true, "full"},
		{"1f1b", plain("0-1", "2-4"), 0, true, "selective"},
		{"zb-h1", plain("0-1", "2-4"), 0, true, "selective"},
		{"interleaved-zb", [][]string{{"0", "2"}, {"1", "3"}}, 4, false, ""},
		{"interleaved-zb", [][]string{{"0", "2"}, {"1", "3"}}, 4, false, "full"},
	} {
		name := tc.sched
		if tc.gpt {
			name = "gpt-" + name
		}
		if tc.recompute != "" {
			name += "-" + tc.recompute
		}
		t.Run(name, func(t *testing.T) {
			c := testConfig(tc.sched, tc.layers, max(tc.micro, 1), "float32", "sgd")
			if tc.gpt {
				c = gptConfig(tc.sched, tc.layers, true)
			}
			for i := range c.Stages {
				c.Stages[i].Recompute = tc.recompute
			}
			c.Train.Evaluate = false
			dir := runInProcess(t, c, false)
			info, events, err := profile.ReadRun(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(info.PredictedStashBytes) != len(c.Stages) {
				t.Fatalf("run.json predicts %v, want one figure per stage", info.PredictedStashBytes)
			}
			for st, evs := range events {
				var peak, heap int64
				for _, e := range evs {
					peak, heap = max(peak, e.StashBytes), max(heap, e.HeapBytes)
				}
				want := info.PredictedStashBytes[st]
				if want <= 0 || peak > want || float64(peak) < 0.9*float64(want) {
					t.Errorf("stage %d held at most %d bytes of activations, predicted %d", st, peak, want)
				}
				// With one chunk a stage's pool is all in flight at its peak;
				// with two (interleaved, zb-v, interleaved-zb) one chunk's idle machines may
				// have let go of their inputs by then.
				if len(tc.layers[0]) == 1 && peak != want {
					t.Errorf("stage %d held at most %d bytes of activations, predicted exactly %d", st, peak, want)
				}
				if heap <= peak {
					t.Errorf("stage %d: live heap %d bytes, not above its activations' %d", st, heap, peak)
				}
			}
		})
	}
}

// TestRecomputationSavesMemory: on the GPT under 1F1B, keeping everything
// costs stage 0 the most activation memory, selective recomputation less
// (attention's probabilities are the largest thing a block keeps at this
// context length) and full recomputation least.
func TestRecomputationSavesMemory(t *testing.T) {
	var peaks []int64
	for _, mode := range []string{"none", "selective", "full"} {
		c := gptConfig("1f1b", plain("0-2", "3-4"), false)
		c.Model.Context, c.Data.MicroBatches = 16, 4
		c.Stages[0].Recompute = mode
		model, err := models.Build(c.Model)
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.BuildSchedule()
		if err != nil {
			t.Fatal(err)
		}
		peak, _, err := engine.PredictMemory(EnginePipeline(c), model, s)
		if err != nil {
			t.Fatal(err)
		}
		peaks = append(peaks, peak[0])
	}
	if !(peaks[0] > peaks[1] && peaks[1] > peaks[2]) {
		t.Errorf("stage 0's predicted peak: none %d, selective %d, full %d bytes; want each below the last", peaks[0], peaks[1], peaks[2])
	}
	t.Logf("stage 0's predicted peak: none %d, selective %d (%.2f×), full %d (%.2f×)", peaks[0], peaks[1], float64(peaks[1])/float64(peaks[0]), peaks[2], float64(peaks[2])/float64(peaks[0]))
}

// TestDataInputsAreReused: the first model stage gathers each micro-batch's
// data into a tensor that a finished micro-batch gave back, so that after a
// run it holds as many as it ever had in flight, and one more where the next
// forward's data is read (takeData) while as many are in flight, not one per
// micro-batch of every step; the equivalence tests show that none is
// overwritten while in use.
func TestDataInputsAreReused(t *testing.T) {
	for _, tc := range []struct {
		sched  string
		layers [][]string
		made   int // micro-batches in flight at once on the first model stage, and the one read ahead
	}{
		{"1f1b", plain("0", "1", "2-3"), 3 + 1},
		{"gpipe", plain("0-1", "2-3"), 4 + 1},
		// After chunk 0's fourth forward the stage reads chunk 1's targets,
		// which need no buffer; the next step's first input is read once
		// chunk 0 has given micro-batch 0's back.
		{"zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 4},
	} {
		t.Run(tc.sched, func(t *testing.T) {
			c := testConfig(tc.sched, tc.layers, 4, "float32", "sgd")
			c.Train.Evaluate = false
			_, rts := runStages(t, c, false)
			r := rts[0]
			if len(r.inputs) != 0 {
				t.Errorf("%d data inputs still held after the run", len(r.inputs))
			}
			if len(r.spareInputs) != tc.made {
				t.Errorf("%d data inputs made over %d steps of 4 micro-batches, want %d, the most in flight and the one read ahead", len(r.spareInputs), c.Train.Steps, tc.made)
			}
		})
	}
}
