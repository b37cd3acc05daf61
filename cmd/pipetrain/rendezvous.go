package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/pipetrain/pipetrain/cluster"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/stages"
)

// rendezvous publishes where this process listens and learns where every
// other process does, for a config whose addresses are auto: it binds its
// socket first (on the interface that reaches the rendezvous host, at the
// configured port or any free one), rank 0 serves the table, every rank
// registers, and the config's addresses are replaced by the table's. It
// returns the bound socket, for Connect to serve, and a stop for rank 0's
// registry.
func rendezvous(ctx context.Context, cfg *configs.Config, stage, replica int) (net.Listener, func(), error) {
	name := cfg.ProcessName(stage, replica)
	addr, from, err := cluster.ResolveRendezvous(cfg.Rendezvous, os.Getenv)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	rdvHost, _, _ := net.SplitHostPort(addr)
	lis, err := bindOwn(cfg, stage, replica, rdvHost)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	link, err := stages.LinkOptions(cfg, stage)
	if err != nil {
		lis.Close()
		return nil, nil, err
	}
	o := cluster.RendezvousOptions{Token: link.Token, TLS: link.TLS, Timeout: cfg.Transport.ConnectTimeout}
	rank, digest, build := cfg.Rank(stage, replica), cfg.Digest(), cluster.Build()
	stop := func() {}
	if rank == 0 {
		reg, err := cluster.ServeRendezvous(addr, cfg.Processes(), digest, build, o)
		if err != nil {
			lis.Close()
			return nil, nil, fmt.Errorf("%s: serving the rendezvous (%s): %w", name, from, err)
		}
		stop = func() { reg.Close() }
		fmt.Printf("pipetrain: serving the rendezvous for %d processes at %s (%s)\n", cfg.Processes(), reg.Addr(), from)
	}
	me := cluster.Entry{Rank: rank, Address: lis.Addr().String(), ConfigDigest: digest, Build: build}
	table, err := cluster.JoinRendezvous(ctx, addr, me, o)
	if err != nil {
		stop()
		lis.Close()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, e := range table {
		s, r := cfg.Position(e.Rank)
		cfg.SetAddress(s, r, e.Address)
	}
	fmt.Printf("pipetrain: %s listens on %s; the rendezvous at %s gave every process's address\n", name, me.Address, addr)
	return lis, stop, nil
}

// bindOwn binds this process's socket: its configured address, or for
// auto the interface that reaches the rendezvous host, at auto's port or
// any free one.
func bindOwn(cfg *configs.Config, stage, replica int, rdvHost string) (net.Listener, error) {
	a := cfg.Address(stage, replica)
	if port, auto := configs.AutoPort(a); auto {
		host, err := cluster.LocalAddressFor(rdvHost)
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
