package configs

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pipetrain/pipetrain/internal/affinity"
)

// unusableCPU is a CPU number this process may not run on here.
func unusableCPU(t *testing.T) int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	for c := range affinity.MaxCPU {
		if !set.IsSet(c) {
			return c
		}
	}
	t.Fatalf("this process may use all %d CPUs", affinity.MaxCPU)
	return 0
}

// TestCPUsThisMachineLacks: a stage of this machine pinned to a CPU the
// process may not use is refused at validation, naming the field; a stage on
// another host is left to that host.
func TestCPUsThisMachineLacks(t *testing.T) {
	cpu := unusableCPU(t)
	list := fmt.Sprintf("0,%d", cpu)
	text := strings.Replace(good, "address: 127.0.0.1:7002}", `address: 127.0.0.1:7002, cpus: "`+list+`"}`, 1)
	_, err := Load(writeConfig(t, text))
	want := fmt.Sprintf("stages[1].cpus: %q names CPU %d, which this machine lacks or this process may not use (usable here: ", list, cpu)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want %q", err, want)
	}

	// 192.0.2.1 (TEST-NET-1) is never this machine's.
	remote := strings.Replace(text, "127.0.0.1:7002", `"192.0.2.1:7002"`, 1) + "transport: {token: s3cret}\n"
	if _, err := Load(writeConfig(t, remote)); err != nil {
		t.Errorf("a stage on another host is checked there, not here: %v", err)
	}
	if _, err := Load(writeConfig(t, strings.Replace(text, list, "0", 1))); err != nil {
		t.Errorf("CPU 0: %v", err)
	}
}

func TestRunsHere(t *testing.T) {
	here := []string{"127.0.0.1:7001", "localhost:7001", "[::1]:7001", "0.0.0.0:7001", "[::]:7001", "unix:/tmp/s.sock"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				here = append(here, net.JoinHostPort(n.IP.String(), "7001"))
			}
		}
	}
	if name, err := os.Hostname(); err == nil {
		here = append(here, name+":7001")
	}
	for _, a := range here {
		if !runsHere(a) {
			t.Errorf("runsHere(%q) = false", a)
		}
	}
	for _, a := range []string{"192.0.2.1:7001", "gpu-node-that-is-not-here.invalid:7001", "no-port"} {
		if runsHere(a) {
			t.Errorf("runsHere(%q) = true", a)
		}
	}
}

func TestCPUList(t *testing.T) {
	var set unix.CPUSet
	if got := cpuList(set); got != "none" {
		t.Errorf("empty set: %q", got)
	}
	for _, c := range []int{0, 1, 2, 3, 6, 8, 9, 1023} {
		set.Set(c)
	}
	if got := cpuList(set); got != "0-3,6,8-9,1023" {
		t.Errorf("cpuList = %q", got)
	}
}
