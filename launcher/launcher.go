// Package launcher starts one pipetrain stage process per stage of a config on this
// machine (per stage and replica with data_parallel, in grid rank order) and supervises them: it prefixes and saves their output, stops them all
// when one fails or when the user interrupts, and reports which stage failed first.
package launcher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/runlog"
)

// Options describe one launch.
type Options struct {
	Binary     string // the pipetrain executable to run each stage with
	ConfigPath string
	Stages     int
	// Replicas is the config's data_parallel: each stage runs this many
	// processes (0 and 1: one).
	Replicas int
	RunDir   string
	// ExtraArgs are passed to every stage (e.g. --steps), so all agree.
	ExtraArgs []string
	// Env is added to every stage's environment (NAME=value).
	Env []string
	// Out receives every stage's output, each line prefixed with "[stage i] ".
	Out io.Writer
	// Grace is how long stages get to exit after SIGTERM before SIGKILL.
	Grace time.Duration
	// Decorate, if set, may rewrite a stage's output line before it is shown
	// (not in the stage's log file), e.g. to add the live bubble to progress.
	Decorate func(stage int, line string) string
	// Resume has every stage continue from the run's newest complete checkpoint;
	// stage logs are then appended to, not replaced.
	Resume bool
	// Attempt numbers restarts (0 for the first run) in the stage logs.
	Attempt int
	// QueryTimeout is how long stages get to answer a status query after a
	// failure; default 1s. A stage that does not answer is stopped or hung.
	QueryTimeout time.Duration
	// PauseTimeout is how long stages get to answer the pause request of an
	// interrupt (default 3s), StopTimeout how long they then get to reach
	// the agreed step, write its checkpoint and exit (default 2m); past
	// either, every stage is stopped at once.
	PauseTimeout, StopTimeout time.Duration
	// Expendable, if set, says whether the run goes on without a replica
	// whose process fails (a worker of async parameter servers): its other
	// processes are stopped, rank 0 is told to wait for none of its logs,
	// and Run succeeds if every other process does.
	Expendable func(replica int) bool
	// Rejoin, if set beside Expendable, restarts an expendable replica
	// whose process failed rather than going on without it (a worker of
	// async parameter servers, which rejoins the run): once its other
	// processes have stopped, each of the replica's processes starts again
	// with RejoinFlag and the step Rejoin returns, and when they ask
	// (RejoinAsk) all are told the step Rejoin returns then. A replica is
	// restarted at most Rejoins times; after that, when Rejoin returns an
	// error (why not) or once replica 0 has finished, the run goes on
	// without it.
	Rejoin  func(replica int) (step int, err error)
	Rejoins int
	// rejoin numbers a restarted replica's restarts, in its processes' logs,
	// and rejoinStep answers their asks.
	rejoin     int
	rejoinStep func() int
}

func (o Options) queryTimeout() time.Duration {
	if o.QueryTimeout > 0 {
		return o.QueryTimeout
	}
	return time.Second
}

// StageError is the first stage failure of a launch. Stage is the stage to
// blame: the one that failed, or, when that one gave up waiting, the stage at
// the end of the chain of waits, which stopped making progress (Hung).
type StageError struct {
	Stage int
	// Replica is the blamed stage's replica, when Replicas > 1.
	Replica, Replicas int
	Err               error
	LastLine          string
	// Reason is the process's own account of its failure: its error line
	// (without "pipetrain: "), or its panic's first line and frame; "" when
	// its output gave none, and LastLine is all there is.
	Reason string
	// RepeatsWhy says why a restart would fail the same way, when the
	// process said so (see FormatRepeats): "ran out of disk space in runs/x".
	RepeatsWhy string
	// Hung is set when Stage did not fail but stopped making progress; Why
	// says how that was found and Detector is the stage that failed.
	Hung     bool
	Why      string
	Detector int
	// DetectorReplica is the failed process's replica.
	DetectorReplica int
}

func (e *StageError) Error() string {
	name := processName(e.Stage, e.Replica, e.Replicas)
	if e.Hung {
		return fmt.Sprintf("%s stopped making progress: %s; %s failed %s",
			name, e.Why, processName(e.Detector, e.DetectorReplica, e.Replicas), e.said())
	}
	if e.Reason == "" && e.LastLine == "" {
		return fmt.Sprintf("%s failed: %v", name, e.Err)
	}
	return fmt.Sprintf("%s failed %s", name, e.said())
}

// said is the failed process's exit status and what it said on failing.
func (e *StageError) said() string {
	if e.Reason != "" {
		return fmt.Sprintf("(%v): %s", e.Err, e.Reason)
	}
	return fmt.Sprintf("(%v); its last output: %s", e.Err, e.LastLine)
}

