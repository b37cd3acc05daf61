package optim

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"gorgonia.org/tensor"
)

// shardSpecs are the optimizers the shard tests run: each kind of state,
// with weight decay on the decayed parameters.
var shardSpecs = []Spec{
	{Name: "adamw", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
	{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8},
	{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 0.01},
	{Name: "sgd", LR: 0.05},
}

var (
	shardNames  = []string{"fc0.weight", "fc0.bias", "fc1.weight"}
	shardShapes = []tensor.Shape{{37, 29}, {29}, {300, 250}} // the last is shared among workers
)

// cuts splits n elements into buckets of bucket, each into ranks chunks,
// as a ring all-reduce does, and returns each rank's ranges.
func cuts(n, bucket, ranks int) [][][2]int {
	own := make([][][2]int, ranks)
	for lo := 0; lo < n; lo += bucket {
		hi := min(n, lo+bucket)
		size, extra := (hi-lo)/ranks, (hi-lo)%ranks
		at := lo
		for c := range ranks {
			end := at + size
			if c < extra {
				end++
			}
			// Rank c-1 owns chunk c, as after a reduce-scatter.
			r := (c - 1 + ranks) % ranks
			own[r] = append(own[r], [2]int{at, end})
			at = end
		}
	}
	for r := range own { // ascending
		for i := 1; i < len(own[r]); i++ {
			for j := i; j > 0 && own[r][j][0] < own[r][j-1][0]; j-- {
				own[r][j], own[r][j-1] = own[r][j-1], own[r][j]
			}
		}
	}
	return own
}

func shardParams(dt tensor.Dtype, seed uint64) []*tensor.Dense {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]*tensor.Dense, len(shardShapes))
	for i, s := range shardShapes {
		out[i] = tensor.New(tensor.Of(dt), tensor.WithShape(s...))
		fillRandom(out[i], rng)
	}
	return out
}

func fillRandom(t *tensor.Dense, rng *rand.Rand) {
	switch d := t.Data().(type) {
	case []float32:
		for i := range d {
			d[i] = float32(rng.NormFloat64())
		}
	case []float64:
		for i := range d {
			d[i] = rng.NormFloat64()
		}
	}
}

func totalElems() int {
	n := 0
	for _, s := range shardShapes {
		n += s.TotalSize()
	}
	return n
}

// TestShardedStepsMatchWhole: R optimizers, each owning a ring's share of
// the elements and updating it, with the owned elements passed round after
// each step, give the parameters the bits one whole optimizer gives them,
// for 2, 3 and 4 shards, one bucket or many, float32 and float64, with
// workers sharing the large parameter; and each keeps 1/R of the state.
func TestShardedStepsMatchWhole(t *testing.T) {
	n := totalElems()
	for _, c := range shardSpecs {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			for _, g := range []struct{ ranks, bucket int }{{2, n}, {3, 10007}, {4, 4096}} {
				shardedMatchesWhole(t, c, dt, g.ranks, g.bucket)
			}
		}
	}
}

func shardedMatchesWhole(t *testing.T, c Spec, dt tensor.Dtype, ranks, bucket int) {
	t.Helper()
	whole, err := NewNamed(c, dt, shardNames, shardShapes)
	if err != nil {
		t.Fatal(err)
	}
	whole.SetWorkers(3)
	want := shardParams(dt, 1)
	own := cuts(totalElems(), bucket, ranks)
	shards := make([]*Optimizer, ranks)
	params := make([][]*tensor.Dense, ranks)
	for r := range shards {
		if shards[r], err = NewNamed(c, dt, shardNames, shardShapes); err != nil {
			t.Fatal(err)
		}
		if err := shards[r].Shard(own[r]); err != nil {
			t.Fatal(err)
		}
		shards[r].SetWorkers(2)
		params[r] = shardParams(dt, 1)
	}
	for step := range 4 {
		gw := shardParams(dt, uint64(100+step))
		if err := whole.Step(want, gw); err != nil {
			t.Fatal(err)
		}
		for r := range shards {
			gs := shardParams(dt, uint64(100+step))
			if err := shards[r].Step(params[r], gs); err != nil {
				t.Fatal(err)
			}
			for i, g := range gs {
				if !allZero(g) {
					t.Fatalf("%s: shard %d left gradient %d unzeroed", c.Name, r, i)
				}
			}
		}
		gatherOwned(params, own)
	}
	for r := range params {
		for i := range want {
			if !sameTensorBits(want[i], params[r][i]) {
				t.Fatalf("%s %v, %d shards in buckets of %d: replica %d's parameter %d differs from the whole optimizer's", c.Name, dt, ranks, bucket, r, i)
			}
		}
	}
	if len(whole.SlotNames()) == 0 {
		return
	}
	for r, s := range shards {
		// Each shard's state is its share of the elements, within a chunk
		// per bucket of 1/R.
		got, full := s.StateBytes(), whole.StateBytes()
		buckets := (totalElems() + bucket - 1) / bucket
		slack := int64(buckets * len(whole.SlotNames()) * dtSize(dt))
		if d := got - full/int64(ranks); d > slack || d < -slack {
			t.Errorf("%s %v: shard %d of %d keeps %d bytes of state, the whole %d", c.Name, dt, r, ranks, got, full)
		}
	}
}

