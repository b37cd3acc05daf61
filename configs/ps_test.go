package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// psYAML writes a 2-stage, 3-replica config with the given
// parameter_servers section (and extra top-level lines).
func psYAML(t *testing.T, section, extra string) string {
	t.Helper()
	body := `model: {name: mlp, input: 8, hidden: [6, 5, 4], classes: 3}
data: {batch_size: 12, micro_batches: 2}
data_parallel: 3
stages:
  - {layers: "0-1", addresses: ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]}
  - {layers: "2-3", addresses: ["127.0.0.1:7010", "127.0.0.1:7011", "127.0.0.1:7012"]}
parameter_servers: ` + section + "\n" + extra
	if !strings.Contains(extra, "checkpoint:") {
		body += "\ncheckpoint: {every: 0}"
	}
	path := filepath.Join(t.TempDir(), "ps.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestParameterServersValidate(t *testing.T) {
	ok := []string{
		`{count: 2, addresses: ["127.0.0.1:7100", "127.0.0.1:7101"]}`,
		`{count: 1, mode: sync, aggregate: 2, addresses: ["127.0.0.1:7100"]}`,
		`{count: 1, mode: async, max_staleness: 3, addresses: ["127.0.0.1:7100"]}`,
		`{count: 2, addresses: ["127.0.0.1:7100", "127.0.0.1:7101"], metrics_addresses: ["127.0.0.1:9150", "127.0.0.1:9151"]}`,
	}
	for _, s := range ok {
		c, err := Load(psYAML(t, s, ""))
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		if !c.PSEnabled() {
			t.Errorf("%s: servers not enabled", s)
		}
	}
	wantProblems(t, psYAML(t, `{count: 2, mode: lazy, aggregate: 4, addresses: ["127.0.0.1:7100"]}`, ""),
		`parameter_servers.mode: unknown mode "lazy" (known: sync, async)`,
		"parameter_servers.aggregate: must be 0 (every worker) or 1-3 (data_parallel is 3), got 4",
		"parameter_servers.addresses: lists 1 addresses; count is 2, so give one per server")
	wantProblems(t, psYAML(t, `{count: 1, mode: async, aggregate: 2, addresses: ["127.0.0.1:7100"]}`, ""),
		"parameter_servers.aggregate: is for sync mode (backup workers); async applies every push")
	wantProblems(t, psYAML(t, `{count: 1, max_staleness: 2, addresses: ["127.0.0.1:7100"]}`, ""),
		"parameter_servers.max_staleness: is for async mode; mode is sync")
	wantProblems(t, psYAML(t, `{count: 2}`, ""),
		"parameter_servers.addresses: missing: list one host:port per server, server 0 first (the rendezvous does not place servers yet)")
	wantProblems(t, psYAML(t, `{count: 0, aggregate: 2}`, ""),
		"parameter_servers.count: missing: aggregate, max_staleness, addresses and metrics_addresses need count, the number of servers")
	wantProblems(t, psYAML(t, `{count: 2, addresses: ["127.0.0.1:7100", "127.0.0.1:7101"], metrics_addresses: ["127.0.0.1:7101"]}`, ""),
		"parameter_servers.metrics_addresses: lists 1 addresses; count is 2, so give one per server (or none)",
		"parameter_servers.metrics_addresses[0]: 127.0.0.1:7101 is also used by parameter_servers.addresses[1]")
	wantProblems(t, psYAML(t, `{count: 2, addresses: ["127.0.0.1:7100", "127.0.0.1:7101"], metrics_addresses: ["127.0.0.1:7011", "0.0.0.0:9151"]}`, ""),
		"parameter_servers.metrics_addresses[0]: 127.0.0.1:7011 is also used by stages[1].addresses[1]",
		"parameter_servers.metrics_addresses[1]: 0.0.0.0:9151 listens beyond loopback; set transport.token (or token_file) or transport.tls, which the metrics server then requires, so strangers cannot read it")
	wantProblems(t, psYAML(t, `{count: 1, addresses: ["127.0.0.1:7100"]}`, "train: {clip_grad_norm: 1.0}"),
		"train.clip_grad_norm: is not supported with parameter_servers yet: the norm is of the servers' summed gradient, which no worker holds")
	wantProblems(t, psYAML(t, `{count: 1, addresses: ["127.0.0.1:7100"]}`, "all_reduce: {shard_optimizer: true}"),
		"all_reduce.shard_optimizer: has no effect with parameter_servers, whose servers hold the optimizer state; remove one or the other")
	wantProblems(t, psYAML(t, `{count: 1, addresses: ["127.0.0.1:7100"]}`, "all_reduce: {algorithm: reduce-to-one}"),
		"all_reduce.algorithm: reduce-to-one has no effect with parameter_servers, whose workers join no replica ring; remove one or the other")
}

// TestParameterServersChangeTheDigest: servers sum in worker order (and
// backup workers drop pushes), so a checkpoint of a run without them is
// not resumed with them.
func TestParameterServersChangeTheDigest(t *testing.T) {
	a, err := Load(psYAML(t, `{count: 1, addresses: ["127.0.0.1:7100"]}`, ""))
	if err != nil {
		t.Fatal(err)
	}
	b := *a
	b.ParameterServers = ParameterServers{}
	c := *a
	c.ParameterServers.Addresses = []string{"127.0.0.1:7200"}
	if a.TrainingDigest() == b.TrainingDigest() {
		t.Error("servers left the training digest unchanged")
	}
	if a.TrainingDigest() != c.TrainingDigest() {
		t.Error("the servers' addresses changed the training digest")
	}
}

// TestParameterServersCheckpoint: the servers checkpoint where an update is
// a step (sync, backup workers, async with max_staleness 0) on fixed
// addresses; async with max_staleness 1 or more, and stages that meet at a
// rendezvous, whose ledger does not count servers yet, are refused.
func TestParameterServersCheckpoint(t *testing.T) {
	const every = "checkpoint: {every: 5}"
	for _, s := range []string{
		`{count: 2, addresses: ["127.0.0.1:7100", "127.0.0.1:7101"]}`,
		`{count: 1, aggregate: 2, addresses: ["127.0.0.1:7100"]}`,
		`{count: 1, mode: async, addresses: ["127.0.0.1:7100"]}`,
	} {
		c, err := Load(psYAML(t, s, every))
		if err != nil {
			t.Errorf("%s: %v", s, err)
		} else if c.Checkpoint.Every != 5 {
			t.Errorf("%s: checkpoint.every %d", s, c.Checkpoint.Every)
		}
	}
	wantProblems(t, psYAML(t, `{count: 1, mode: async, max_staleness: 1, addresses: ["127.0.0.1:7100"]}`, every),
		"checkpoint.every: must be 0 with async parameter servers and max_staleness 1: each push is an update of its own, so the servers' state is at no step a checkpoint could name (sync, or async with max_staleness 0, checkpoints)")
	wantProblems(t, psYAML(t, `{count: 1, addresses: ["127.0.0.1:7100"]}`, every+"\nrendezvous: 127.0.0.1:7300"),
		"checkpoint.every: must be 0 with parameter_servers when the stages meet at a rendezvous (address: auto or rendezvous set): the servers are not ranks of the job yet, so rank 0's ledger cannot wait for their parts; give every stage a fixed address")
}
