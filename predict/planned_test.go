package predict

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/plan"
)

// TestPlannedAddresses: the config's addresses are kept; a new stage takes
// the port after the last stage's, a new replica its stage's port plus 100
// per replica, and a port already taken moves on.
func TestPlannedAddresses(t *testing.T) {
	cfg := &configs.Config{Stages: []configs.Stage{{Address: "127.0.0.1:7001"}, {Address: "127.0.0.1:7101"}}}
	// Stage 0's replica 1 would have stage 1's port, and takes the next;
	// stage 2's (the port after the last stage's) is then taken too.
	want := [][]string{{"127.0.0.1:7001", "127.0.0.1:7102"}, {"127.0.0.1:7101", "127.0.0.1:7201"}, {"127.0.0.1:7103", "127.0.0.1:7203"}}
	if got := plannedAddresses(cfg, 3, 2); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	grid := &configs.Config{DataParallel: 2, Stages: []configs.Stage{
		{Address: "127.0.0.1:7501", Addresses: []string{"127.0.0.1:7501", "127.0.0.1:7511"}},
		{Address: "127.0.0.1:7502", Addresses: []string{"127.0.0.1:7502", "127.0.0.1:7512"}},
	}}
	want = [][]string{{"127.0.0.1:7501", "127.0.0.1:7511", "127.0.0.1:7701"}, {"127.0.0.1:7502", "127.0.0.1:7512", "127.0.0.1:7702"}}
	if got := plannedAddresses(grid, 2, 3); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	want = [][]string{{"127.0.0.1:7501"}}
	if got := plannedAddresses(grid, 1, 1); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestPlannedConfigKeepsTheSchemaLine: a planned config names the schema the
// source named, as its first line, with a relative path that still points at
// the schema from where the planned file is written.
func TestPlannedConfigKeepsTheSchemaLine(t *testing.T) {
	for _, tc := range []struct{ src, out, want string }{
		{"configs/a.yaml", "configs/a-planned.yaml", "# yaml-language-server: $schema=./pipetrain.schema.json\n"},
		{"configs/a.yaml", "runs/x/planned.yaml", "# yaml-language-server: $schema=../../configs/pipetrain.schema.json\n"},
		{"configs/a.yaml", "planned.yaml", "# yaml-language-server: $schema=./configs/pipetrain.schema.json\n"},
		{"/srv/run/configs/a.yaml", "/srv/out/b.yaml", "# yaml-language-server: $schema=../run/configs/pipetrain.schema.json\n"},
		{"configs/a.yaml", "/srv/out/b.yaml", "# yaml-language-server: $schema=" + relFromSrvOut(t) + "\n"},
	} {
		raw := []byte("# yaml-language-server: $schema=./pipetrain.schema.json\nname: a\n")
		if got := schemaModeline(tc.src, raw, tc.out); got != tc.want {
			t.Errorf("%s -> %s: %q, want %q", tc.src, tc.out, got, tc.want)
		}
	}
	if got := schemaModeline("a.yaml", []byte("name: a\n# yaml-language-server: $schema=x.json\n"), "b.yaml"); got != "" {
		t.Errorf("a modeline not on the first line was kept: %q", got)
	}
	if got := schemaModeline("configs/a.yaml", []byte("# yaml-language-server: $schema=https://example.org/s.json\n"), "x/b.yaml"); got != "# yaml-language-server: $schema=https://example.org/s.json\n" {
		t.Errorf("a URL was rewritten: %q", got)
	}
}

// relFromSrvOut is the path from /srv/out to configs/pipetrain.schema.json
// under the test's working directory.
func relFromSrvOut(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel("/srv/out", filepath.Join(wd, "configs", "pipetrain.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// TestWritePlannedConfigRewritesTheStages: the written config holds the
// plan's split, schedule, micro-batches, replicas and recomputation, keeps
// the rest of the source, leaves out the per-process settings replicas cannot
// share (and says which), and validates.
func TestWritePlannedConfigRewritesTheStages(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tiny.yaml")
	if err := os.WriteFile(src, []byte(`name: tiny
model: {name: mlp, input: 8, hidden: [6, 5], classes: 3}
data: {batch_size: 16, micro_batches: 2}
train: {steps: 5, optimizer: {name: sgd, lr: 0.1}}
schedule: 1f1b
stages:
  - {layers: "0", address: 127.0.0.1:7001, cpus: "0"}
  - {layers: "1-2", address: 127.0.0.1:7002}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{Boundaries: []int{0, 2}, Schedule: "gpipe", Recompute: true, MicroBatches: 4, Replicas: 2}
	out := filepath.Join(dir, "planned.yaml")
	dropped, err := WritePlannedConfig(cfg, p, 3, out, "layers 0-1 | 2, gpipe")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dropped, []string{"cpus"}) {
		t.Errorf("dropped %v, want [cpus]", dropped)
	}
	got, err := configs.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "tiny-planned" || got.Schedule != "gpipe" || got.Data.MicroBatches != 4 || got.Replicas() != 2 || got.Data.BatchSize != 16 {
		t.Errorf("planned config: name %q, schedule %q, %d micro-batches, %d replicas, batch %d", got.Name, got.Schedule, got.Data.MicroBatches, got.Replicas(), got.Data.BatchSize)
	}
	wantLayers := [][]string{{"0-1"}, {"2"}}
	wantAddrs := [][]string{{"127.0.0.1:7001", "127.0.0.1:7101"}, {"127.0.0.1:7002", "127.0.0.1:7102"}}
	for i, st := range got.Stages {
		if !reflect.DeepEqual(st.Layers, wantLayers[i]) || !reflect.DeepEqual(st.Addresses, wantAddrs[i]) || st.Recompute != "full" || st.CPUs != "" {
			t.Errorf("stage %d: layers %v, addresses %v, recompute %q, cpus %q", i, st.Layers, st.Addresses, st.Recompute, st.CPUs)
		}
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "from "+src+" on ") || !strings.Contains(string(raw), ": layers 0-1 | 2, gpipe\n") {
		t.Errorf("header does not name the source and the summary:\n%s", raw)
	}
}
