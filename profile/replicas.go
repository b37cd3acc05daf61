package profile

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/internal/stats"
)

// StragglerReplicaShare is how late, as a share of its step, a replica may
// hand a stage's gradients to the all-reduce before StragglerReplicas names
// it: the other replicas wait that long for it every step.
const StragglerReplicaShare = 0.1

// ReplicaStage is one stage of one data-parallel replica over a report's
// analysed steps, as its own process logged it; times are means per step.
// Each figure is a duration on one process's clock, so the replicas compare
// without aligning their clocks.
type ReplicaStage struct {
	Replica, Stage int
	Steps          int // analysed steps the log holds
	// Step runs from the stage's first action in the step, its wait for
	// input included (when the stage was ready for the step), to the end of
	// its optimizer step; steps without an optimizer step logged are left
	// out of it.
	Step time.Duration
	Busy time.Duration // F, B, I and W: the stage's compute, as StageReport.Busy
	// AllReduce and Exposed are StageReport's AllReduce and
	// AllReduceExposed, per step.
	AllReduce, Exposed time.Duration
	// Late is how much later than the stage's earliest replica this one
	// handed its gradients over: the stage's longest mean all-reduce less
	// this one's. A ring all-reduce ends on every rank at about one time,
	// when the last rank's gradients are in, so a replica that starts late
	// has a short one and keeps the others waiting.
	Late time.Duration
}

// AddReplicas fills in r.Replicas from every replica's logs (ReadReplicas):
// each replica's stages over the steps r analysed, which are the same step
// numbers in every replica. A replica without one of those steps is measured
// over the ones it has.
func (r *Report) AddReplicas(replicas []Replica) error {
	if len(replicas) == 0 {
		return errors.New("profile: no replicas")
	}
	analysed := map[int]bool{}
	for _, s := range r.Steps {
		analysed[s.Step-1] = true
	}
	out := make([][]ReplicaStage, len(replicas))
	for ri, rep := range replicas {
		if len(rep.Events) != len(r.Stages) {
			return fmt.Errorf("profile: replica %d has %d stages, the run %d", ri, len(rep.Events), len(r.Stages))
		}
		out[ri] = make([]ReplicaStage, len(rep.Events))
		for s, events := range rep.Events {
			out[ri][s] = replicaStage(ri, s, events, analysed)
		}
	}
	for s := range r.Stages {
		var longest time.Duration
		for ri := range out {
			longest = max(longest, out[ri][s].AllReduce)
		}
		for ri := range out {
			out[ri][s].Late = longest - out[ri][s].AllReduce
		}
	}
	r.Replicas = out
	return nil
}

// replicaStage measures one stage replica's log over the analysed steps.
func replicaStage(replica, stage int, events []Event, analysed map[int]bool) ReplicaStage {
	type step struct {
		ready, end int64 // first action's wait start, optimizer end
		opt        bool
		reduced    [][2]int64
	}
	steps := map[int]*step{}
	rs := ReplicaStage{Replica: replica, Stage: stage}
	var busy, exposed time.Duration
	for _, e := range events {
		if !analysed[e.Step] {
			continue
		}
		st := steps[e.Step]
		if st == nil {
			st = &step{ready: math.MaxInt64}
			steps[e.Step] = st
		}
		switch {
		case e.Kind == AllReduce:
			st.reduced = append(st.reduced, [2]int64{e.StartNS, e.EndNS})
			exposed += time.Duration(e.WaitNS)
			continue
		case e.Kind == Optimizer:
			st.end, st.opt = max(st.end, e.EndNS), true
		default:
			busy += time.Duration(e.EndNS - e.StartNS)
		}
		st.ready = min(st.ready, e.StartNS-e.WaitNS)
	}
	rs.Steps = len(steps)
	if rs.Steps == 0 {
		return rs
	}
	var total, reduced time.Duration
	timed := 0
	for _, st := range steps {
		if st.opt && st.ready < st.end {
			total += time.Duration(st.end - st.ready)
			timed++
		}
		reduced += covered(st.reduced)
	}
	n := time.Duration(rs.Steps)
	if timed > 0 {
		rs.Step = total / time.Duration(timed)
	}
	rs.Busy, rs.AllReduce, rs.Exposed = busy/n, reduced/n, exposed/n
	return rs
}

