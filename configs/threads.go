package configs

import (
	"net"
	"runtime"

	"github.com/pipetrain/pipetrain/internal/affinity"
)

// Threads is the BLAS thread count of stage i (the reference counts as stage 0):
// compute.blas_threads if set, else the stage's CoreShare.
func (c *Config) Threads(i int) int {
	if c.Compute.BLASThreads > 0 {
		return c.Compute.BLASThreads
	}
	return c.CoreShare(i)
}

// CoreShare is stage i's fair share of its machine: the CPUs the stage is
// pinned to, or this machine's cores divided among the stages that listen on
// the same host (every replica's), at least 1.
func (c *Config) CoreShare(i int) int {
	if i < 0 || i >= len(c.Stages) {
		return 1
	}
	if cpus, err := affinity.Parse(c.Stages[i].CPUs); err == nil && len(cpus) > 0 {
		return len(cpus)
	}
	host, _, _ := net.SplitHostPort(c.Stages[i].Address)
	sharing := 0
	for s := range c.Stages {
		for r := range c.Replicas() {
			if h, _, _ := net.SplitHostPort(c.Address(s, r)); h == host {
				sharing++
			}
		}
	}
	return max(1, runtime.NumCPU()/max(sharing, 1))
}

// ReferenceThreads is the BLAS thread count of the one-process reference:
// compute.blas_threads if set, else every CPU this process may run on, since
// the reference runs alone. Its results then differ in the last bits from a
// pipelined run whose stages have fewer threads each; the reference's
// --pipeline-threads takes Threads(0) instead, to compare bit for bit.
func (c *Config) ReferenceThreads() int {
	if c.Compute.BLASThreads > 0 {
		return c.Compute.BLASThreads
	}
	return max(1, runtime.NumCPU())
}
