package stages

import (
	"context"
	"errors"
	"sync"
)

// ErrPaused ends a stage that stopped at the step its launcher named, after
// writing the checkpoint of that step.
var ErrPaused = errors.New("the launch was interrupted")

// Pause is a stage's side of a graceful stop (launch's first Ctrl-C). The
// stages train in lock-step: a stage cannot finish step k unless every other
// stage takes part in it, so stages that stopped at different step
// boundaries would wait for each other for ever. The stop therefore takes
// two rounds. Asked to pause, a stage answers with the boundary it will
// reach without starting another step (the steps it has started) and starts
// none past it; the launcher takes the largest answer S over every process
// and names it (StopAfter); every stage then trains through step S, which
// each can since no stage stops short of S, and stops there.
type Pause struct {
	mu sync.Mutex
	// changed is closed, and replaced, whenever the stop step becomes known.
	changed chan struct{}
	// started counts the steps the stage has started: the boundary it
	// reaches without starting another. -1 until its step loop begins.
	started int
	asked   bool
	stop    int // the step to stop after; -1 until the launcher names it
	// lost are the ranks the launcher saw die while the run goes on
	// without them, until excuse (rank 0's registry's) takes them.
	lost   []int
	excuse func(rank int)
	// rejoin carries the launcher's answer to a rejoining process's ask:
	// the step it rejoins at.
	rejoin chan int
}

// NewPause is the pause state of a stage that has not been asked to pause.
func NewPause() *Pause {
	return &Pause{changed: make(chan struct{}), started: -1, stop: -1, rejoin: make(chan int, 1)}
}

// Rejoin takes the launcher's answer to a rejoining process's ask
// (launcher.RejoinAsk): the step it rejoins at. Only the first is kept.
func (p *Pause) Rejoin(step int) {
	select {
	case p.rejoin <- step:
	default:
	}
}

// RejoinStep waits for the launcher's answer (Rejoin).
func (p *Pause) RejoinStep(ctx context.Context) (int, error) {
	select {
	case step := <-p.rejoin:
		return step, nil
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
}

// Ask records a pause request and returns the step boundary the stage
// reaches without starting another step, or -1 when its step loop has not
// begun (it then starts no step before StopAfter).
func (p *Pause) Ask() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = true
	return p.started
}

// StopAfter names the step every stage stops after.
func (p *Pause) StopAfter(step int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop >= 0 {
		return // named once; a repeat must not move it
	}
	p.asked, p.stop = true, step
	close(p.changed)
	p.changed = make(chan struct{})
}

// verdict is what a stage does at the start of a step.
type verdict int

const (
	startStep verdict = iota // train it
	waitStep                 // wait for the stop step
	stopHere                 // stop: every step up to the stop step is done
)

// gate decides whether step (counted from 0) may start, given whether a
// pause was asked for and the stop step (-1 while unknown). Once asked, a
// stage starts nothing until it knows the stop step: the step it is in, or
// has just finished, is the boundary it promised.
func gate(asked bool, stop, step int) verdict {
	switch {
	case !asked:
		return startStep
	case stop < 0:
		return waitStep
	case step < stop:
		return startStep
	}
	return stopHere
}

// begin records that the step loop starts at step first.
func (p *Pause) begin(first int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started = first
}

// enter is the step loop's gate before step: it waits while the stage is
// paused with no stop step, and reports whether the stage must stop instead
// of starting step. A stage with no Pause (nil) never stops here.
func (p *Pause) enter(ctx context.Context, step int) (stop bool, err error) {
	if p == nil {
		return false, nil
	}
	for {
		p.mu.Lock()
		v, changed := gate(p.asked, p.stop, step), p.changed
		if v == startStep {
			p.started = step + 1
		}
		p.mu.Unlock()
		switch v {
		case startStep:
			return false, nil
		case stopHere:
			return true, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false, context.Cause(ctx)
		}
	}
}

// Lose records that the launcher saw rank's process die while the run goes
// on without it (a worker of async parameter servers): rank 0 then waits
// for none of its logs at the end.
func (p *Pause) Lose(rank int) {
	p.mu.Lock()
	excuse := p.excuse
	if excuse == nil {
		p.lost = append(p.lost, rank)
	}
	p.mu.Unlock()
	if excuse != nil {
		excuse(rank)
	}
}

// onLost hands the lost ranks, those told so far and those to come, to
// excuse.
func (p *Pause) onLost(excuse func(rank int)) {
	p.mu.Lock()
	lost := p.lost
	p.lost, p.excuse = nil, excuse
	p.mu.Unlock()
	for _, r := range lost {
		excuse(r)
	}
}