// processName names a stage process: "stage 2", or "stage 2 replica 1".
func processName(stage, replica, replicas int) string {
	if replicas > 1 {
		return fmt.Sprintf("stage %d replica %d", stage, replica)
	}
	return fmt.Sprintf("stage %d", stage)
}

func (e *StageError) Unwrap() error { return e.Err }

// ExitRepeats is the exit status of a stage process that failed in a way a
// restart from a checkpoint would only repeat: its disk is full, its data are
// bad, a value became NaN or infinite, its config was refused, its replicas
// diverged. It prints why with FormatRepeats.
const ExitRepeats = 3

// Repeats reports whether the failed process said a restart would repeat
// its failure (it exited with ExitRepeats).
func (e *StageError) Repeats() bool {
	var ee *exec.ExitError
	return errors.As(e.Err, &ee) && ee.ExitCode() == ExitRepeats
}

// Process names the blamed process: "stage 2", or "stage 2 replica 1".
func (e *StageError) Process() string { return processName(e.Stage, e.Replica, e.Replicas) }

type child struct {
	stage    int
	replica  int
	replicas int
	cmd      *exec.Cmd
	done     chan struct{}
	err      error
	last     string // last output line
	reason   reason // what the stage said on failing, if it did
	repeats  string // why a restart would fail the same way (FormatRepeats), if it said
	exitedAt time.Time
	// status is the stage's latest answer to a status query (or the one it
	// printed on failing); fresh is set when it came after the latest query.
	status    Status
	hasStatus bool
	fresh     bool
	// control is the write end of the stage's standard input, which
	// carries an interrupt's pause and stop requests; pauseStep is its
	// answer to the latest pause request, once pauseAnswered.
	control       *os.File
	pauseStep     int
	pauseAnswered bool
	mu            sync.Mutex
}

// Run starts the stages and waits for all of them. It returns nil only when every
// stage exited cleanly. Cancelling ctx stops every stage (SIGTERM, then SIGKILL after
// Grace) and returns ctx's cause; when the cause is ErrInterrupted, the stages
// first get to stop together at a step boundary with a checkpoint there
// (interrupt), and the error is an *Interrupted.
func Run(ctx context.Context, o Options) error {
	if o.Grace == 0 {
		o.Grace = 5 * time.Second
	}
	logDir := filepath.Join(o.RunDir, "logs")
	if err := runlog.MkdirAll(logDir); err != nil {
		return err
	}
	var outMu sync.Mutex
	var children []*child
	replicas := max(o.Replicas, 1)
	// Room for every process a run may start, restarts included, so that
	// no watcher blocks on a failure nobody reads any more.
	failed := make(chan *child, o.Stages*replicas+o.Stages*(replicas-1)*max(o.Rejoins, 0))
	for rank := 0; rank < o.Stages*replicas; rank++ {
		i, r := rank/replicas, rank%replicas
		c, err := start(o, i, r, logDir, &outMu)
		if err != nil {
			stopAll(children, o.Grace)
			return fmt.Errorf("starting %s: %w", processName(i, r, replicas), err)
		}
		children = append(children, c)
		c.report(failed)
	}
	allDone := watchAll(children)
	lost := map[int]bool{} // the expendable replicas given up on
	rj := newRejoins(replicas)
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(o.Out, "pipetrain: "+format+"\n", args...)
	}
	loseAll := func(replica int) {
		for i := range o.Stages {
			children[0].request(fmt.Sprintf("%s%d", lostNotice, i*replicas+replica))
		}
	}
	for {
		select {
		case <-allDone:
			// Every stage has exited: the failures, if any, are all known.
			// A replica still to be restarted has nothing left to rejoin.
			for r := range rj.restarting {
				lost[r] = true
			}
			if c := firstFailed(kept(children, lost)); c != nil {
				return blame(c, children, o.queryTimeout())
			}
			return nil
		case c := <-failed:
			if children[c.stage*replicas+c.replica] != c || rj.restarting[c.replica] {
				continue // a process of a replica being restarted
			}
			if !o.expendable(c.replica, lost, replicas) {
				return o.failed(c, children, failed)
			}
			if !lost[c.replica] {
				c = replicaCulprit(c, failed)
			}
			if !lost[c.replica] && o.Rejoin != nil && rj.count[c.replica] < o.Rejoins {
				rj.begin(c.replica)
				say("%v; restarting replica %d to rejoin the run (restart %d of %d)", c.stageError(), c.replica, rj.count[c.replica], o.Rejoins)
				go rj.stopThenRestart(slices.Clone(children), c.replica, o.Grace)
				continue
			}
			if !lost[c.replica] {
				lost[c.replica] = true
				why := ""
				if o.Rejoin != nil {
					why = fmt.Sprintf(" (restarted %s already, the most allowed)", words.Count(rj.count[c.replica], "time"))
				}
				say("%v; the run goes on without replica %d%s", c.stageError(), c.replica, why)
				go loseReplica(slices.Clone(children), c.replica, o.Grace)
			}
			children[0].request(fmt.Sprintf("%s%d", lostNotice, c.stage*replicas+c.replica))
		case r := <-rj.stopped:
			delete(rj.restarting, r)
			if err := o.restartReplica(children, r, rj.count[r], logDir, &outMu, failed); err != nil {
				lost[r] = true
				say("replica %d is not restarted: %v; the run goes on without it", r, err)
				loseAll(r)
				continue
			}
			allDone = watchAll(children)
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), ErrInterrupted) {
				return interrupt(ctx, o, children, allDone, failed, say)
			}
			stopAll(children, o.Grace)
			return context.Cause(ctx)
		}
	}
}

