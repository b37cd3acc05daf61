package configs

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
)

// The process grid. A run with p stages and R replicas (data_parallel) has
// p × R processes; rank = stage × R + replica, so the replicas of one stage
// are adjacent ranks, as in DeepSpeed's ['pipe', 'data'] topology: the
// all-reduce moves a stage's whole gradient once a step and is the transfer
// that most wants the fastest links (one host, one switch), while the
// pipeline's activations are smaller and overlap compute. Placing ranks in
// order on hosts thus keeps each stage's replicas together. Replica r of
// every stage forms one copy of the pipeline; stage s of every replica forms
// one all-reduce ring.

// DefaultBucketBytes is all_reduce.bucket_bytes where it is 0.
const DefaultBucketBytes = 1 << 20

// BucketBytes is the all-reduce's bucket size in bytes.
func (c *Config) BucketBytes() int {
	if c.AllReduce.BucketBytes > 0 {
		return c.AllReduce.BucketBytes
	}
	return DefaultBucketBytes
}

// Replicas is the number of pipeline replicas (data_parallel; 0 counts as 1).
func (c *Config) Replicas() int { return max(1, c.DataParallel) }

// Processes is the number of processes the run has.
func (c *Config) Processes() int { return len(c.Stages) * c.Replicas() }

// Rank is the grid rank of stage s, replica r.
func (c *Config) Rank(s, r int) int { return s*c.Replicas() + r }

// Position is the stage and replica of a grid rank.
func (c *Config) Position(rank int) (stage, replica int) {
	return rank / c.Replicas(), rank % c.Replicas()
}

// Address is the listen address of stage s, replica r.
func (c *Config) Address(s, r int) string {
	st := c.Stages[s]
	if r < len(st.Addresses) {
		return st.Addresses[r]
	}
	if r == 0 {
		return st.Address
	}
	return ""
}

// addressField names the field an address comes from, for problems.
func (c *Config) addressField(s, r int) string {
	if len(c.Stages[s].Addresses) > 0 {
		return fmt.Sprintf("stages[%d].addresses[%d]", s, r)
	}
	return fmt.Sprintf("stages[%d].address", s)
}

// stageReplicas is how many addresses stage s must have: the replicas, or
// as many as it lists when they are too few (the count is reported apart).
func (c *Config) stageReplicas(s int) int {
	if n := len(c.Stages[s].Addresses); n > 0 && n < c.Replicas() {
		return n
	}
	return c.Replicas()
}

// ProcessName is how logs and errors name a process: "stage 2", or with
// replicas "stage 2 replica 1".
func (c *Config) ProcessName(s, r int) string {
	if c.Replicas() == 1 {
		return fmt.Sprintf("stage %d", s)
	}
	return fmt.Sprintf("stage %d replica %d", s, r)
}

// normaliseAddresses makes Address replica 0's address when only
// addresses is given, so code that knows no replicas keeps working.
func (c *Config) normaliseAddresses() {
	for i := range c.Stages {
		if s := &c.Stages[i]; s.Address == "" && len(s.Addresses) > 0 {
			s.Address = s.Addresses[0]
		}
	}
}

