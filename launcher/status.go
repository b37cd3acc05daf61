package launcher

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Status is what a stage process says it is doing when the launcher asks
// (SIGUSR1) and once more when it fails: the action it is in and, if it is
// blocked on a neighbour, which one and for how long. A stage that is stopped
// or hung cannot answer; one blocked on a neighbour points at it; together
// they let the launcher blame the stage that stopped making progress instead
// of the first neighbour whose patience ran out.
type Status struct {
	Stage   int
	Replica int    // the stage's replica (0 without data parallelism)
	Action  string // "1B3", "" outside a step's actions
	// Peer is the stage this one waits for (receiving from it, or for room
	// to send to it), -1 when it is not waiting on a neighbour.
	Peer int
	// Ring says the wait is on the replicas' all-reduce ring, for replica
	// PeerReplica of stage Peer; otherwise Peer is in the same replica.
	Ring        bool
	PeerReplica int
	For         time.Duration // how long it has been in this state
}

// statusPrefix starts the one line a stage prints for a status query. The
// launcher keeps such lines out of the terminal (they go to the stage's log).
const statusPrefix = "pipetrain-status:"

// FormatStatus is the line a stage prints for a status query.
func FormatStatus(s Status) string {
	action := s.Action
	if action == "" {
		action = "-"
	}
	line := fmt.Sprintf("%s stage=%d action=%s peer=%d for=%s", statusPrefix, s.Stage, action, s.Peer, s.For)
	if s.Replica != 0 || s.Ring {
		line += fmt.Sprintf(" replica=%d", s.Replica)
	}
	if s.Ring {
		line += fmt.Sprintf(" ring_replica=%d", s.PeerReplica)
	}
	return line
}