// expendable says whether the run may go on without replica: Expendable
// says so and another replica is left.
func (o Options) expendable(replica int, lost map[int]bool, replicas int) bool {
	if o.Expendable == nil || !o.Expendable(replica) {
		return false
	}
	return lost[replica] || len(lost)+1 < replicas
}

// kept are the children not of a lost replica.
func kept(children []*child, lost map[int]bool) []*child {
	var out []*child
	for _, c := range children {
		if !lost[c.replica] {
			out = append(out, c)
		}
	}
	return out
}

// loseReplica gives replica's other processes a moment to notice that one
// of theirs died, then stops those still running.
func loseReplica(children []*child, replica int, grace time.Duration) {
	var mine []*child
	for _, c := range children {
		if c.replica == replica {
			mine = append(mine, c)
		}
	}
	settle(mine, lostPeerGrace)
	stopAll(mine, grace)
}

// failed stops the run after c failed and blames the stage that caused it.
func (o Options) failed(c *child, children []*child, failed <-chan *child) error {
	c = culprit(c, failed)
	err := blame(c, children, o.queryTimeout())
	if c.signaled() {
		// Its neighbours see their links to it close at once: let them
		// fail by themselves, naming the stage they lost, rather than be
		// stopped first with a bare "terminated".
		settle(children, lostPeerGrace)
	}
	stopAll(children, o.Grace)
	return err
}

// culprit picks the stage to blame among those failing together. When a stage is
// killed its neighbours fail within moments, complaining about it, and any of them
// may be reaped first: a stage that died of a signal the launcher did not send is
// the cause, so failures are gathered briefly and such a stage is preferred.
func culprit(first *child, failed <-chan *child) *child {
	if first.signaled() {
		return first
	}
	timeout := time.After(300 * time.Millisecond)
	for {
		select {
		case c := <-failed:
			if c.signaled() {
				return c
			}
		case <-timeout:
			return first
		}
	}
}

// replicaCulprit is culprit among the processes of first's replica: the
// others' failures it meets meanwhile are put back for the launch's loop.
func replicaCulprit(first *child, failed chan *child) *child {
	if first.signaled() {
		return first
	}
	var others []*child
	defer func() {
		for _, c := range others {
			failed <- c // room: each was taken from failed just now
		}
	}()
	timeout := time.After(300 * time.Millisecond)
	for {
		select {
		case c := <-failed:
			if c.replica == first.replica && c.signaled() {
				others = append(others, first)
				return c
			}
			others = append(others, c)
		case <-timeout:
			return first
		}
	}
}

// firstFailed is the failed process to start the search for a culprit from
// once every process has exited: one killed by a signal, else the one that
// exited first; nil when none failed.
func firstFailed(children []*child) *child {
	var first *child
	for _, c := range children {
		if c.exitErr() == nil {
			continue
		}
		if c.signaled() {
			return c
		}
		if first == nil || c.exitedAt.Before(first.exitedAt) {
			first = c
		}
	}
	return first
}

// lostPeerGrace is how long stages get to notice a killed neighbour themselves.
const lostPeerGrace = time.Second

// settle waits until every stage has exited or d has passed.
func settle(children []*child, d time.Duration) {
	deadline := time.After(d)
	for _, c := range children {
		select {
		case <-c.done:
		case <-deadline:
			return
		}
	}
}

// signaled reports whether the stage process was ended by a signal.
func (c *child) signaled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled()
		}
	}
	return false
}

