package stages

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestMetricFilesResume: a resumed run's metrics.jsonl keeps the lines up to
// its checkpoint, drops the failed attempt's later ones and goes on after
// them; eval.json holds the final evaluation; a stage without the files
// (nil) takes every call.
func TestMetricFilesResume(t *testing.T) {
	dir := t.TempDir()
	val := &EvalResult{Loss: 0.5, Accuracy: 0.75, Correct: 3, Examples: 4}
	m := newMetricFiles(dir)
	if err := m.open(false); err != nil {
		t.Fatal(err)
	}
	for step := 1; step <= 3; step++ {
		var eval *EvalResult
		if step == 2 {
			eval = val
		}
		if err := m.step(Metric{Step: step, Loss: float64(step), SamplesPerSec: 10, ElapsedSec: float64(step), Eval: eval}); err != nil {
			t.Fatal(err)
		}
	}
	m.close()

	// The attempt failed after step 3; the checkpoint it resumes from is step 2's.
	m = newMetricFiles(dir)
	if err := m.rewind(2); err != nil {
		t.Fatal(err)
	}
	if err := m.open(true); err != nil {
		t.Fatal(err)
	}
	if err := m.step(Metric{Step: 3, Loss: 30, SamplesPerSec: 10, ElapsedSec: 3}); err != nil {
		t.Fatal(err)
	}
	if err := m.final(val); err != nil {
		t.Fatal(err)
	}
	m.close()

	got, err := ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Metric{
		{Step: 1, Loss: 1, SamplesPerSec: 10, ElapsedSec: 1},
		{Step: 2, Loss: 2, SamplesPerSec: 10, ElapsedSec: 2, Eval: val},
		{Step: 3, Loss: 30, SamplesPerSec: 10, ElapsedSec: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("metrics.jsonl %+v, want %+v", got, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, "eval.json"))
	if err != nil {
		t.Fatal(err)
	}
	var final EvalResult
	if err := json.Unmarshal(b, &final); err != nil || final != *val {
		t.Errorf("eval.json %s (%v), want %+v", b, err, *val)
	}

	var none *metricFiles
	if err := none.open(false); err != nil {
		t.Fatal(err)
	}
	if err := none.step(Metric{Step: 1, Loss: 1, SamplesPerSec: 1, ElapsedSec: 1}); err != nil {
		t.Fatal(err)
	}
	if err := none.final(val); err != nil {
		t.Fatal(err)
	}
	if err := none.rewind(2); err != nil {
		t.Fatal(err)
	}
	none.close()
}