// StragglerReplicas returns, for each replica that some stage's other
// replicas wait for more than StragglerReplicaShare of its step (Late), that
// stage's figures: the stage where it is latest, in replica order.
func (r *Report) StragglerReplicas() []ReplicaStage {
	var out []ReplicaStage
	for _, stages := range r.Replicas {
		worst := -1
		for s, rs := range stages {
			if rs.Step > 0 && float64(rs.Late) > StragglerReplicaShare*float64(rs.Step) &&
				(worst < 0 || rs.Late > stages[worst].Late) {
				worst = s
			}
		}
		if worst >= 0 {
			out = append(out, stages[worst])
		}
	}
	return out
}

// hasAllReduce reports whether the run had replicas that all-reduced: the
// report's all-reduce figures are printed then only, so that a run without
// replicas (or whose replicas are parameter servers' workers) reads as it
// always has.
func (r *Report) hasAllReduce() bool {
	if r.Info.Replicas > 1 && r.Info.ParameterServers == 0 {
		return true
	}
	for _, s := range r.Stages {
		if s.AllReduceSteps > 0 {
			return true
		}
	}
	return false
}

// writeAllReduce prints each stage's all-reduce per step: its time, the
// exposed part, the bytes its process sent and the bus bandwidth.
func (r *Report) writeAllReduce(w io.Writer) error {
	row, flush := table(w)
	row("stage", "AR ms/step", "exposed ms/step", "AR MiB sent/step", "bus GB/s")
	for _, s := range r.Stages {
		if s.AllReduceSteps == 0 {
			row(fmt.Sprint(s.Stage), "-", "-", "-", "-")
			continue
		}
		n := time.Duration(s.AllReduceSteps)
		row(fmt.Sprint(s.Stage), fmtMS3(s.AllReduce/n), fmtMS3(s.AllReduceExposed/n),
			fmt.Sprintf("%.2f", float64(s.AllReduceBytes)/float64(s.AllReduceSteps)/(1<<20)),
			fmt.Sprintf("%.3f", s.BusBandwidth/1e9))
	}
	return flush()
}

func fmtMS3(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d)/1e6) }

// writeReplicas prints every replica's stages (Replicas) and the straggler
// replicas, or why the replicas could not be read.
func (r *Report) writeReplicas(w io.Writer) error {
	if r.ReplicasErr != nil {
		_, err := fmt.Fprintf(w, "replicas: %v\n", r.ReplicasErr)
		return err
	}
	if r.Replicas == nil {
		return nil
	}
	row, flush := table(w)
	row("replica", "stage", "step ms", "busy ms", "AR ms", "exposed ms", "late ms")
	for _, stages := range r.Replicas {
		for _, s := range stages {
			if s.Steps == 0 {
				row(fmt.Sprint(s.Replica), fmt.Sprint(s.Stage), "-", "-", "-", "-", "-")
				continue
			}
			row(fmt.Sprint(s.Replica), fmt.Sprint(s.Stage), fmtMS(s.Step), fmtMS(s.Busy), fmtMS(s.AllReduce),
				fmtMS(s.Exposed), fmtMS(s.Late))
		}
	}
	if err := flush(); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "straggler replicas (gradients handed over > %.0f%% of a step after the earliest replica's): ", 100*StragglerReplicaShare)
	st := r.StragglerReplicas()
	if len(st) == 0 {
		b.WriteString("none\n")
	} else {
		fmt.Fprintf(&b, "%d\n", len(st))
		for _, s := range st {
			var others []time.Duration
			for ri := range r.Replicas {
				if ri != s.Replica {
					others = append(others, r.Replicas[ri][s.Stage].Busy)
				}
			}
			fmt.Fprintf(&b, "  replica %d: stage %d's gradients %s ms per step after the earliest replica's (%.0f%% of its %s ms step); busy %s ms per step, the others' median %s ms\n",
				s.Replica, s.Stage, fmtMS(s.Late), 100*float64(s.Late)/float64(s.Step), fmtMS(s.Step), fmtMS(s.Busy), fmtMS(stats.Median(others)))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
