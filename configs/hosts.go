package configs

import (
	"fmt"
	"net"
	"strings"
)

// ReplicaHosts cuts stage s's replicas into runs that share a host, in
// replica order, and returns the runs' sizes: the hosts of a hierarchical
// all-reduce (all_reduce.algorithm: hierarchical). An address's host is
// the host part of host:port, compared as written; unix: sockets are all
// on this host. A host whose replicas are not consecutive is refused: the
// reduction runs over the ring's links, replica r to r+1, and within a
// host it needs them to join that host's replicas.
func (c *Config) ReplicaHosts(s int) ([]int, error) {
	var sizes []int
	seen := map[string]int{} // host: its run
	last := ""
	for r := range c.Replicas() {
		a := c.Address(s, r)
		h, err := addressHost(a)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", c.addressField(s, r), err)
		}
		if r > 0 && h == last {
			sizes[len(sizes)-1]++
			continue
		}
		if run, ok := seen[h]; ok {
			return nil, fmt.Errorf("%s: %s is on host %q with replicas %d-%d, but not next to them; list each host's replicas one after another",
				c.addressField(s, r), a, h, sumTo(sizes, run), sumTo(sizes, run+1)-1)
		}
		seen[h], last = len(sizes), h
		sizes = append(sizes, 1)
	}
	return sizes, nil
}

// sumTo is the sum of sizes[:n]: the first replica of run n.
func sumTo(sizes []int, n int) int {
	t := 0
	for _, s := range sizes[:n] {
		t += s
	}
	return t
}

// addressHost is the host an address listens on.
func addressHost(a string) (string, error) {
	if _, ok := AutoPort(a); ok {
		return "", fmt.Errorf("%q: the hierarchical all-reduce groups replicas by host, which auto does not name; write host:port", a)
	}
	if strings.HasPrefix(a, "unix:") {
		return "", nil
	}
	h, _, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port: %v", a, err)
	}
	return h, nil
}
