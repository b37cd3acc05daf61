package stages

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/transport"
)

// TestResumeEqualsUninterrupted stops a run after 4 of 6 steps, corrupts its
// newest checkpoint, resumes, and checks that the run falls back to the previous
// checkpoint and still ends with the weights and losses of a run never stopped.
func TestResumeEqualsUninterrupted(t *testing.T) {
	cases := []struct {
		sched  string
		layers [][]string
		opt    string
	}{
		{"1f1b", plain("0", "1-2", "3"), "adam"},
		{"zb-h1", plain("0-1", "2-3"), "sgd"},
		{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, "adam"},
	}
	for _, tc := range cases {
		t.Run(tc.sched, func(t *testing.T) {
			cfg := testConfig(tc.sched, tc.layers, 2, "float32", tc.opt)
			cfg.Train.Steps = 6
			cfg.Checkpoint.Every, cfg.Checkpoint.Keep = 2, 2
			full := runInProcess(t, cfg, false)

			dir := t.TempDir()
			cfg.Train.Steps = 4
			runStagesIn(t, cfg, false, dir, false)
			root := CheckpointDir(dir)
			for _, step := range []int{2, 4} {
				if _, err := checkpoint.ReadManifest(checkpoint.StepDir(root, step)); err != nil {
					t.Fatalf("checkpoint of step %d not committed: %v", step, err)
				}
			}
			part := filepath.Join(checkpoint.StepDir(root, 4), checkpoint.PartFile(1))
			b, err := os.ReadFile(part)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-3] ^= 0x40
			if err := os.WriteFile(part, b, 0o644); err != nil {
				t.Fatal(err)
			}

			cfg.Train.Steps = 6
			_, rts := runStagesIn(t, cfg, false, dir, true)
			if got := rts[0].optims[0].Steps(); got != 6 {
				t.Errorf("stage 0's optimizer has taken %d steps, want 6", got)
			}
			sameWeights(t, full, dir)
			sameLosses(t, full, dir)
			// Keep 2: the resumed run committed steps 4 and 6 again; 2 is pruned.
			if _, err := os.Stat(checkpoint.StepDir(root, 2)); !os.IsNotExist(err) {
				t.Errorf("checkpoint of step 2 still there after keeping the last 2: %v", err)
			}
			m, _, err := checkpoint.Latest(root, cfg.TrainingDigest())
			if err != nil || m == nil || m.Step != 6 {
				t.Fatalf("latest checkpoint after the resumed run: %+v, %v; want step 6", m, err)
			}
		})
	}
}

func sameWeights(t *testing.T, a, b string) {
	t.Helper()
	wa, wb := readWeights(t, a), readWeights(t, b)
	if len(wa) == 0 {
		t.Fatalf("%s has no weights", a)
	}
	if err := checkpoint.Diff(wa, wb); err != nil {
		t.Fatalf("weights of %s and %s differ: %v", a, b, err)
	}
}

func sameLosses(t *testing.T, a, b string) {
	t.Helper()
	ma, err1 := ReadMetrics(filepath.Join(a, "metrics.jsonl"))
	mb, err2 := ReadMetrics(filepath.Join(b, "metrics.jsonl"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if len(ma) != len(mb) {
		t.Fatalf("%d metric lines uninterrupted, %d resumed", len(ma), len(mb))
	}
	for i := range ma {
		if ma[i].Step != mb[i].Step || ma[i].Loss != mb[i].Loss {
			t.Errorf("line %d: step %d loss %v uninterrupted, step %d loss %v resumed", i, ma[i].Step, ma[i].Loss, mb[i].Step, mb[i].Loss)
		}
	}
}

// TestMismatchedMessagesRefused feeds stage 1 of 2 tensors that cannot be the one
// it waits for: each must stop the stage with an error naming the peer and the
// problem, before any weight is saved or changed.
func TestMismatchedMessagesRefused(t *testing.T) {
	cases := []struct {
		name      string
		step, mb  int64
		wantError string
	}{
		{"a past step", -5, 0, "out of step"},
		{"two steps ahead", 2, 0, "sent activation for step 3 while this stage is at step 1"},
		{"a micro-batch out of range", 0, 7, "micro-batch 7 of step 1; steps have micro-batches 0-1"},
		{"a negative micro-batch", 0, -1, "micro-batch -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
			c.Checkpoint.Every = 1
			dir := t.TempDir()
			attacker, rt := secondStage(t, c, dir)
			defer attacker.Close()
			before := snapshot(rt)
			shape := attacker.Peer().Shapes[0]
			vals := make([]float32, shape[0]*shape[1])
			msg, err := transport.FromFloat32s(transport.Activation, tc.step, int32(tc.mb), shape, vals)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := attacker.Send(ctx, msg); err != nil {
				t.Fatal(err)
			}
			err = rt.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.wantError) || !strings.Contains(err.Error(), "stage 0 (127.0.0.1:7000)") {
				t.Fatalf("error %v; want it to name stage 0 and say %q", err, tc.wantError)
			}
			if !sameParams(before, snapshot(rt)) {
				t.Error("parameters changed")
			}
			for _, d := range []string{"weights", "checkpoints"} {
				if entries, _ := os.ReadDir(filepath.Join(dir, d)); len(entries) != 0 {
					t.Errorf("%s written after the refusal: %v", d, entries)
				}
			}
		})
	}
}

func snapshot(r *Runtime) [][]float32 {
	var out [][]float32
	for _, e := range r.chunks {
		for _, w := range e.Weights() {
			out = append(out, append([]float32(nil), w.Value.Data().([]float32)...))
		}
	}
	return out
}

func sameParams(a, b [][]float32) bool {
	for i := range a {
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return len(a) == len(b) && len(a) > 0
}

// TestCheckpointerRoundTrip: the part the checkpointer writes after a step
// loads back into the stage: its parameters, its optimizers' buffers and
// their step counts.
func TestCheckpointerRoundTrip(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	silent, rt := secondStage(t, c, t.TempDir())
	defer silent.Close()
	k := rt.ckpt
	o := k.optims[0]
	o.SetSteps(7)
	slot := func() []float32 {
		v, err := o.Slot(o.SlotNames()[0], 0)
		if err != nil {
			t.Fatal(err)
		}
		return v.Data().([]float32)
	}
	for i := range slot() {
		slot()[i] = 0.25
	}
	want := snapshot(rt)
	if err := k.save(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	k.wait()
	for _, e := range rt.chunks {
		for _, w := range e.Weights() {
			clear(w.Value.Data().([]float32))
		}
	}
	o.SetSteps(0)
	clear(slot())
	if err := k.load(filepath.Join(checkpoint.StepDir(k.root, 3), checkpoint.PartFile(1))); err != nil {
		t.Fatal(err)
	}
	if !sameParams(snapshot(rt), want) {
		t.Error("parameters differ from those saved")
	}
	if got := o.Steps(); got != 7 {
		t.Errorf("optimizer steps %d after loading, want the saved 7", got)
	}
	if got := slot(); len(got) == 0 || got[0] != 0.25 {
		t.Errorf("optimizer %s buffer %v after loading, want the saved 0.25s", o.SlotNames()[0], got)
	}
}