// ParseStatus reads a line printed by FormatStatus; ok is false for any other line.
func ParseStatus(line string) (s Status, ok bool) {
	rest, ok := strings.CutPrefix(line, statusPrefix)
	if !ok {
		return Status{}, false
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	var err1, err2, err3 error
	s.Stage, err1 = strconv.Atoi(fields["stage"])
	s.Peer, err2 = strconv.Atoi(fields["peer"])
	s.For, err3 = time.ParseDuration(fields["for"])
	if s.Action = fields["action"]; s.Action == "-" {
		s.Action = ""
	}
	var err4, err5 error
	if v, ok := fields["replica"]; ok {
		s.Replica, err4 = strconv.Atoi(v)
	}
	if v, ok := fields["ring_replica"]; ok {
		s.Ring = true
		s.PeerReplica, err5 = strconv.Atoi(v)
	}
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil {
		return Status{}, false
	}
	return s, true
}

// Waiting reports whether the stage is blocked on a neighbour.
func (s Status) Waiting() bool { return s.Peer >= 0 }

func (s Status) String() string {
	in := ""
	if s.Action != "" {
		in = " in " + s.Action
	}
	who := fmt.Sprintf("stage %d", s.Stage)
	if s.Replica != 0 || s.Ring {
		who += fmt.Sprintf(" replica %d", s.Replica)
	}
	if s.Waiting() {
		peer := fmt.Sprintf("stage %d", s.Peer)
		if s.Ring {
			peer = fmt.Sprintf("stage %d replica %d (the all-reduce ring)", s.Peer, s.PeerReplica)
		}
		return fmt.Sprintf("%s has waited %v%s for %s", who, s.For.Round(time.Millisecond), in, peer)
	}
	if s.Action != "" {
		return fmt.Sprintf("%s has been computing %s for %v", who, s.Action, s.For.Round(time.Millisecond))
	}
	return fmt.Sprintf("%s is between actions (for %v)", who, s.For.Round(time.Millisecond))
}

// blame returns the error of a launch in which stage failed first (the first
// reaped: its neighbours may fail within moments of it, and exit before it).
// A stage that failed while waiting for a neighbour says so in its last
// status: it is a consequence, and blame follows the waits from neighbour to
// neighbour to the cause. A failed stage that was not waiting on one (disk
// full, NaN, a panic) is the cause, blamed with its own error. A stage still
// running at the end of the chain stopped making progress (Hung): one that
// does not answer a status query within ask (stopped, or hung where signals
// are not served), or one computing rather than waiting, unless it exits,
// failing by itself, within lostPeerGrace.
func blame(failed *child, children []*child, ask time.Duration) error {
	// Waits run along a replica's pipeline, or round a stage's replicas.
	type pos struct{ stage, replica int }
	byPos := map[pos]*child{}
	for _, c := range children {
		byPos[pos{c.stage, c.replica}] = c
	}
	next := func(from int, s Status) pos {
		if s.Ring {
			return pos{s.Peer, s.PeerReplica}
		}
		return pos{s.Peer, from}
	}
	var chain []string
	seen := map[pos]bool{}
	queried := false
	// cur is a failed stage: the cause, unless it was waiting on a neighbour.
	for cur := failed; ; {
		st, ok := cur.lastStatus()
		if !ok || !st.Waiting() || byPos[next(cur.replica, st)] == nil {
			return earliestCause(cur, children).stageError()
		}
		seen[pos{cur.stage, cur.replica}] = true
		chain = append(chain, st.String())
		hung := func(at pos, why string) error {
			e := cur.stageError().(*StageError)
			e.Stage, e.Replica, e.Hung, e.Detector, e.DetectorReplica = at.stage, at.replica, true, cur.stage, cur.replica
			e.Why = why + " (" + strings.Join(chain, "; ") + ")"
			return e
		}
		at := next(cur.replica, st)
		for {
			c := byPos[at]
			if c == nil || seen[at] {
				return failed.stageError() // a cycle of waits: no stage stands out
			}
			seen[at] = true
			if !c.running() {
				if err := c.exitErr(); err == nil {
					return hung(at, "it had exited cleanly")
				}
				cur = c // failed too: its own status tells whether as a cause
				break
			}
			if !queried {
				query(children, ask)
				queried = true
			}
			s, answered := c.answer()
			if answered && s.Waiting() {
				chain = append(chain, s.String())
				at = next(at.replica, s)
				continue
			}
			// A stage failing by itself may be on its way out (closing its
			// links woke its neighbours); a hung one stays.
			if c.exitsWithin(lostPeerGrace) && c.exitErr() != nil {
				cur = c
				break
			}
			if !answered {
				return hung(at, fmt.Sprintf("it answered no status query within %v: stopped, or hung", ask))
			}
			return hung(at, s.String())
		}
	}
}

// earliestCause is, of cause and the other exited stages that failed by
// themselves (not waiting on a neighbour), the one that said why first: two
// stages may fail on their own (both run out of disk space), and the one to
// blame should not depend on which of them the search reached. A stage killed
// by a signal is blamed whatever others said after.
func earliestCause(cause *child, children []*child) *child {
	if cause.signaled() {
		return cause
	}
	best, at := cause, cause.saidAt()
	for _, c := range children {
		if c == cause || c.running() || c.exitErr() == nil {
			continue
		}
		if st, ok := c.lastStatus(); ok && st.Waiting() {
			continue // a consequence of a neighbour's failure
		}
		if t := c.saidAt(); !t.IsZero() && (at.IsZero() || t.Before(at)) {
			best, at = c, t
		}
	}
	return best
}

// saidAt is when the stage printed why it failed; zero if it did not.
func (c *child) saidAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason.saidAt()
}

// running reports whether the stage process has not exited yet.
func (c *child) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// exitsWithin waits up to d for the stage process to exit and reports whether it did.
func (c *child) exitsWithin(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// query asks every running stage for its status (SIGUSR1) and waits up to
// ask for the answers.
func query(children []*child, ask time.Duration) {
	var asked []*child
	for _, c := range children {
		select {
		case <-c.done:
			continue
		default:
		}
		c.mu.Lock()
		c.fresh = false
		c.mu.Unlock()
		if c.cmd.Process.Signal(syscall.SIGUSR1) == nil {
			asked = append(asked, c)
		}
	}
	deadline := time.Now().Add(ask)
	for _, c := range asked {
		for time.Now().Before(deadline) {
			if _, ok := c.answer(); ok {
				break
			}
			select {
			case <-c.done:
			case <-time.After(10 * time.Millisecond):
				continue
			}
			break
		}
	}
}

// lastStatus is the latest status the stage printed, fresh or not.
func (c *child) lastStatus() (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.hasStatus
}

// answer is the stage's answer to the latest query, if it gave one.
func (c *child) answer() (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.hasStatus && c.fresh
}

func (c *child) exitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
