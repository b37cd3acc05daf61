package stages

import (
	"sync/atomic"
	"time"
)

// activity records what the stage is doing, so a status query (the launcher's
// SIGUSR1, answered by another goroutine) can tell a stage blocked on a
// neighbour from one that stopped making progress. The runtime's goroutine
// writes it with atomic stores and never allocates; a reader may see the
// fields of two neighbouring moments, which is good enough for a diagnosis.
type activity struct {
	action atomic.Int64 // index into the runtime's ops, -1 between steps
	peer   atomic.Int64 // the stage waited for, -1 when not waiting
	// peerReplica is the replica of peer waited for on the replicas' ring,
	// -1 for the stage's own replica (a pipeline neighbour).
	peerReplica atomic.Int64
	since       atomic.Int64 // unix ns of the last change
}

func (a *activity) init() {
	a.action.Store(-1)
	a.peer.Store(-1)
	a.peerReplica.Store(-1)
	a.since.Store(time.Now().UnixNano())
}

// in marks the start of op i of the lowered schedule (-1: none).
func (a *activity) in(i int) {
	a.peer.Store(-1)
	a.peerReplica.Store(-1)
	a.action.Store(int64(i))
	a.since.Store(time.Now().UnixNano())
}

// waitOn marks a wait for stage s to begin; resumed ends it.
func (a *activity) waitOn(s int) {
	a.peer.Store(int64(s))
	a.since.Store(time.Now().UnixNano())
}

// waitOnReplica marks a wait for replica r of stage s (the replicas' ring).
func (a *activity) waitOnReplica(s, r int) {
	a.peerReplica.Store(int64(r))
	a.waitOn(s)
}

func (a *activity) resumed() {
	a.peer.Store(-1)
	a.peerReplica.Store(-1)
	a.since.Store(time.Now().UnixNano())
}

// Activity is a stage's answer to a status query.
type Activity struct {
	Stage, Replica int
	Action         string // the op of the lowered schedule it is in ("1B3", "1B3<2"), "" between steps
	Peer           int    // the stage it waits for, -1 when not waiting on one
	// PeerReplica is the replica of Peer it waits for on the replicas'
	// ring, -1 when Peer is a neighbour in its own replica's pipeline.
	PeerReplica int
	For         time.Duration
}

// Activity reports what the stage is doing now; safe to call from any goroutine.
func (r *Runtime) Activity() Activity {
	a := Activity{Stage: r.stage, Replica: r.replica, Peer: int(r.act.peer.Load()), PeerReplica: int(r.act.peerReplica.Load()),
		For: time.Since(time.Unix(0, r.act.since.Load()))}
	if i := int(r.act.action.Load()); i >= 0 && i < len(r.ops) {
		a.Action = r.ops[i].String()
	}
	return a
}
