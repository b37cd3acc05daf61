package engine

import (
	"math/rand/v2"

	"testing"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
)

// TestHeldBytesFollowsThePool: an engine's activation memory is its pool of
// machines (which keeps the most ever in flight) and its split stashes, as
// schedule.PeakMemory assumes; measured on the engine itself, action by
// action, for a fused and a split schedule, on an MLP layer and on GPT
// blocks (whose split stash holds every part's input and tap gradient).
func TestHeldBytesFollowsThePool(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model *models.Model
		sched string
	}{
		{"mlp", smallMLP(t, "float32"), "1f1b"}, {"mlp", smallMLP(t, "float32"), "zb-h1"},
		{"gpt", smallGPT(t, "float32", false), "1f1b"}, {"gpt", smallGPT(t, "float64", true), "zb-h1"},
	} {
		model, name := tc.model, tc.sched
		t.Run(tc.name+"/"+name, func(t *testing.T) {
			const p, m, batch = 3, 5, 4
			s, err := schedule.Build(name, p, m, 1)
			if err != nil {
				t.Fatal(err)
			}
			split := s.SplitsBackward()
			mem, err := MeasureMemory(model, 1, 2, batch, 7, Options{Split: split})
			if err != nil {
				t.Fatal(err)
			}
			if mem.Machine <= 0 || split != (mem.Stash > 0) || split != (mem.Weight > 0) {
				t.Fatalf("sizes %+v for split=%v", mem, split)
			}
			want := s.PeakMemory(func(int, int) schedule.ChunkMemory { return mem })
			// Stage 0's actions, run on an engine for the same layers.
			e, err := NewEngine(model, 1, 2, batch, 7, Options{Split: split})
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			// Every micro-batch's input and gradient arrive in their own
			// memory, as from a link.
			in := func() *tensor.Dense { return randomDense(r, model.DType, e.InShape()) }
			grad := func() *tensor.Dense { return randomDense(r, model.DType, e.OutShape()) }
			var peak int64
			for _, a := range s.Actions[0] {
				switch a.Kind {
				case schedule.Forward:
					_, err = e.Forward(a.MicroBatch, in(), nil)
				case schedule.Backward:
					_, err = e.Backward(a.MicroBatch, grad())
				case schedule.Input:
					_, err = e.Input(a.MicroBatch, grad())
				case schedule.Weight:
					err = e.Weight(a.MicroBatch)
				}
				if err != nil {
					t.Fatal(err)
				}
				peak = max(peak, e.HeldBytes())
			}
			if peak != want[0] {
				t.Errorf("measured peak %d bytes, predicted %d (sizes %+v, %d in flight at most)", peak, want[0], mem, e.PeakInFlight())
			}
			if e.HeldBytes() < mem.Machine*int64(e.PeakInFlight()) {
				t.Errorf("after the step the pool holds %d bytes, less than %d machines of %d", e.HeldBytes(), e.PeakInFlight(), mem.Machine)
			}
		})
	}
}
