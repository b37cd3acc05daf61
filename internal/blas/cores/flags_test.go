package cores

import (
	"os"
	"strings"
	"testing"
)

func cpuFlags(t *testing.T) map[string]bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				m[f] = true
			}
			break
		}
	}
	return m
}
