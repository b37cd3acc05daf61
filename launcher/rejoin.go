package launcher

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// A replica that Options.Rejoin restarts goes through three moments: one of
// its processes fails; its other processes get lostPeerGrace to notice and
// are then stopped (their failures are of its former life, and ignored);
// once all have exited, each is started again with the rejoin arguments,
// in its old place among the children.

// rejoins tracks the restarts of a launch's replicas.
type rejoins struct {
	count      []int        // restarts so far, by replica
	restarting map[int]bool // replicas whose old processes are being stopped
	stopped    chan int     // a replica whose old processes have all exited
}

func newRejoins(replicas int) *rejoins {
	return &rejoins{count: make([]int, replicas), restarting: map[int]bool{}, stopped: make(chan int, replicas)}
}

// begin counts a restart of replica.
func (rj *rejoins) begin(replica int) {
	rj.count[replica]++
	rj.restarting[replica] = true
}

// stopThenRestart stops replica's processes as loseReplica does, then
// hands the replica to the launch's loop to start again.
func (rj *rejoins) stopThenRestart(children []*child, replica int, grace time.Duration) {
	loseReplica(children, replica, grace)
	rj.stopped <- replica
}

// report sends c to failed once it exits with an error.
func (c *child) report(failed chan<- *child) {
	go func() {
		<-c.done
		if c.err != nil {
			failed <- c
		}
	}()
}

// watchAll is closed once every one of children has exited.
func watchAll(children []*child) <-chan struct{} {
	all := slices.Clone(children)
	done := make(chan struct{})
	go func() {
		for _, c := range all {
			<-c.done
		}
		close(done)
	}()
	return done
}

// errReplica0Done refuses a restart once replica 0 has finished: the
// others' pushes are all in, and a rejoined worker would find nothing
// left to train.
var errReplica0Done = errors.New("replica 0 has finished the run")

// restartReplica starts replica's processes again, with the step
// o.Rejoin gives, in place of their former selves among children; the
// restart is the replica's n-th. Their asks (RejoinAsk) are answered with
// one fresher reading, the first ask's, so that all rejoin at one step.
func (o Options) restartReplica(children []*child, replica, n int, logDir string, outMu *sync.Mutex, failed chan<- *child) error {
	replicas := max(o.Replicas, 1)
	for i := range o.Stages {
		if children[i*replicas].exited() {
			return errReplica0Done
		}
	}
	step, err := o.Rejoin(replica)
	if err != nil {
		return err
	}
	ro := o
	ro.ExtraArgs = append(slices.Clone(o.ExtraArgs), RejoinFlag, strconv.Itoa(step))
	ro.Resume, ro.rejoin = false, n
	ro.rejoinStep = sync.OnceValue(func() int {
		if now, err := o.Rejoin(replica); err == nil && now > step {
			return now
		}
		return step
	})
	var started []*child
	for i := range o.Stages {
		c, err := start(ro, i, replica, logDir, outMu)
		if err != nil {
			stopAll(started, o.Grace)
			return fmt.Errorf("starting %s: %w", processName(i, replica, replicas), err)
		}
		started = append(started, c)
	}
	for _, c := range started {
		children[c.stage*replicas+replica] = c
		c.report(failed)
	}
	return nil
}
