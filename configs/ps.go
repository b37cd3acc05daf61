package configs

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// ParameterServers replaces the replicas' all-reduce with parameter
// servers (docs/parameter-servers.md): Count server processes hold the
// weights and the optimizer state, sharded by tensor, and each of the
// data_parallel replicas of the pipeline is a worker that pushes its
// step's gradients to them and pulls the updated weights back.
type ParameterServers struct {
	// Count is the number of server processes; 0: no servers (the
	// replicas all-reduce over their ring).
	Count int `mapstructure:"count" json:"count"`
	// Mode is how the servers combine the workers' pushes: sync (one
	// update per step from every worker's gradient, summed in worker
	// order) or async (each push applied as it arrives, within
	// MaxStaleness).
	Mode string `mapstructure:"mode" json:"mode"`
	// MaxStaleness bounds, in async mode, how many steps of the other
	// workers' the weights a worker computes with may miss (stale-
	// synchronous parallel; 0: sync's updates).
	MaxStaleness int `mapstructure:"max_staleness" json:"max_staleness"`
	// Aggregate is how many workers' pushes a sync step sums (backup
	// workers): the first Aggregate to arrive, summed in worker order; the
	// later ones are dropped. 0: every worker's.
	Aggregate int `mapstructure:"aggregate" json:"aggregate"`
	// Addresses lists where each server listens, server 0 first. Where,
	// not what: left out of the digest.
	Addresses []string `mapstructure:"addresses" json:"-"`
	// MetricsAddresses optionally lists where each server serves its
	// Prometheus metrics (host:port, server 0 first), as a stage's
	// metrics_address does. Where, not what: left out of the digest.
	MetricsAddresses []string `mapstructure:"metrics_addresses" json:"-"`
}

// psModes are the values of parameter_servers.mode; "" means sync.
var psModes = []string{"sync", "async"}

// PSEnabled reports whether the run has parameter servers.
func (c *Config) PSEnabled() bool { return c.ParameterServers.Count > 0 }

// validatePS checks parameter_servers: what the servers support so far,
// each problem named by the field that causes it.
func (c *Config) validatePS(p *Problems, tied bool) {
	ps := c.ParameterServers
	if ps.Count < 0 {
		p.add("parameter_servers.count", "must be 0 (no servers) or a number of server processes, got %d", ps.Count)
	}
	if ps.Mode != "" && !slices.Contains(psModes, ps.Mode) {
		p.add("parameter_servers.mode", "unknown mode %q (known: %s)", ps.Mode, strings.Join(psModes, ", "))
	}
	if n := ps.Aggregate; n < 0 || n > c.Replicas() {
		p.add("parameter_servers.aggregate", "must be 0 (every worker) or 1-%d (data_parallel is %d), got %d", c.Replicas(), c.Replicas(), n)
	}
	if ps.MaxStaleness < 0 {
		p.add("parameter_servers.max_staleness", "must be 0 or more steps, got %d", ps.MaxStaleness)
	}
	if ps.Mode == "async" && ps.Aggregate > 0 {
		p.add("parameter_servers.aggregate", "is for sync mode (backup workers); async applies every push")
	}
	if ps.Mode != "async" && ps.MaxStaleness > 0 {
		p.add("parameter_servers.max_staleness", "is for async mode; mode is %s", cmp.Or(ps.Mode, "sync"))
	}
	if ps.Count <= 0 {
		if ps.Aggregate > 0 || ps.MaxStaleness > 0 || len(ps.Addresses) > 0 || len(ps.MetricsAddresses) > 0 {
			p.add("parameter_servers.count", "missing: aggregate, max_staleness, addresses and metrics_addresses need count, the number of servers")
		}
		return
	}
	c.validatePSMetrics(p)
	switch n := len(ps.Addresses); {
	case n == 0:
		p.add("parameter_servers.addresses", "missing: list one host:port per server, server 0 first (the rendezvous does not place servers yet)")
	case n != ps.Count:
		p.add("parameter_servers.addresses", "lists %d addresses; count is %d, so give one per server", n, ps.Count)
	}
	if c.Train.ClipGradNorm > 0 {
		p.add("train.clip_grad_norm", "is not supported with parameter_servers yet: the norm is of the servers' summed gradient, which no worker holds")
	}
	if tied {
		p.add("parameter_servers", "the model ties weights across stages (%s), which parameter servers do not support yet", c.Model.Name)
	}
	c.validatePSCheckpoints(p)
	if c.Train.EarlyStop.Patience > 0 {
		p.add("train.early_stop", "is not supported with parameter_servers yet")
	}
	if a := c.ReduceAlgorithm(); a != "ring" {
		p.add("all_reduce.algorithm", "%s has no effect with parameter_servers, whose workers join no replica ring; remove one or the other", a)
	}
	if c.AllReduce.ShardOptimizer {
		// The servers hold the whole optimizer state; workers hold none to shard.
		p.add("all_reduce.shard_optimizer", "has no effect with parameter_servers, whose servers hold the optimizer state; remove one or the other")
	}
}