func (c *Config) validateReplicas(p *Problems) {
	if c.DataParallel < 0 {
		p.add("data_parallel", "must be at least 1 (one copy of the pipeline), got %d", c.DataParallel)
		return
	}
	if c.AllReduce.BucketBytes < 0 {
		p.add("all_reduce.bucket_bytes", "must be positive (0: the default, 1 MiB), got %d", c.AllReduce.BucketBytes)
	}
	if c.AllReduce.CheckEvery < 0 {
		p.add("all_reduce.check_every", "must be 0 (never) or a number of steps, got %d", c.AllReduce.CheckEvery)
	}
	if comp := c.Transport.Compression; c.AllReduce.ShardOptimizer && comp != "" && comp != compressions[0] {
		// The updated weights cross the replicas' ring, whose wire would
		// round them to 16 bits.
		p.add("all_reduce.shard_optimizer", "shares the updated weights over the replicas' ring, which transport.compression %s would round; use one or the other", comp)
	}
	if a := c.AllReduce.Algorithm; a != "" && !slices.Contains(AllReduceAlgorithms, a) {
		p.add("all_reduce.algorithm", "unknown algorithm %q (known: %s)", a, strings.Join(AllReduceAlgorithms, ", "))
	} else if a := c.ReduceAlgorithm(); c.AllReduce.ShardOptimizer && a != AllReduceAlgorithms[0] {
		// The shards are the ring's reduce-scatter chunks; the other
		// algorithms have no reduce-scatter to end with.
		p.add("all_reduce.shard_optimizer", "needs all_reduce.algorithm ring (its reduce-scatter makes the shards), not %s", a)
	} else if a == "hierarchical" && c.Replicas() > 1 {
		for i := range c.Stages {
			if _, err := c.ReplicaHosts(i); err != nil {
				p.add("all_reduce.algorithm", "hierarchical: %v", err)
			}
		}
	}
	if t := c.AllReduce.Transport; t != "" && !slices.Contains(AllReduceTransports, t) {
		p.add("all_reduce.transport", "unknown transport %q (known: %s)", t, strings.Join(AllReduceTransports, ", "))
	}
	if o := c.AllReduce.Overlap; o != "" && !slices.Contains(AllReduceOverlaps, o) {
		p.add("all_reduce.overlap", "unknown overlap %q (known: %s)", o, strings.Join(AllReduceOverlaps, ", "))
	} else if a := c.ReduceAlgorithm(); o == "layer" && a != AllReduceAlgorithms[0] {
		// Starting buckets apart runs slices of the ring's plan; no other
		// algorithm's messages have been run or tested in slices.
		p.add("all_reduce.overlap", "layer needs all_reduce.algorithm ring, not %s", a)
	}
	r := c.Replicas()
	for i, s := range c.Stages {
		field := fmt.Sprintf("stages[%d]", i)
		switch n := len(s.Addresses); {
		case n == 0 && r > 1:
			p.add(field+".addresses", "missing: data_parallel is %d, so list %d addresses, one per replica (replica 0 first), e.g. addresses: [%s]", r, r, exampleAddresses(s.Address, r))
		case n > 0 && n != r:
			p.add(field+".addresses", "lists %d addresses; data_parallel is %d, so give one per replica", n, r)
		case n > 0 && s.Address != s.Addresses[0]:
			p.add(field+".address", "%s differs from addresses[0] %s; give addresses alone", s.Address, s.Addresses[0])
		}
		if r > 1 && s.CPUs != "" {
			p.add(field+".cpus", "pinning is per process and cannot be shared by %d replicas; leave cpus out with data_parallel > 1", r)
		}
		if r > 1 && s.MetricsAddress != "" {
			p.add(field+".metrics_address", "one address cannot serve %d replicas; leave metrics_address out with data_parallel > 1", r)
		}
	}
}

// exampleAddresses suggests r addresses from a stage's address: the same
// host, ports counting up in hundreds.
func exampleAddresses(addr string, r int) string {
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		host, n = "127.0.0.1", 7101
	}
	out := ""
	for i := range min(r, 4) {
		if i > 0 {
			out += ", "
		}
		out += net.JoinHostPort(host, strconv.Itoa(n+100*i))
	}
	if r > 4 {
		out += ", ..."
	}
	return out
}

// AutoPort reports whether a is an address the rendezvous assigns: "auto"
// (any free port) or "auto:PORT"; port is 0 for any, -1 when PORT is bad.
func AutoPort(a string) (port int, ok bool) {
	if a == "auto" {
		return 0, true
	}
	rest, ok := strings.CutPrefix(a, "auto:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 1 || n > 65535 {
		return -1, true
	}
	return n, true
}

// UsesRendezvous reports whether the ranks meet at a rendezvous: when any
// process's address is auto (they learn each other's addresses there), or
// when the config names one (rank 0 then also coordinates checkpoints and
// logs, so the run directory need not be shared).
func (c *Config) UsesRendezvous() bool {
	return c.Rendezvous != "" || c.AutoAddresses()
}

// AutoAddresses reports whether any process's address is auto, known only
// at run time, or was before the rendezvous gave it (SetAddress).
func (c *Config) AutoAddresses() bool {
	if c.addressesGiven {
		return true
	}
	for s := range c.Stages {
		for r := range c.Replicas() {
			if _, ok := AutoPort(c.Address(s, r)); ok {
				return true
			}
		}
	}
	return false
}

// SetAddress replaces the address of stage s, replica r (with one the
// rendezvous gave), keeping Address replica 0's.
func (c *Config) SetAddress(s, r int, addr string) {
	if _, auto := AutoPort(c.Address(s, r)); auto {
		c.addressesGiven = true
	}
	st := &c.Stages[s]
	if c.Replicas() > 1 || len(st.Addresses) > 0 {
		for len(st.Addresses) < c.Replicas() {
			st.Addresses = append(st.Addresses, "")
		}
		st.Addresses[r] = addr
	}
	if r == 0 {
		st.Address = addr
	}
}
