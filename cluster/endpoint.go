package cluster

import (
	"fmt"
	"net"
	"runtime/debug"
	"strconv"
)

// DefaultRendezvousPort is the rendezvous port where nothing names one:
// torchrun's default for its c10d rendezvous.
const DefaultRendezvousPort = 29400

// ResolveRendezvous is where rank 0 serves the rendezvous: the config's
// rendezvous key if set, else MASTER_ADDR:MASTER_PORT (torchrun, Kubeflow),
// else the first host of SLURM_JOB_NODELIST on the default port. from says
// which, for messages.
func ResolveRendezvous(configured string, getenv func(string) string) (addr, from string, err error) {
	if configured != "" {
		if _, _, err := net.SplitHostPort(configured); err != nil {
			return "", "", fmt.Errorf("rendezvous: %q is not host:port", configured)
		}
		return configured, "the config's rendezvous", nil
	}
	if host := getenv("MASTER_ADDR"); host != "" {
		port := getenv("MASTER_PORT")
		if port == "" {
			port = strconv.Itoa(DefaultRendezvousPort)
		}
		return net.JoinHostPort(host, port), "MASTER_ADDR/MASTER_PORT", nil
	}
	if list := getenv("SLURM_JOB_NODELIST"); list != "" {
		hosts, err := ExpandHostlist(list)
		if err != nil {
			return "", "", fmt.Errorf("SLURM_JOB_NODELIST: %w", err)
		}
		return net.JoinHostPort(hosts[0], strconv.Itoa(DefaultRendezvousPort)), "the first host of SLURM_JOB_NODELIST", nil
	}
	return "", "", fmt.Errorf("addresses are auto but no rendezvous is known: set rendezvous: HOST:PORT in the config, or MASTER_ADDR and MASTER_PORT, or run under Slurm")
}

// LocalAddressFor is the address of this host's interface that reaches
// host, the one a rank should listen on so that rank 0's host, and so its
// neighbours on the same network, can reach it. No packet is sent: a UDP
// socket only asks the kernel for its route.
func LocalAddressFor(host string) (string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(host, "9"))
	if err != nil {
		return "", fmt.Errorf("no route to the rendezvous host %s: %w", host, err)
	}
	defer c.Close()
	ip := c.LocalAddr().(*net.UDPAddr).IP
	return ip.String(), nil
}

// Build identifies this binary for the rendezvous: ranks of one job must run
// the same build, or their arithmetic (and wire format) may differ.
func Build() string {
	b := "unknown"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	b = info.GoVersion + " " + info.Main.Version
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision", "vcs.modified", "CGO_ENABLED", "-tags":
			b += " " + s.Key + "=" + s.Value
		}
	}
	return b
}