func dtSize(dt tensor.Dtype) int {
	if dt == tensor.Float64 {
		return 8
	}
	return 4
}

// gatherOwned gives every replica each owner's elements, as the weights'
// all-gather does.
func gatherOwned(params [][]*tensor.Dense, own [][][2]int) {
	for r := range params {
		for _, rg := range own[r] {
			off := 0
			for i := range params[r] {
				n := params[r][i].Shape().TotalSize()
				lo, hi := max(rg[0], off), min(rg[1], off+n)
				for q := range params {
					if q != r && lo < hi {
						copyRange(params[q][i], params[r][i], lo-off, hi-off)
					}
				}
				off += n
			}
		}
	}
}

func copyRange(dst, src *tensor.Dense, lo, hi int) {
	switch d := dst.Data().(type) {
	case []float32:
		copy(d[lo:hi], src.Data().([]float32)[lo:hi])
	case []float64:
		copy(d[lo:hi], src.Data().([]float64)[lo:hi])
	}
}

func allZero(t *tensor.Dense) bool {
	switch d := t.Data().(type) {
	case []float32:
		for _, x := range d {
			if x != 0 {
				return false
			}
		}
	case []float64:
		for _, x := range d {
			if x != 0 {
				return false
			}
		}
	}
	return true
}

func sameTensorBits(a, b *tensor.Dense) bool {
	switch x := a.Data().(type) {
	case []float32:
		y := b.Data().([]float32)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
	case []float64:
		y := b.Data().([]float64)
		for i := range x {
			if math.Float64bits(x[i]) != math.Float64bits(y[i]) {
				return false
			}
		}
	}
	return true
}

// TestShardStateMovesToAnotherShape: the state a set of shards exports
// into whole tensors is the whole optimizer's, and shards of another count
// that import it continue with the whole optimizer's bits (re-sharding a
// checkpoint).
func TestShardStateMovesToAnotherShape(t *testing.T) {
	c := shardSpecs[0]
	dt := tensor.Float32
	n := totalElems()
	whole, _ := NewNamed(c, dt, shardNames, shardShapes)
	want := shardParams(dt, 1)
	own3 := cuts(n, 5000, 3)
	shards, params := make([]*Optimizer, 3), make([][]*tensor.Dense, 3)
	for r := range shards {
		shards[r], _ = NewNamed(c, dt, shardNames, shardShapes)
		if err := shards[r].Shard(own3[r]); err != nil {
			t.Fatal(err)
		}
		params[r] = shardParams(dt, 1)
	}
	for step := range 2 {
		if err := whole.Step(want, shardParams(dt, uint64(100+step))); err != nil {
			t.Fatal(err)
		}
		for r := range shards {
			if err := shards[r].Step(params[r], shardParams(dt, uint64(100+step))); err != nil {
				t.Fatal(err)
			}
		}
		gatherOwned(params, own3)
	}
	// Export every shard's state into whole tensors: the whole optimizer's.
	state := map[string][]*tensor.Dense{}
	for _, name := range whole.SlotNames() {
		for i, s := range shardShapes {
			full := tensor.New(tensor.Of(dt), tensor.WithShape(s...))
			for _, o := range shards {
				if err := o.ExportSlot(name, i, full); err != nil {
					t.Fatal(err)
				}
			}
			w, _ := whole.Slot(name, i)
			if !sameTensorBits(w, full) {
				t.Fatalf("slot %s of parameter %d: the shards' export differs from the whole state", name, i)
			}
			state[name] = append(state[name], full)
		}
	}
	// Two shards take the state over and go on.
	own2 := cuts(n, 7000, 2)
	next, nparams := make([]*Optimizer, 2), make([][]*tensor.Dense, 2)
	for r := range next {
		next[r], _ = NewNamed(c, dt, shardNames, shardShapes)
		if err := next[r].Shard(own2[r]); err != nil {
			t.Fatal(err)
		}
		next[r].SetSteps(shards[0].Steps())
		for _, name := range next[r].SlotNames() {
			for i := range shardShapes {
				if err := next[r].ImportSlot(name, i, state[name][i]); err != nil {
					t.Fatal(err)
				}
			}
		}
		nparams[r] = params[0]
		if r > 0 {
			nparams[r] = cloneAll(params[0])
		}
	}
	for step := 2; step < 4; step++ {
		if err := whole.Step(want, shardParams(dt, uint64(100+step))); err != nil {
			t.Fatal(err)
		}
		for r := range next {
			if err := next[r].Step(nparams[r], shardParams(dt, uint64(100+step))); err != nil {
				t.Fatal(err)
			}
		}
		gatherOwned(nparams, own2)
	}
	for r := range nparams {
		for i := range want {
			if !sameTensorBits(want[i], nparams[r][i]) {
				t.Fatalf("re-sharded replica %d's parameter %d differs from the whole optimizer's", r, i)
			}
		}
	}
}

