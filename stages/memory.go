package stages

import (
	"runtime/metrics"
	"sync"
)

// heldBytes is the activation memory the stage's engines hold now.
func (r *Runtime) heldBytes() int64 {
	var n int64
	for _, e := range r.chunks {
		n += e.HeldBytes()
	}
	return n
}

// heapSample reads the live heap: runtime/metrics reads it without stopping
// the world, unlike runtime.ReadMemStats, so every action can afford it.
var heapSample = struct {
	sync.Mutex
	s []metrics.Sample
}{s: []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}}

func heapBytes() int64 {
	heapSample.Lock()
	defer heapSample.Unlock()
	metrics.Read(heapSample.s)
	if heapSample.s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(heapSample.s[0].Value.Uint64())
}
