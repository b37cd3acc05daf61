package predict

import (
	"reflect"
	"testing"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// TestMemoryPredictorIsTheEnginesPrediction: each stage's peak is the
// engine's prediction for the schedule; a schedule whose stages or chunks are
// not the config's gets none.
func TestMemoryPredictorIsTheEnginesPrediction(t *testing.T) {
	cfg, model := load(t, mlp2)
	predict := MemoryPredictor(cfg, model)
	for _, name := range []string{"1f1b", "gpipe", "zb-h1"} {
		s, err := schedule.Build(name, 2, cfg.Data.MicroBatches, 1)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := engine.PredictMemory(stages.EnginePipeline(cfg), model, s)
		if err != nil {
			t.Fatal(err)
		}
		if got := predict(s); !reflect.DeepEqual(got, want) || len(got) != 2 || got[0] <= 0 {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	other, err := schedule.Build("1f1b", 3, cfg.Data.MicroBatches, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := predict(other); got != nil {
		t.Errorf("a 3-stage schedule on a 2-stage config: %v", got)
	}
	interleaved, err := schedule.Build("interleaved", 2, cfg.Data.MicroBatches, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := predict(interleaved); got != nil {
		t.Errorf("two chunks a stage on a config of one: %v", got)
	}
}
