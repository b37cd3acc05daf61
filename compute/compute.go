// Package compute is the seam between a stage and the device that computes
// its chunks. A device kind ("cpu") registers a Device, as a model family
// registers with models.Register; stages[i].device names the kind, and the
// stage asks the registry (Lookup) for it and opens one Stage per chunk.
// Config validation asks the same registry, so a device this build lacks
// is refused before any process starts. The cpu kind is the gorgonia +
// OpenBLAS engine (package engine) and is always registered.
package compute

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
)

// Device builds the compute of a stage's chunks on one kind of device.
type Device interface {
	// Kind is the name stages[i].device gives it, before any ":N" index
	// ("cpu", "cuda").
	Kind() string
	// Open builds the compute of one chunk of a stage as spec describes it.
	Open(spec Spec) (Stage, error)
}

// Spec is what a Device opens: model stages [First, Last) of Model, computed
// on micro-batches of Batch samples, on device Index.
type Spec struct {
	Model       *models.Model
	First, Last int
	Batch       int
	Seed        uint64         // the model's initialisation seed
	Options     engine.Options // what the stage's schedule asks of the chunk (split backward, recomputation)
	// Index is N of stages[i].device "kind:N", 0 when the device names none.
	Index int
}

// unbuilt names, for each device kind pipetrain knows but a build may leave
// out, the build that has it.
var unbuilt = map[string]string{"cuda": "pipetrain built with -tags pipetrain_cuda (docs/gpu.md)"}

var (
	mu      sync.RWMutex
	devices = map[string]Device{}
)

// Register makes d the device of its kind. It panics when the kind is
// empty, holds ':' or is registered already; call it from an init function.
func Register(d Device) {
	k := d.Kind()
	if k == "" || strings.Contains(k, ":") {
		panic(fmt.Sprintf("compute: device kind %q: want a name without ':'", k))
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := devices[k]; dup {
		panic(fmt.Sprintf("compute: device kind %q registered twice", k))
	}
	devices[k] = d
}

// Kinds lists the registered device kinds, sorted.
func Kinds() []string {
	mu.RLock()
	defer mu.RUnlock()
	ks := make([]string, 0, len(devices))
	for k := range devices {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Lookup returns the device that stages[i].device names ("" is "cpu";
// "kind:N" is device N of a kind) and N. A kind this build was made
// without is refused naming the build that has it.
func Lookup(device string) (Device, int, error) {
	kind, index, hasIndex := strings.Cut(cmp.Or(device, "cpu"), ":")
	n := 0
	if hasIndex {
		var err error
		if n, err = strconv.Atoi(index); err != nil || n < 0 {
			return nil, 0, fmt.Errorf("%q: write %s:N with N a device index", device, kind)
		}
	}
	mu.RLock()
	d, ok := devices[kind]
	mu.RUnlock()
	if ok {
		return d, n, nil
	}
	if build, known := unbuilt[kind]; known {
		return nil, 0, fmt.Errorf("%q: built without %s: %s runs %s:N stages", device, strings.ToUpper(kind), build, kind)
	}
	known := Kinds()
	for k := range unbuilt {
		if !slices.Contains(known, k) {
			known = append(known, k+":N")
		}
	}
	sort.Strings(known)
	return nil, 0, fmt.Errorf("unknown device %q (known: %s)", device, strings.Join(known, ", "))
}
