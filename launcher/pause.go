package launcher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/runlog"
)

// An interrupted launch stops every stage at one step boundary, with a
// checkpoint there, in two rounds over each stage's standard input:
//
//	launcher -> stage   pause
//	stage -> launcher   pipetrain-pause: step=37   (the boundary it reaches without starting another step; "-": no step started yet)
//	launcher -> stage   stop 37                     (the largest answer of every process)
//
// A stage promises, with its answer, to start no step past it until told
// the stop step; since the stop step is the largest answer, no stage ever
// waits for one that stopped before it (see stages.Pause).
const (
	pauseRequest = "pause"
	stopRequest  = "stop "
	pausePrefix  = "pipetrain-pause:"
	// lostNotice tells rank 0 that the process of a rank died and the run
	// goes on without it (Options.Expendable): "lost 5".
	lostNotice = "lost "
	// rejoinAnswer tells a restarted replica's process, which asked with
	// RejoinAsk, the step it rejoins the run at: "rejoin 37".
	rejoinAnswer = "rejoin "
)

// RejoinAsk is what a restarted replica's process (Options.Rejoin) prints
// once its links are up, to learn the step it rejoins at: the launcher
// reads the step then, and gives every process of the replica the same.
const RejoinAsk = "pipetrain-rejoin: ask"

// RejoinFlag gives a restarted replica's processes the step they rejoin at
// (the launcher's reading when it starts them; they ask for a fresher one).
const RejoinFlag = "--rejoin"

// ControlFlag tells a stage process that its standard input carries the
// launcher's pause and stop requests (ServePauses).
const ControlFlag = "--launcher-control"

// ExitInterrupted is the exit status of an interrupted launch, and of a
// stage that stopped at the step its launcher named.
const ExitInterrupted = 130

func formatPauseAnswer(step int) string {
	if step < 0 {
		return pausePrefix + " step=-"
	}
	return fmt.Sprintf("%s step=%d", pausePrefix, step)
}

// parsePauseAnswer reads a stage's answer to a pause request: the step
// boundary it reaches (-1: none started) and ok for such a line.
func parsePauseAnswer(line string) (step int, ok bool) {
	rest, ok := strings.CutPrefix(line, pausePrefix)
	if !ok {
		return 0, false
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(rest), "step=")
	if !ok {
		return 0, false
	}
	if v == "-" {
		return -1, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// ServePauses serves a launcher's requests read from in (a stage's standard
// input) until it ends: a pause request is answered on out with ask's
// boundary, a stop request handed to stopAfter, a lost rank to lost, the
// step a rejoining process rejoins at to rejoin. Other lines are ignored.
func ServePauses(in io.Reader, out io.Writer, ask func() int, stopAfter func(step int), lost func(rank int), rejoin func(step int)) {
	s := bufio.NewScanner(in)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if v, ok := strings.CutPrefix(line, rejoinAnswer); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				rejoin(n)
			}
			continue
		}
		if v, ok := strings.CutPrefix(line, lostNotice); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				lost(n)
			}
			continue
		}
		if line == pauseRequest {
			fmt.Fprintln(out, formatPauseAnswer(ask()))
			continue
		}
		if v, ok := strings.CutPrefix(line, stopRequest); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				stopAfter(n)
			}
		}
	}
}

type secondInterruptKey struct{}

// WithSecondInterrupt returns ctx carrying again, closed when the user
// interrupts a second time: Run, stopping every stage at a step boundary
// after the first, then stops them at once.
func WithSecondInterrupt(ctx context.Context, again <-chan struct{}) context.Context {
	return context.WithValue(ctx, secondInterruptKey{}, again)
}

// secondInterrupt is ctx's second-interrupt channel; nil (never ready) if none.
func secondInterrupt(ctx context.Context) <-chan struct{} {
	again, _ := ctx.Value(secondInterruptKey{}).(<-chan struct{})
	return again
}

// Interrupted is the error of a launch the user interrupted. It wraps the
// interrupt's cause (ErrInterrupted) and says how to continue the run.
type Interrupted struct {
	Cause error
	// Step is the step every stage stopped after; -1 when they were
	// stopped at once, Why says why.
	Step int
	Why  string
	// Checkpoint is the step of the run's newest complete checkpoint, -1
	// when there is none.
	Checkpoint int
	RunDir     string
}

func (e *Interrupted) Unwrap() error { return e.Cause }

func (e *Interrupted) Error() string {
	var b strings.Builder
	b.WriteString(e.Cause.Error())
	if e.Step >= 0 {
		fmt.Fprintf(&b, ": every stage stopped after step %d", e.Step)
	} else {
		fmt.Fprintf(&b, ": every stage stopped at once (%s)", e.Why)
	}
	switch {
	case e.Checkpoint > 0 && e.Checkpoint == e.Step:
		fmt.Fprintf(&b, "; the checkpoint of step %d is complete", e.Checkpoint)
	case e.Checkpoint > 0 && e.Step >= 0:
		fmt.Fprintf(&b, "; its checkpoint was not committed, the newest complete one is of step %d", e.Checkpoint)
	case e.Checkpoint > 0:
		fmt.Fprintf(&b, "; the newest complete checkpoint is of step %d", e.Checkpoint)
	default:
		b.WriteString("; no checkpoint to continue from: the run must start again from step 0")
		return b.String()
	}
	fmt.Fprintf(&b, "; continue with: pipetrain launch --resume %s", e.RunDir)
	return b.String()
}

