package configs

import (
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestDualPipeVConfig: dualpipev places the layers in zb-v's V, and refuses
// other than 2 chunks per stage and fewer than 2p micro-batches, naming the
// field.
func TestDualPipeVConfig(t *testing.T) {
	base := strings.NewReplacer("schedule: zb-v", "schedule: dualpipev", "micro_batches: 6", "micro_batches: 8").Replace(zbvBase)
	c, err := Load(writeConfig(t, base))
	if err != nil {
		t.Fatal(err)
	}
	if c.Placement() != schedule.V || c.LossStage() != 0 || c.ModelStages() != 8 {
		t.Errorf("placement %v, loss on stage %d, %d model stages", c.Placement(), c.LossStage(), c.ModelStages())
	}
	if s, err := c.BuildSchedule(); err != nil || s.Name != "dualpipev" || s.Placement != schedule.V {
		t.Errorf("BuildSchedule: %v", err)
	}
	cases := []edit{
		{"virtual_stages: 2", "virtual_stages: 1", "virtual_stages: the dualpipev schedule needs exactly 2 chunks per stage (each stage's layers listed as [chunk 0, chunk 1]), got 1"},
		{"micro_batches: 8", "micro_batches: 7", "schedule: dualpipev needs micro_batches >= 8 for 4 stages"},
	}
	refusesEdits(t, base, cases)
}
