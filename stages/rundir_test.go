package stages

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
)

// TestOutputLimitsHoldWhatStagesWrite: every file a stage writes fits the
// bound rank 0 holds a gathering rank to, and the weights' bound is their
// size plus the header's slack, not a guess far above it.
func TestOutputLimitsHoldWhatStagesWrite(t *testing.T) {
	for name, c := range map[string]*configs.Config{
		"1f1b float32": testConfig("1f1b", plain("0-1", "2-3"), 4, "float32", "adam"),
		"zb-v float64": testConfig("zb-v", zbvLayers(2), 4, "float64", "sgd"),
	} {
		// Wide enough that the parameters outweigh the header's slack.
		c.Model.Hidden = []int{200, 150, 100}
		t.Run(name, func(t *testing.T) {
			dir := runInProcess(t, c, false)
			for s := range c.Stages {
				limits, err := OutputLimits(c, s, 0)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := slices.Sorted(maps.Keys(limits)), slices.Sorted(slices.Values(Outputs(c, s, 0))); !slices.Equal(got, want) {
					t.Fatalf("stage %d: bounds for %v, outputs %v", s, got, want)
				}
				for rel, limit := range limits {
					st, err := os.Stat(filepath.Join(dir, rel))
					if err != nil {
						t.Fatalf("stage %d: %v", s, err)
					}
					if st.Size() > limit {
						t.Errorf("stage %d's %s: %d bytes, over its bound of %d", s, rel, st.Size(), limit)
					}
					if strings.HasSuffix(rel, ".safetensors") && limit-st.Size() > 64<<10+8<<10 {
						t.Errorf("stage %d's %s: %d bytes, bound %d: the bound is not the parameters plus the header", s, rel, st.Size(), limit)
					}
				}
			}
		})
	}
}
