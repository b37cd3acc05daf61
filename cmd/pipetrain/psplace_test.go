package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
)

// psRanksConfig is a 2-stage, 3-replica config whose 2 parameter servers
// the rendezvous places, as ranks 6 and 7.
func psRanksConfig(t *testing.T) *configs.Config {
	t.Helper()
	body := `model: {name: mlp, input: 8, hidden: [6, 5, 4], classes: 3}
data: {batch_size: 12, micro_batches: 2}
data_parallel: 3
checkpoint: {every: 0}
stages:
  - {layers: "0-1", addresses: [auto, auto, auto]}
  - {layers: "2-3", addresses: [auto, auto, auto]}
parameter_servers: {count: 2}
`
	path := filepath.Join(t.TempDir(), "ps.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestEnginesPlaceServersAfterTheStages: under each engine's variables a
// world of 8 places ranks 0-5 on the stages' grid and ranks 6 and 7 on the
// servers; a world that leaves the servers out is refused, naming them.
func TestEnginesPlaceServersAfterTheStages(t *testing.T) {
	cfg := psRanksConfig(t)
	engines := []struct {
		rank, world string // world "" where the engine sets none
	}{{"RANK", "WORLD_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}, {"JOB_COMPLETION_INDEX", ""}}
	want := map[string]string{"0": "stage 0 replica 0", "5": "stage 1 replica 2", "6": "parameter server 0", "7": "parameter server 1"}
	for _, e := range engines {
		for rank, name := range want {
			t.Setenv(e.rank, rank)
			if e.world != "" {
				t.Setenv(e.world, "8")
			}
			r, err := rankFromEnv(cfg, false)
			if err != nil {
				t.Fatalf("%s=%s: %v", e.rank, rank, err)
			}
			if got := rankName(cfg, r); got != name {
				t.Errorf("%s=%s: rank %d runs %s, want %s", e.rank, rank, r, got, name)
			}
		}
		if e.world != "" {
			t.Setenv(e.world, "6")
			if _, err := rankFromEnv(cfg, false); err == nil || !strings.Contains(err.Error(), "per parameter server") {
				t.Errorf("%s=6 with 2 servers as ranks: %v, want a refusal that counts the servers", e.world, err)
			}
		}
		os.Unsetenv(e.rank)
		if e.world != "" {
			os.Unsetenv(e.world)
		}
	}
}

// TestValidateListsServersByRank: servers the rendezvous places have no
// address before the run, so validate names each by its rank.
func TestValidateListsServersByRank(t *testing.T) {
	var out strings.Builder
	printPS(&out, psRanksConfig(t))
	for _, want := range []string{"rank 6 (auto)", "rank 7 (auto)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
}