// newestCheckpoint is the step of the newest committed checkpoint in runDir
// (its manifest written once every part was in), -1 if none.
func newestCheckpoint(runDir string) int {
	manifests, _ := filepath.Glob(filepath.Join(runlog.CheckpointDir(runDir), "step-*", checkpoint.ManifestName))
	newest := -1
	for _, p := range manifests {
		if m, err := checkpoint.ReadManifest(filepath.Dir(p)); err == nil {
			newest = max(newest, m.Step)
		}
	}
	return newest
}

func (o Options) pauseTimeout() time.Duration {
	if o.PauseTimeout > 0 {
		return o.PauseTimeout
	}
	return 3 * time.Second
}

func (o Options) stopTimeout() time.Duration {
	if o.StopTimeout > 0 {
		return o.StopTimeout
	}
	return 2 * time.Minute
}

// interrupt ends a launch the user interrupted. Every stage is asked to
// pause and answers with the step boundary it reaches; all are told the
// largest, train through it, write its checkpoint and exit. A stage that
// does not answer within PauseTimeout, fails or has not stopped within
// StopTimeout, a second interrupt, or no stage having started a step, stops
// every stage at once instead. It returns nil when the agreed step was the
// run's last (the stages finished the run).
func interrupt(ctx context.Context, o Options, children []*child, allDone <-chan struct{}, failed <-chan *child, say func(string, ...any)) error {
	e := &Interrupted{Cause: context.Cause(ctx), Step: -1, RunDir: o.RunDir}
	again := secondInterrupt(ctx)
	stop, why := agreeStop(children, o.pauseTimeout(), again)
	if why == "" {
		say("interrupted: every stage stops after step %d and writes its checkpoint (interrupt again to stop at once)", stop)
		for _, c := range children {
			c.request(fmt.Sprintf("%s%d", stopRequest, stop))
		}
		why = awaitStopped(children, allDone, failed, again, o.stopTimeout())
	}
	if why != "" {
		say("interrupted: stopping every stage at once: %s", why)
		stopAll(children, o.Grace)
		e.Why = why
	} else if finished(children) {
		return nil
	} else {
		e.Step = stop
	}
	e.Checkpoint = newestCheckpoint(o.RunDir)
	return e
}

// agreeStop asks every running stage to pause and returns the largest
// boundary they answer, or why they cannot stop together.
func agreeStop(children []*child, timeout time.Duration, again <-chan struct{}) (stop int, why string) {
	for _, c := range children {
		c.mu.Lock()
		c.pauseAnswered = false
		c.mu.Unlock()
		c.request(pauseRequest)
	}
	deadline := time.After(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		stop = -1
		var silent *child
		for _, c := range children {
			step, answered := c.pauseAnswer()
			switch {
			case answered:
				stop = max(stop, step)
			case c.exited():
				if err := c.exitErr(); err != nil {
					return -1, fmt.Sprintf("%s had failed (%v)", c.name(), err)
				}
				// A stage that finished the run leaves the others at most
				// its last step to finish; it constrains nothing.
			default:
				silent = c
			}
		}
		if silent == nil {
			if stop < 0 {
				return -1, "no stage had started a step"
			}
			return stop, ""
		}
		select {
		case <-again:
			return -1, "interrupted again"
		case <-deadline:
			return -1, fmt.Sprintf("%s did not answer the pause request within %v", silent.name(), timeout)
		case <-tick.C:
		}
	}
}

// awaitStopped waits until every stage has exited as asked (or finished the
// run) and returns why not when one fails instead, the user interrupts
// again, or timeout passes.
func awaitStopped(children []*child, allDone <-chan struct{}, failed <-chan *child, again <-chan struct{}, timeout time.Duration) string {
	limit := time.After(timeout)
	for {
		select {
		case <-allDone:
			for _, c := range children {
				if !c.stoppedAsAsked() {
					return fmt.Sprintf("%s while stopping", c.stageError())
				}
			}
			return ""
		case c := <-failed:
			if !c.stoppedAsAsked() {
				return fmt.Sprintf("%s while stopping", c.stageError())
			}
		case <-again:
			return "interrupted again"
		case <-limit:
			return fmt.Sprintf("not every stage had stopped within %v", timeout)
		}
	}
}

// request writes one request line to the stage's standard input. A stage
// that has exited cannot read it; its exit speaks for it.
func (c *child) request(line string) {
	if c.control != nil {
		io.WriteString(c.control, line+"\n")
	}
}

func (c *child) pauseAnswer() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pauseStep, c.pauseAnswered
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *child) name() string { return processName(c.stage, c.replica, c.replicas) }

// stoppedAsAsked reports whether the stage exited cleanly or with
// ExitInterrupted, as a stage stopping at the agreed step does.
func (c *child) stoppedAsAsked() bool {
	err := c.exitErr()
	var ee *exec.ExitError
	return err == nil || errors.As(err, &ee) && ee.ExitCode() == ExitInterrupted
}

// finished reports whether every stage exited cleanly: the agreed step was
// the run's last, so the stages completed it.
func finished(children []*child) bool {
	for _, c := range children {
		if c.exitErr() != nil {
			return false
		}
	}
	return true
}
