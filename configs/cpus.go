package configs

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/pipetrain/pipetrain/internal/affinity"
	"github.com/pipetrain/pipetrain/transport"
)

// validateCPUs checks stages[i].cpus. A list is checked against this
// machine's CPUs only when the stage runs here (see runsHere): a config for
// several hosts may be validated on any of them, or on a laptop, and each
// stage process loads and validates the config again on its own host before
// it pins itself, so a stage elsewhere is checked where it runs. Linux pins
// without complaint to a list that holds at least one usable CPU, quietly
// dropping the others, so a CPU missing here is an error, not a warning: the
// stage would run on fewer cores than it sizes its BLAS threads for.
func (c *Config) validateCPUs(p *Problems, i int) {
	s := c.Stages[i]
	field := fmt.Sprintf("stages[%d].cpus", i)
	cpus, err := affinity.Parse(s.CPUs)
	if err != nil {
		p.add(field, "%v", err)
		return
	}
	if !runsHere(s.Address) {
		return
	}
	usable, err := usableCPUs()
	if err != nil {
		return // no affinity to compare with; pinning reports its own error
	}
	var missing unix.CPUSet
	for _, cpu := range cpus {
		if !usable.IsSet(cpu) {
			missing.Set(cpu)
		}
	}
	if n := missing.Count(); n > 0 {
		what := "CPU"
		if n > 1 {
			what = "CPUs"
		}
		p.add(field, "%q names %s %s, which this machine lacks or this process may not use (usable here: %s)",
			s.CPUs, what, cpuList(missing), cpuList(usable))
	}
}

// CPUsCheckedHere reports whether validation checked stage i's cpus against
// this machine: whether the stage runs here, as far as runsHere can tell.
func (c *Config) CPUsCheckedHere(i int) bool { return runsHere(c.Stages[i].Address) }

// usableCPUs are the CPUs this process may run on: those the machine has
// online, less any its cgroup or a parent's affinity (taskset) keep from it.
func usableCPUs() (unix.CPUSet, error) {
	var set unix.CPUSet
	err := unix.SchedGetaffinity(0, &set)
	return set, err
}

// runsHere reports whether a stage listening on addr runs on this machine:
// a Unix socket, loopback, every interface (0.0.0.0, which other stages can
// only reach on this host), an address of one of this machine's interfaces,
// or its host name. Other host names are not looked up: validation must not
// wait on DNS, and the stage's host checks them when it loads the config.
func runsHere(addr string) bool {
	if _, auto := AutoPort(addr); auto {
		return false // wherever the engine starts it; it checks its CPUs then
	}
	if _, unixSocket := transport.UnixPath(addr); unixSocket {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if transport.IsLoopback(host) {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsUnspecified() {
			return true
		}
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return false
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
		return false
	}
	name, err := os.Hostname()
	if err != nil {
		return false
	}
	short, _, _ := strings.Cut(name, ".")
	return strings.EqualFold(host, name) || strings.EqualFold(host, short)
}

// cpuList writes a CPU set as the ranges cpus: takes, "0-3,6".
func cpuList(set unix.CPUSet) string {
	var parts []string
	for c := 0; c < affinity.MaxCPU; c++ {
		if !set.IsSet(c) {
			continue
		}
		end := c
		for end+1 < affinity.MaxCPU && set.IsSet(end+1) {
			end++
		}
		if end == c {
			parts = append(parts, strconv.Itoa(c))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", c, end))
		}
		c = end
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}
