package stages

import (
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/schedule"
)

// feed supplies the ends of the pipeline from the dataset's source: the first
// stage's inputs and the last stage's targets, for training steps and
// evaluation passes. Both ends derive the same batch from (seed, step) alone,
// so targets never cross the wire.
//
// A source is used by one goroutine at a time (data.Source), but a stage
// reads its next forward's data on a goroutine of its own (fetch) while the
// training goroutine computes, and under a V its first chunk's inputs and its
// last chunk's targets come from the one source: mu serializes every call,
// training and evaluation alike, in every copy of the feed.
type feed struct {
	src data.Source
	mu  *sync.Mutex
}

// openFeed asks the registry for the source of the config's dataset: a stage
// holding the model's first stage loads its inputs, one holding its last the
// targets; data handed in by Options is used as it is.
func (r *Runtime) openFeed(o Options, model *data.Model) (feed, error) {
	src, err := data.Open(r.cfg.DataSection(), model, data.OpenOptions{
		Inputs: r.holdsFirst(), Targets: r.holdsLoss(),
		Train: o.Train, Test: o.Test, Text: o.Text,
	})
	return feed{src: src, mu: new(sync.Mutex)}, err
}

// inputs is x's buffer for the source; empty when x is nil.
func inputs(x *tensor.Dense) data.Inputs {
	if x == nil {
		return data.Inputs{}
	}
	switch d := x.Data().(type) {
	case []float32:
		return data.Inputs{F32: d}
	case []float64:
		return data.Inputs{F64: d}
	}
	return data.Inputs{}
}

// train fills x (first stage; nil elsewhere) with micro-batch mb of step and
// returns its targets (last stage; nil elsewhere).
func (f feed) train(step, mb int, x *tensor.Dense, wantTargets bool) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.src.Train(step, mb, inputs(x), wantTargets)
}

// evalBatches is the number of micro-batches in one evaluation pass.
func (f feed) evalBatches() int { return f.src.EvalBatches() }

// eval fills x with evaluation micro-batch k and returns its targets and how
// many of its rows are real (the rest padding). A read the stage started for
// the next training step may still be in progress: eval waits for it.
func (f feed) eval(k int, x *tensor.Dense, wantTargets bool) ([]int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.src.Eval(k, inputs(x), wantTargets)
}

// name says what an evaluation reports on, for logs.
func (f feed) name() string { return f.src.EvalName() }

// dataFetch is one forward's data, read on a goroutine of its own: the
// forward's input (x, nil on a chunk that is not the model's first) and its
// targets (y, nil on one that is not its last).
type dataFetch struct {
	step int
	a    schedule.Action
	x    *tensor.Dense
	y    []int
	took time.Duration // how long the source took, once done is closed
	done chan struct{}
	// panicked is what the read panicked with, if it did (a source
	// refusing bad data it meets while reading, data.CatchBadData): the
	// forward that takes the read panics with it on the stage's goroutine,
	// where the process's recovery is.
	panicked any
}

// fetch starts reading micro-batch mb (numbered across the replicas) of step
// into x, and its targets when wantTargets is set, for forward a.
func (f feed) fetch(step int, a schedule.Action, mb int, x *tensor.Dense, wantTargets bool) *dataFetch {
	d := &dataFetch{step: step, a: a, x: x, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		defer func() { d.panicked = recover() }()
		t0 := time.Now()
		d.y = f.train(step, mb, x, wantTargets)
		d.took = time.Since(t0)
	}()
	return d
}

// fedData is what the last data-reading forward's read cost, for its event.
type fedData struct {
	a          schedule.Action
	read, wait time.Duration
}

// dataForwards lists the forwards of actions, in order, that read the feed:
// those on the model's first chunk (inputs) or its last (targets). The stage
// reads each one's data while it computes the one before it, the first of a
// step's while it finishes the step before.
func dataForwards(actions []schedule.Action, reads func(chunk int) bool) (order []schedule.Action, index map[schedule.Action]int) {
	index = map[schedule.Action]int{}
	for _, a := range actions {
		if a.Kind == schedule.Forward && reads(a.Chunk) {
			index[a] = len(order)
			order = append(order, a)
		}
	}
	return order, index
}

// takeData returns forward a's data for step: the read started for it, or,
// when none was (the first step of a run, or a read dropped), one started
// now. It then starts reading the next data-reading forward's, in this step
// or the next, and notes what a's read cost and how long the forward waited
// for it (r.fed), which its event records.
func (r *Runtime) takeData(step int, a schedule.Action) (x *tensor.Dense, y []int) {
	d := r.fetching
	r.fetching = nil
	if d == nil || d.step != step || d.a != a {
		r.dropFetch(d)
		d = r.startFetch(step, a)
	}
	t0 := time.Now()
	<-d.done
	if d.panicked != nil {
		panic(d.panicked)
	}
	r.fed = fedData{a: a, read: d.took, wait: time.Since(t0)}
	if d.x != nil {
		r.keepInput(a.MicroBatch, d.x)
	}
	r.prefetchAfter(step, a)
	return d.x, d.y
}

// prefetchAfter starts reading the data of the forward that reads it next
// after a of step, unless step is the run's last and a its last such forward.
func (r *Runtime) prefetchAfter(step int, a schedule.Action) {
	i, ok := r.dataIndex[a]
	if !ok {
		return
	}
	if i++; i == len(r.dataOrder) {
		i, step = 0, step+1
	}
	if step >= r.cfg.Train.Steps {
		return
	}
	r.fetching = r.startFetch(step, r.dataOrder[i])
}

// startFetch starts reading forward a's data for step, its input into a
// spare buffer.
func (r *Runtime) startFetch(step int, a schedule.Action) *dataFetch {
	e := r.chunk(a.Chunk)
	var x *tensor.Dense
	if e.IsFirst() {
		x = r.spareInput(e)
	}
	return r.feed.fetch(step, a, r.mbBase+a.MicroBatch, x, e.IsLast())
}

// dropFetch waits for d (nil: none) to finish and keeps its buffer as a
// spare: a read cannot be interrupted, and no goroutine of the stage may
// outlive Run.
func (r *Runtime) dropFetch(d *dataFetch) {
	if d == nil {
		return
	}
	<-d.done
	if d.x != nil {
		r.spareInputs = append(r.spareInputs, d.x)
	}
}

// stopFetching drops the read in progress, when Run returns.
func (r *Runtime) stopFetching() {
	r.dropFetch(r.fetching)
	r.fetching = nil
}
