package stages

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
)

// Joined is what the rendezvous gives a process: the socket it bound, and
// the coordination of the job's checkpoints and logs through rank 0.
type Joined struct {
	lis   net.Listener        // bound, for Connect to serve; nil for a process that serves no links
	reg   *cluster.Registry   // rank 0's registry; nil at other ranks
	coord cluster.Coordinator // commits checkpoints and gathers logs through rank 0
	wait  time.Duration       // how long a coordination may take
}

// Stop ends rank 0's registry, once the job needs it no more.
func (j *Joined) Stop() {
	if j.reg != nil {
		j.reg.Close()
	}
}

// rendezvous publishes where this process listens and learns where every
// other process does, for a config whose addresses are auto: it binds its
// socket first (on the interface that reaches the rendezvous host, at the
// configured port or any free one), rank 0 serves the table, every rank
// registers, and the config's addresses are replaced by the table's.
// Rank 0's registry then coordinates the job's checkpoints and logs, so
// that no process needs another's disk. runDir is where rank 0 gathers
// the others' logs.
func rendezvous(ctx context.Context, cfg *configs.Config, stage, replica int, runDir string, log io.Writer) (*Joined, error) {
	name := cfg.ProcessName(stage, replica)
	addr, from, err := cluster.ResolveRendezvous(cfg.Rendezvous, os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	rdvHost, _, _ := net.SplitHostPort(addr)
	lis, err := bindOwn(cfg, stage, replica, rdvHost, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	j, err := join(ctx, cfg, cfg.Rank(stage, replica), lis.Addr().String(), runDir, addr, from, log)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	j.lis = lis
	placeRanks(cfg, j.table)
	fmt.Fprintf(log, "pipetrain: %s listens on %s; the rendezvous at %s gave every process's address\n", name, lis.Addr(), addr)
	return &j.Joined, nil
}

// placeRanks replaces the config's addresses with the rendezvous's table:
// the stage processes' and, when they are ranks, the parameter servers'.
func placeRanks(cfg *configs.Config, table []cluster.Entry) {
	for _, e := range table {
		if i, ok := cfg.ServerAt(e.Rank); ok {
			cfg.SetPSAddress(i, e.Address)
			continue
		}
		s, r := cfg.Position(e.Rank)
		cfg.SetAddress(s, r, e.Address)
	}
}

// tabled is a joined process and the rendezvous's table.
type tabled struct {
	Joined
	table []cluster.Entry
}

// Join serves the rendezvous at addr (found from, for messages) when rank
// is 0 and registers rank there with address: where it listens, or a name
// for a process that serves no links (pipetrain gather). runDir is where rank
// 0 gathers the others' logs; log receives what the rendezvous says.
func Join(ctx context.Context, cfg *configs.Config, rank int, address, runDir, addr, from string, log io.Writer) (*Joined, error) {
	j, err := join(ctx, cfg, rank, address, runDir, addr, from, log)
	if err != nil {
		return nil, err
	}
	return &j.Joined, nil
}

// join is Join, with the rendezvous's table.
func join(ctx context.Context, cfg *configs.Config, rank int, address, runDir, addr, from string, log io.Writer) (*tabled, error) {
	stage, _ := cfg.Position(rank)
	if _, server := cfg.ServerAt(rank); server {
		stage = 0 // a server is guarded as ServePS guards it: as stage 0's links
	}
	link, err := LinkOptions(cfg, stage)
	if err != nil {
		return nil, err
	}
	// The secret binds this process's checkpoint parts and logs to the rank
	// it joins as: holding the token is not enough to speak for a rank.
	o := cluster.RendezvousOptions{Token: link.Token, TLS: link.TLS, Timeout: cfg.Transport.ConnectTimeout, Replicas: cfg.Replicas(), Secret: cluster.NewSecret(),
		Servers: cfg.World() - cfg.Processes()}
	digest, build := cfg.Digest(), cluster.Build()
	j := &tabled{Joined: Joined{coord: cluster.Coordinator{Addr: addr, Rank: rank, Options: o}, wait: o.Timeout}}
	if rank == 0 {
		o.GatherDir, o.Owns = runDir, gatherable(cfg, log)
		o.Checkpoints = checkpoint.Plan{Every: cfg.Checkpoint.Every, Steps: cfg.Train.Steps}
		reg, err := cluster.ServeRendezvous(addr, cfg.World(), digest, build, o)
		if err != nil {
			return nil, fmt.Errorf("serving the rendezvous (%s): %w", from, err)
		}
		j.reg = reg
		fmt.Fprintf(log, "pipetrain: serving the rendezvous for %s at %s (%s)\n", worldNoun(cfg), reg.Addr(), from)
	}
	me := cluster.Entry{Rank: rank, Address: address, ConfigDigest: digest, Build: build}
	if j.table, err = cluster.JoinRendezvous(ctx, addr, me, o); err != nil {
		j.Stop()
		return nil, err
	}
	return j, nil
}

// gatherable is what rank 0 takes from each rank that sends its logs: its
// own files (Outputs), each bounded by what the rank can write into
// it (OutputLimits). A rank whose bounds cannot be worked out sends
// nothing.
func gatherable(cfg *configs.Config, log io.Writer) func(rank int) map[string]int64 {
	return func(rank int) map[string]int64 {
		if _, server := cfg.ServerAt(rank); server {
			return nil // a server writes nothing into the run's logs
		}
		stage, replica := cfg.Position(rank)
		limits, err := OutputLimits(cfg, stage, replica)
		if err != nil {
			fmt.Fprintf(log, "pipetrain: rank 0 takes no logs from rank %d: %v\n", rank, err)
			return nil
		}
		return limits
	}
}

// worldNoun says how many processes the rendezvous waits for: "8
// processes (6 stage processes and 2 parameter servers)".
func worldNoun(cfg *configs.Config) string {
	n := words.Count(cfg.World(), "process")
	if servers := cfg.World() - cfg.Processes(); servers > 0 {
		n += fmt.Sprintf(" (%s and %s)", words.Count(cfg.Processes(), "stage process"), words.Count(servers, "parameter server"))
	}
	return n
}

// Gather brings the run's logs into rank 0's run directory: every other
// rank sends its own files (Outputs), and rank 0 waits for them all.
func (j *Joined) Gather(ctx context.Context, cfg *configs.Config, runDir string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, j.wait)
	defer cancel()
	if j.reg != nil {
		if err := j.reg.WaitGathered(ctx); err != nil {
			return err
		}
		fmt.Fprintf(log, "pipetrain: the run's logs are in %s\n", runDir)
		return nil
	}
	var files []string // a parameter server's: none, but rank 0 waits for its word
	if _, server := cfg.ServerAt(j.coord.Rank); !server {
		stage, replica := cfg.Position(j.coord.Rank)
		files = Outputs(cfg, stage, replica)
	}
	n, err := j.coord.Gather(ctx, runDir, files)
	if err != nil {
		return fmt.Errorf("rank %d: sending its logs to rank 0: %w", j.coord.Rank, err)
	}
	if n > 0 {
		fmt.Fprintf(log, "pipetrain: rank %d sent %s to rank 0\n", j.coord.Rank, words.Count(n, "file"))
	}
	return nil
}

// bindOwn binds this process's socket: its configured address, or for
// auto the interface that reaches the rendezvous host, at auto's port or
// any free one.
func bindOwn(cfg *configs.Config, stage, replica int, rdvHost string, log io.Writer) (net.Listener, error) {
	a := cfg.Address(stage, replica)
	if port, auto := configs.AutoPort(a); auto {
		host, err := localAddressFor(rdvHost, cfg.Transport.ConnectTimeout, cluster.LocalAddressFor, log)
		if err != nil {
			return nil, err
		}
		a = net.JoinHostPort(host, strconv.Itoa(port))
	}
	lis, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", a, err)
	}
	return lis, nil
}

// localAddressFor is route (cluster.LocalAddressFor), retried for up to
// wait: a cluster's DNS may publish rank 0's name a moment after this rank
// starts (a Kubernetes pod's record appears once the pod is ready).
func localAddressFor(host string, wait time.Duration, route func(string) (string, error), log io.Writer) (string, error) {
	deadline := time.Now().Add(wait)
	pause := 100 * time.Millisecond
	said := false
	for {
		addr, err := route(host)
		if err == nil || time.Now().Add(pause).After(deadline) {
			return addr, err
		}
		if !said {
			fmt.Fprintf(log, "pipetrain: waiting for the rendezvous host %s: %v\n", host, err)
			said = true
		}
		time.Sleep(pause)
		pause = min(2*pause, 2*time.Second)
	}
}
