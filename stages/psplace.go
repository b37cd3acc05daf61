package stages

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
)

// Parameter servers as ranks of the job (configs.Config.PSRanks): when the
// stages meet at a rendezvous and the servers' addresses are absent or
// auto, server i is rank stages × replicas + i. It binds its socket on the
// interface that reaches the rendezvous host, registers its address there
// like a stage, and the stages learn every server's address from the
// table before their first push (placeRanks).

// joinAsServer binds server i's socket and registers it at the rendezvous,
// returning the joined process with its listener.
func joinAsServer(ctx context.Context, c *configs.Config, i int, runDir string, log io.Writer) (*Joined, error) {
	name := configs.PSName(i)
	addr, from, err := cluster.ResolveRendezvous(c.Rendezvous, os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", name, c.Path, err)
	}
	rdvHost, _, _ := net.SplitHostPort(addr)
	lis, err := bindServer(c, i, rdvHost, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	j, err := join(ctx, c, c.PSRank(i), lis.Addr().String(), runDir, addr, from, log)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("%s (rank %d): %w", name, c.PSRank(i), err)
	}
	j.lis = lis
	placeRanks(c, j.table)
	fmt.Fprintf(log, "pipetrain: %s is rank %d of %d and listens on %s; the rendezvous at %s gave every process's address\n", name, c.PSRank(i), c.World(), lis.Addr(), addr)
	return &j.Joined, nil
}

// bindServer binds server i's socket: on the interface that reaches the
// rendezvous host, at auto:PORT's port or any free one.
func bindServer(c *configs.Config, i int, rdvHost string, log io.Writer) (net.Listener, error) {
	port, _ := configs.AutoPort(c.PSAddress(i)) // absent: any port, as auto
	host, err := localAddressFor(rdvHost, c.Transport.ConnectTimeout, cluster.LocalAddressFor, log)
	if err != nil {
		return nil, err
	}
	a := net.JoinHostPort(host, strconv.Itoa(port))
	lis, err := net.Listen("tcp", a)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", a, err)
	}
	return lis, nil
}
