package predict

import (
	"testing"
)

// TestPlanLayersTimesEveryLayer: one planner layer per model layer, named as
// the model names it, each timed and with its gradient's bytes (float32).
func TestPlanLayersTimesEveryLayer(t *testing.T) {
	cfg, model := load(t, mlp2)
	layers, err := PlanLayers(cfg, model, cfg.MicroBatchSize(), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	params := []int64{8*6 + 6, 6*5 + 5, 5*3 + 3}
	if len(layers) != len(params) {
		t.Fatalf("%d layers, want %d", len(layers), len(params))
	}
	for i, l := range layers {
		if l.Name != model.Layers[i].Name() || l.F <= 0 || l.B <= 0 || l.GradBytes != 4*params[i] || l.ParamBytes < l.GradBytes || l.OutBytes <= 0 {
			t.Errorf("layer %d: %+v; want %s, timed, with %d gradient bytes", i, l, model.Layers[i].Name(), 4*params[i])
		}
	}
}
