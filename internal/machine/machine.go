// Package machine describes the host for benchmark reports.
package machine

import (
	"os"
	"runtime"
	"strings"
)

// CPUModel is the processor's model name from /proc/cpuinfo, or the
// architecture where that is not available.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}