func (c *child) stageError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &StageError{Stage: c.stage, Replica: c.replica, Replicas: c.replicas, Err: c.err, LastLine: c.last,
		Reason: c.reason.String(), RepeatsWhy: c.repeats}
}

// LogFile is the name of a stage process's log under RUN_DIR/logs.
func LogFile(stage, replica, replicas int) string {
	if replicas > 1 {
		return fmt.Sprintf("stage-%d.replica-%d.log", stage, replica)
	}
	return fmt.Sprintf("stage-%d.log", stage)
}

func start(o Options, i, r int, logDir string, outMu *sync.Mutex) (*child, error) {
	replicas := max(o.Replicas, 1)
	args := []string{"stage", "--config", o.ConfigPath, "--stage", strconv.Itoa(i), "--run-dir", o.RunDir}
	if replicas > 1 {
		args = append(args, "--replica", strconv.Itoa(r))
	}
	args = append(args, o.ExtraArgs...)
	if o.Resume {
		args = append(args, "--resume")
	}
	args = append(args, ControlFlag)
	cmd := exec.Command(o.Binary, args...)
	cmd.Env = append(os.Environ(), o.Env...)
	// Own process group: a terminal's Ctrl-C reaches only the launcher, which then
	// stops the stages itself. Pdeathsig: stages die with the launcher even if it
	// is killed with SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	controlR, controlW, err := os.Pipe()
	if err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	cmd.Stdin = controlR
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if o.Resume || o.rejoin > 0 {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, LogFile(i, r, replicas)), flags, runlog.FileMode())
	switch {
	case err != nil:
	case o.rejoin > 0:
		_, err = fmt.Fprintf(logFile, "--- replica %d restarted (restart %d), rejoining the run ---\n", r, o.rejoin)
	case o.Attempt > 0:
		_, err = fmt.Fprintf(logFile, "--- restart %d, resuming from the newest complete checkpoint ---\n", o.Attempt)
	}
	if err != nil {
		pr.Close()
		pw.Close()
		controlR.Close()
		controlW.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		controlR.Close()
		controlW.Close()
		logFile.Close()
		return nil, err
	}
	pw.Close()
	controlR.Close()
	c := &child{stage: i, replica: r, replicas: replicas, cmd: cmd, done: make(chan struct{}), control: controlW}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer logFile.Close()
		s := bufio.NewScanner(pr)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		prefix := "[" + processName(i, r, replicas) + "] "
		for s.Scan() {
			line := s.Text()
			fmt.Fprintln(logFile, line)
			if st, ok := ParseStatus(line); ok {
				c.mu.Lock()
				c.status, c.hasStatus, c.fresh = st, true, true
				c.mu.Unlock()
				continue
			}
			if step, ok := parsePauseAnswer(line); ok {
				c.mu.Lock()
				c.pauseStep, c.pauseAnswered = step, true
				c.mu.Unlock()
				continue
			}
			if why, ok := parseRepeats(line); ok {
				c.mu.Lock()
				c.repeats = why
				c.mu.Unlock()
				continue
			}
			if line == RejoinAsk && o.rejoinStep != nil {
				c.request(fmt.Sprintf("%s%d", rejoinAnswer, o.rejoinStep()))
				continue
			}
			c.mu.Lock()
			c.last = line
			c.reason.add(line)
			c.mu.Unlock()
			shown := line
			if o.Decorate != nil {
				shown = o.Decorate(i, line)
			}
			outMu.Lock()
			fmt.Fprintln(o.Out, prefix+shown)
			outMu.Unlock()
		}
		pr.Close()
	}()
	go func() {
		err := cmd.Wait()
		exited := time.Now()
		// Anything the stage left behind in its process group would hold the
		// output pipe open; nothing of a finished stage may outlive it.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-copied
		controlW.Close()
		c.mu.Lock()
		c.err, c.exitedAt = err, exited
		c.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// stopAll asks every running stage to stop, then kills what is left after grace.
func stopAll(children []*child, grace time.Duration) {
	for _, c := range children {
		select {
		case <-c.done:
		default:
			c.cmd.Process.Signal(syscall.SIGTERM)
			// A stopped (hung) stage handles SIGTERM only once continued.
			c.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	deadline := time.After(grace)
	for _, c := range children {
		select {
		case <-c.done:
		case <-deadline:
			for _, k := range children {
				select {
				case <-k.done:
				default:
					// Kill the whole group, in case the stage started helpers.
					syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
				}
			}
			for _, k := range children {
				<-k.done
			}
			return
		}
	}
}

// ErrInterrupted is the cause used when the user stops a launch.
var ErrInterrupted = errors.New("interrupted")
