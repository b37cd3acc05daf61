package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

const zbvBase = `
model: {name: mlp, input: 8, hidden: [6, 5, 4, 6, 5, 4, 3], classes: 3}
data: {batch_size: 24, micro_batches: 6}
schedule: zb-v
virtual_stages: 2
stages:
  - {layers: ["0", "7"], address: 127.0.0.1:7001}
  - {layers: ["1", "6"], address: 127.0.0.1:7002}
  - {layers: ["2", "5"], address: 127.0.0.1:7003}
  - {layers: ["3", "4"], address: 127.0.0.1:7004}
`

// TestZBVConfig: under zb-v a stage's layers are [chunk 0, chunk 1] in V
// order, stage s holding model stages s and 2p-1-s, and stage 0 computes the
// loss; a V that is not one, or not of two chunks, is refused naming the
// field, as are too few micro-batches and a model that cannot split its
// backward.
func TestZBVConfig(t *testing.T) {
	c, err := Load(writeConfig(t, zbvBase))
	if err != nil {
		t.Fatal(err)
	}
	if c.Placement() != schedule.V || c.LossStage() != 0 || c.ModelStages() != 8 {
		t.Errorf("placement %v, loss on stage %d, %d model stages", c.Placement(), c.LossStage(), c.ModelStages())
	}
	for k, want := range [][2]int{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {3, 1}, {2, 1}, {1, 1}, {0, 1}} {
		if s, ch := c.Place(k); s != want[0] || ch != want[1] {
			t.Errorf("model stage %d on stage %d chunk %d, want %v", k, s, ch, want)
		}
	}
	if f, l := c.ChunkLayers(3, 1); f != 4 || l != 5 {
		t.Errorf("stage 3 chunk 1 = [%d, %d)", f, l)
	}
	if s, err := c.BuildSchedule(); err != nil || s.Placement != schedule.V {
		t.Errorf("BuildSchedule: %v", err)
	}
	if l, err := c.BuildLowered(); err != nil || l.Placement != schedule.V {
		t.Errorf("BuildLowered: %v", err)
	}
	cases := []edit{
		// Interleaved's order is not a V: model stage 4 is stage 3's chunk 1.
		{`["0", "7"]`, `["0", "4"]`, `stages[0].layers[1]: layer 4 is already placed on stages[3] chunk 1`},
		{`["3", "4"]`, `["3", "7"]`, `stages[2].layers[1]: "5" starts before the previous model stage ends; stages must be in layer order, in V order: stage s's chunk 0 is model stage s and its chunk 1 model stage 2p-1-s`},
		{`["2", "5"]`, `["2", "4"]`, "stages[1].layers[1]: layer 5 on no stage (stages must cover the model in V order: stage s's chunk 0 is model stage s and its chunk 1 model stage 2p-1-s)"},
		{`["3", "4"]`, `["3", "5"]`, `stages[2].layers[1]: layer 5 is already placed on stages[3] chunk 1`},
		{`["2", "5"]`, `["2", "6"]`, "stages[2].layers[1]: layer 5 on no stage (stages must cover the model in V order"},
		{"virtual_stages: 2", "virtual_stages: 1", "virtual_stages: the zb-v schedule needs exactly 2 chunks per stage (each stage's layers listed as [chunk 0, chunk 1]), got 1"},
		{"virtual_stages: 2", "virtual_stages: 3", "virtual_stages: the zb-v schedule needs exactly 2 chunks per stage"},
		{`["1", "6"]`, `["1"]`, "stages[1].layers: lists 1 layer ranges; virtual_stages is 2"},
		{"micro_batches: 6", "micro_batches: 4", "schedule: zb-v needs micro_batches >= 6 for 4 stages"},
		{"schedule: zb-v", "schedule: 1f1b", "virtual_stages: 2 chunks per stage need schedule: interleaved, interleaved-zb, zb-v or dualpipev (schedule is 1f1b)"},
	}
	refusesEdits(t, zbvBase, cases)
	gpt := `
model: {name: gpt, vocab: 256, context: 4, width: 8, heads: 2, layers: 2, tie_embeddings: true}
data: {dataset: text, corpus: corpus.txt, batch_size: 8, micro_batches: 4}
schedule: zb-v
virtual_stages: 2
stages:
  - {layers: ["0", "3"], address: 127.0.0.1:7001}
  - {layers: ["1", "2"], address: 127.0.0.1:7002}
`
	// The GPT's layers split their backward, and its tied embedding and head
	// meet on stage 0.
	if _, err := Load(writeConfig(t, gpt)); err != nil {
		t.Errorf("a GPT under zb-v: %v", err)
	}
}

// TestCustomVSchedule: a schedule file that names the V placement places
// the config's chunks in a V, and must hold two chunks per stage.
func TestCustomVSchedule(t *testing.T) {
	dir := t.TempDir()
	s, err := schedule.Build("zb-v", 4, 6, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "v.txt"), []byte(s.Grid()), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "run.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(zbvBase, "schedule: zb-v", "schedule: custom\nschedule_file: v.txt", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Placement() != schedule.V || c.LossStage() != 0 || !strings.HasPrefix(c.ScheduleText, "placement: v\n") {
		t.Errorf("custom V: placement %v, loss stage %d", c.Placement(), c.LossStage())
	}
	// The same lists without the placement line are a Loop schedule, which
	// the V-ordered layers do not fit.
	if err := os.WriteFile(filepath.Join(dir, "v.txt"), []byte(strings.TrimPrefix(s.Grid(), "placement: v\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	wantProblems(t, path, `stages[1].layers[1]: "6" starts before the previous model stage ends; stages must be in layer order`)
}
