package compute

import (
	"strings"
	"testing"
)

type fake struct{ kind string }

func (f fake) Kind() string           { return f.kind }
func (fake) Open(Spec) (Stage, error) { return nil, nil }

func TestLookup(t *testing.T) {
	Register(fake{"lookup-test"})
	for _, c := range []struct {
		device, kind string
		index        int
	}{{"", "cpu", 0}, {"cpu", "cpu", 0}, {"lookup-test", "lookup-test", 0}, {"lookup-test:2", "lookup-test", 2}} {
		d, n, err := Lookup(c.device)
		if err != nil || d.Kind() != c.kind || n != c.index {
			t.Errorf("Lookup(%q) = %v, %d, %v; want kind %s, index %d", c.device, d, n, err, c.kind, c.index)
		}
	}
	for device, want := range map[string]string{
		"cuda:0":         `"cuda:0": built without CUDA: pipetrain built with -tags pipetrain_cuda (docs/gpu.md) runs cuda:N stages`,
		"cuda:x":         `"cuda:x": write cuda:N with N a device index`,
		"lookup-test:-1": `write lookup-test:N with N a device index`,
		"tpu":            `unknown device "tpu" (known: cpu, cuda:N, lookup-test)`,
	} {
		if _, _, err := Lookup(device); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Lookup(%q): err = %v, want %q", device, err, want)
		}
	}
}

func TestRegisterRefuses(t *testing.T) {
	for _, kind := range []string{"cpu", "", "gpu:0"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", kind)
				}
			}()
			Register(fake{kind})
		}()
	}
}
