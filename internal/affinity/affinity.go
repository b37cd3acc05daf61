// Package affinity pins a whole process to a set of CPUs, so a stage can own its
// cores the way it would own a device.
package affinity

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxCPU bounds CPU numbers: unix.CPUSet holds this many.
const MaxCPU = 1024

// Parse reads a CPU list such as "0", "0-3" or "0,2,4-5".
func Parse(list string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("%q is not a CPU list like \"0-3\" or \"0,2\"", list)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a CPU list like \"0-3\" or \"0,2\"", list)
			}
		}
		if b >= MaxCPU {
			return nil, fmt.Errorf("%q: CPU %d is beyond the %d CPUs Linux affinity masks hold here", list, b, MaxCPU)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// Pin restricts every thread of this process to cpus. Linux sets affinity per
// thread, and a new thread inherits its creator's, so pinning each existing thread
// covers the threads the Go runtime and OpenBLAS start later.
func Pin(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return unix.SchedSetaffinity(0, &set)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pinning thread %d to CPUs %v: %w", tid, cpus, err)
		}
	}
	return nil
}
