package data_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/data"
)

// countKind is a dataset kind from outside the package: example i of step s
// is the value s*100+i, and its target i%classes.
type countKind struct{}

func (countKind) Name() string { return "count" }

func (countKind) Validate(s *data.Section, m *data.Model, problem func(key, format string, args ...any)) {
	if s.Dir == "" {
		problem("data.dir", "missing")
	}
}

func (countKind) Check(*data.Section, *data.Model) error { return nil }

func (countKind) Open(s *data.Section, m *data.Model, o data.OpenOptions) (data.Source, error) {
	return countSource{batch: s.MicroBatch, classes: m.Classes}, nil
}

type countSource struct{ batch, classes int }

func (c countSource) Train(step, mb int, x data.Inputs, targets bool) []int {
	var y []int
	for i := range c.batch {
		k := mb*c.batch + i
		if x.F32 != nil {
			x.F32[i] = float32(step*100 + k)
		}
		y = append(y, k%c.classes)
	}
	if !targets {
		return nil
	}
	return y
}

func (countSource) EvalBatches() int                         { return 0 }
func (countSource) Eval(int, data.Inputs, bool) ([]int, int) { return nil, 0 }
func (countSource) EvalName() string                         { return "none" }
func (countSource) NextToken() bool                          { return false }

func init() { data.Register(countKind{}) }

// TestRegisteredKindFeeds: a kind registered from outside the package is
// listed beside the built-in ones, found by its name, and data.Open feeds a
// stage's batches through it.
func TestRegisteredKindFeeds(t *testing.T) {
	if got := data.Kinds(); !slices.Equal(got, []string{"arrays", "count", "fashion-mnist", "text", "tokens"}) {
		t.Errorf("Kinds() = %v", got)
	}
	k, ok := data.Lookup("count")
	if !ok {
		t.Fatal(`Lookup("count") found nothing`)
	}
	var problems []string
	k.Validate(&data.Section{}, nil, func(key, format string, args ...any) { problems = append(problems, key+": "+format) })
	if !slices.Equal(problems, []string{"data.dir: missing"}) {
		t.Errorf("problems %v", problems)
	}

	s := &data.Section{Config: "run.yaml", Dataset: "count", MicroBatch: 2}
	src, err := data.Open(s, &data.Model{Example: []int{1}, Classes: 3, Targets: 1}, data.OpenOptions{Inputs: true, Targets: true})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2)
	y := src.Train(4, 1, data.Inputs{F32: x}, true)
	if !slices.Equal(x, []float32{402, 403}) || !slices.Equal(y, []int{2, 0}) {
		t.Errorf("step 4 micro-batch 1: x %v, y %v", x, y)
	}

	s.Dataset = "counts"
	if _, err := data.Open(s, nil, data.OpenOptions{}); err == nil || !strings.Contains(err.Error(), `run.yaml: data.dataset: unknown dataset "counts"`) {
		t.Errorf("unknown kind: err = %v", err)
	}
}
