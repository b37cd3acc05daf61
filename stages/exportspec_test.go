package stages

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/pipetrain/pipetrain/models"
)

// widthsOnly is a family that reads model.hidden alone.
type widthsOnly struct{}

func (widthsOnly) Name() string { return "widths-only" }
func (widthsOnly) Build(models.Spec) (*models.Model, error) {
	return nil, errors.New("widths-only builds nothing")
}
func (widthsOnly) Doc() models.FamilyDoc {
	return models.FamilyDoc{Summary: "a test family", Keys: []models.KeyDoc{
		{Key: "hidden", Doc: "Widths."}, {Key: "depth", Type: "integer", Doc: "A key of its own."}}}
}

// Registered before any test runs: the registry is for init functions.
func init() { models.Register(widthsOnly{}) }

// TestExportSpecAsksTheFamily: model_spec keeps the keys the model's
// family documents, whichever package registered it, its own keys
// (Spec.Own) among them.
func TestExportSpecAsksTheFamily(t *testing.T) {
	b, err := exportSpec(models.Spec{Name: "widths-only", DType: "float32", Input: 784, Classes: 10, Hidden: []int{3}, Activation: "relu",
		Own: map[string]any{"depth": 2}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"depth", "dtype", "hidden", "name"}; !slices.Equal(keys, want) {
		t.Errorf("model_spec %s, want the keys %v", b, want)
	}
}