func cloneAll(ts []*tensor.Dense) []*tensor.Dense {
	out := make([]*tensor.Dense, len(ts))
	for i, x := range ts {
		out[i] = x.Clone().(*tensor.Dense)
	}
	return out
}

// TestShardRefusesBadRanges: ranges out of order or past the parameters,
// and sharding twice or after a step, are errors; a sharded optimizer
// refuses Slot, which would hand out a whole buffer it does not keep.
func TestShardRefusesBadRanges(t *testing.T) {
	c := shardSpecs[0]
	n := totalElems()
	for _, own := range [][][2]int{{{10, 20}, {5, 8}}, {{0, n + 1}}, {{4, 2}}} {
		o, _ := NewNamed(c, tensor.Float32, shardNames, shardShapes)
		if err := o.Shard(own); err == nil {
			t.Errorf("Shard(%v) accepted", own)
		}
	}
	o, _ := NewNamed(c, tensor.Float32, shardNames, shardShapes)
	if err := o.Shard([][2]int{{0, 10}}); err != nil {
		t.Fatal(err)
	}
	if err := o.Shard([][2]int{{0, 10}}); err == nil {
		t.Error("sharded twice")
	}
	if _, err := o.Slot("m", 0); err == nil {
		t.Error("Slot of a sharded optimizer")
	}
	if got := o.StateBytes(); got != 2*10*4 {
		t.Errorf("a shard of 10 float32 elements keeps %d bytes of Adam state, want 80", got)
	}
}

// TestShardedStateMemory measures the heap an optimizer's state takes after
// a step: a shard of 1/R of the elements takes 1/R of the whole state's
// memory (Adam's two moments of 4M float32 elements: 32 MiB whole), as
// StateBytes reports, and never allocates the whole state on the way.
func TestShardedStateMemory(t *testing.T) {
	const n = 4 << 20
	shapes := []tensor.Shape{{n}}
	params := []*tensor.Dense{tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(n))}
	grads := []*tensor.Dense{tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(n))}
	spec := shardSpecs[1] // adam
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	grown := func(own [][2]int) (int64, int64, int64) {
		before := heap()
		o, err := New(spec, tensor.Float32, shapes)
		if err != nil {
			t.Fatal(err)
		}
		if own != nil {
			if err := o.Shard(own); err != nil {
				t.Fatal(err)
			}
		}
		var peak runtime.MemStats
		if err := o.Step(params, grads); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&peak) // before any collection: what was allocated
		after := heap()
		runtime.KeepAlive(o)
		return after - before, int64(peak.TotalAlloc), o.StateBytes()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	start := int64(m.TotalAlloc)
	whole, total, reported := grown(nil)
	allocated := total - start
	const wholeBytes = 2 * 4 * n
	if reported != wholeBytes || whole < wholeBytes*9/10 || whole > wholeBytes*11/10 {
		t.Fatalf("the whole state: heap grew %d bytes, StateBytes %d; want %d", whole, reported, wholeBytes)
	}
	t.Logf("whole Adam state of %d float32 elements: heap +%d bytes (allocated %d)", n, whole, allocated)
	for _, R := range []int{2, 4} {
		runtime.ReadMemStats(&m)
		start := int64(m.TotalAlloc)
		got, total, reported := grown(cuts(n, 1<<20, R)[0])
		t.Logf("1/%d shard: heap +%d bytes, allocated %d, StateBytes %d", R, got, total-start, reported)
		want := int64(wholeBytes / R)
		if reported != want || got < want*9/10 || got > want*11/10 {
			t.Errorf("1/%d shard: heap grew %d bytes, StateBytes %d; want %d", R, got, reported, want)
		}
		if total-start > want*11/10 {
			t.Errorf("1/%d shard: %d bytes allocated on the way to a state of %d: the whole state was made", R, total-start, want)
		}
	}
}