// validatePSMetrics checks parameter_servers.metrics_addresses: one
// host:port per server, none taken by a stage, a server or another
// server's metrics, and beyond loopback only with authentication, as a
// stage's metrics_address.
func (c *Config) validatePSMetrics(p *Problems) {
	ps := c.ParameterServers
	if n := len(ps.MetricsAddresses); n > 0 && n != ps.Count {
		p.add("parameter_servers.metrics_addresses", "lists %d addresses; count is %d, so give one per server (or none)", n, ps.Count)
	}
	taken := map[string]string{}
	for i := range c.Stages {
		for r := range c.stageReplicas(i) {
			taken[c.Address(i, r)] = c.addressField(i, r)
		}
		if a := c.Stages[i].MetricsAddress; a != "" {
			taken[a] = fmt.Sprintf("stages[%d].metrics_address", i)
		}
	}
	for i, a := range ps.Addresses {
		taken[a] = fmt.Sprintf("parameter_servers.addresses[%d]", i)
	}
	for i, a := range ps.MetricsAddresses {
		field := fmt.Sprintf("parameter_servers.metrics_addresses[%d]", i)
		if err := checkAddress(a); err != nil {
			p.add(field, "%v", err)
		} else if strings.HasPrefix(a, "unix:") {
			p.add(field, "%s: metrics are served over HTTP; give host:port", a)
		} else if _, auto := AutoPort(a); auto {
			p.add(field, "%s: the rendezvous does not place servers yet; give host:port", a)
		} else if o, dup := taken[a]; dup {
			p.add(field, "%s is also used by %s", a, o)
		} else if !c.Authenticated() && beyondLoopback(a) { // the rule ServeMetrics enforces too
			p.add(field, "%s listens beyond loopback; set transport.token (or token_file) or transport.tls, which the metrics server then requires, so strangers cannot read it", a)
		} else {
			taken[a] = field
		}
	}
}

// PSMetricsAddress is where server i serves its metrics ("" for nowhere).
func (c *Config) PSMetricsAddress(i int) string {
	if i < len(c.ParameterServers.MetricsAddresses) {
		return c.ParameterServers.MetricsAddresses[i]
	}
	return ""
}

// validatePSCheckpoints refuses checkpoints the servers cannot take part in
// yet. A server writes its shard when its update count reaches a step the
// run checkpoints after, so an update must be a step: not so in async mode
// with max_staleness 1 or more, where each push is an update of its own.
// Stage 0 commits on the shared run directory once every server's part is
// in; stages that meet at a rendezvous commit through rank 0's ledger,
// whose ranks the servers are not.
func (c *Config) validatePSCheckpoints(p *Problems) {
	ps := c.ParameterServers
	if c.Checkpoint.Every <= 0 {
		return
	}
	if ps.Mode == "async" && ps.MaxStaleness > 0 {
		p.add("checkpoint.every", "must be 0 with async parameter servers and max_staleness %d: each push is an update of its own, so the servers' state is at no step a checkpoint could name (sync, or async with max_staleness 0, checkpoints)", ps.MaxStaleness)
	}
	if c.UsesRendezvous() {
		p.add("checkpoint.every", "must be 0 with parameter_servers when the stages meet at a rendezvous (address: auto or rendezvous set): the servers are not ranks of the job yet, so rank 0's ledger cannot wait for their parts; give every stage a fixed address")
	}
}

// PSAddress is server i's address ("" when none is configured).
func (c *Config) PSAddress(i int) string {
	if i < len(c.ParameterServers.Addresses) {
		return c.ParameterServers.Addresses[i]
	}
	return ""
}

// PSName names server i in logs and errors.
func PSName(i int) string { return fmt.Sprintf("parameter server %d", i) }

// init files parameter_servers' defaults, bounds and descriptions with
// the other keys'.
func init() {
	defaults["parameter_servers.count"] = 0
	defaults["parameter_servers.mode"] = "sync"
	defaults["parameter_servers.aggregate"] = 0
	defaults["parameter_servers.max_staleness"] = 0
	minimums["parameter_servers.max_staleness"] = 0
	minimums["parameter_servers.count"] = 0
	minimums["parameter_servers.aggregate"] = 0
	keyDocs["parameter_servers"] = "Parameter servers instead of the replicas' all-reduce (docs/parameter-servers.md): the servers hold the weights and optimizer state, sharded by tensor; each replica of the pipeline is a worker that pushes its gradients and pulls the updated weights."
	keyDocs["parameter_servers.count"] = "Server processes (0: none, the replicas all-reduce over their ring)."
	keyDocs["parameter_servers.mode"] = "sync: one update per step from the workers' gradients summed in worker order, bit-identical to the one-process reference; async: each push applied as it arrives, within max_staleness."
	keyDocs["parameter_servers.max_staleness"] = "Async mode: a worker about to compute step s waits until every other worker has pushed its steps before s - max_staleness (stale-synchronous parallel); 0: each step's pushes are summed into one update, sync's."
	keyDocs["parameter_servers.aggregate"] = "Backup workers: each sync step sums the first this many of the data_parallel workers' pushes, in worker order, and drops the later ones (0: every worker's)."
	keyDocs["parameter_servers.addresses"] = "Where each server listens, server 0 first (host:port)."
	keyDocs["parameter_servers.metrics_addresses"] = "Where each server serves its Prometheus metrics at /metrics (host:port, server 0 first), guarded as a stage's metrics_address; leave out for none."
}
