package checkpoint

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Ledger decides when a checkpoint is committed, and where a restarted run
// resumes, for ranks that keep their parts on disks of their own: no process
// can look at another's files, so each rank reports the part it wrote (its
// checksum and size) and the ledger commits a step once every rank has. It
// does no I/O and keeps no clock, as raft's state machine does not: the
// cluster's registry feeds it the ranks' messages and sends its answers back,
// and each rank writes the committed manifest into its own folder.
//
// Ranks are numbered as the process grid numbers them; every replica of a
// stage writes its part (each needs it on its own disk to resume), and the
// replicas' parts must be the same bytes: their weights are.
type Ledger struct {
	stageOf []int // the stage of each rank
	stages  int
	steps   map[int]*ledgerStep

	held    [][]Held // by rank; nil until the rank reports
	heldIn  int
	resume  int
	decided bool
}

type ledgerStep struct {
	digest   string
	parts    []*Part // by rank
	in       int
	manifest *Manifest
	err      error
}

// NewLedger makes the ledger of a job whose rank r runs stage stageOf[r].
func NewLedger(stageOf []int) *Ledger {
	stages := 0
	for _, s := range stageOf {
		stages = max(stages, s+1)
	}
	return &Ledger{stageOf: slices.Clone(stageOf), stages: stages, steps: map[int]*ledgerStep{}, held: make([][]Held, len(stageOf))}
}

// Report records that rank wrote p, its part of step's checkpoint, for a run
// whose training digest is digest. When it is the last part the step needs,
// the step is committed at now (Outcome). A report repeated as it was (a
// retried call) changes nothing. An error says why the report is refused;
// a report that makes the whole step impossible (parts of another config,
// replicas whose parts differ) fails the step for every rank.
func (l *Ledger) Report(rank, step int, digest string, p Part, now time.Time) error {
	if rank < 0 || rank >= len(l.stageOf) {
		return fmt.Errorf("rank %d is beyond the job's %d ranks", rank, len(l.stageOf))
	}
	if p.Stage != l.stageOf[rank] {
		return fmt.Errorf("rank %d reported a part of stage %d; it runs stage %d", rank, p.Stage, l.stageOf[rank])
	}
	st := l.steps[step]
	if st == nil {
		st = &ledgerStep{digest: digest, parts: make([]*Part, len(l.stageOf))}
		l.steps[step] = st
	}
	if st.manifest != nil || st.err != nil {
		return nil // decided; the caller reads the outcome
	}
	if old := st.parts[rank]; old != nil {
		if *old != p {
			return fmt.Errorf("rank %d reported two different parts for step %d (sha256 %.12s, then %.12s)", rank, step, old.SHA256, p.SHA256)
		}
		return nil
	}
	if digest != st.digest {
		st.err = fmt.Errorf("step %d: rank %d wrote its part for a run of another config (training digest %.12s, the others' %.12s)", step, rank, digest, st.digest)
		return nil
	}
	for other, q := range st.parts {
		if q != nil && q.Stage == p.Stage && (q.SHA256 != p.SHA256 || q.Bytes != p.Bytes) {
			a, b, sa, sb := other, rank, q.SHA256, p.SHA256
			if a > b {
				a, b, sa, sb = b, a, sb, sa
			}
			st.err = fmt.Errorf("step %d: ranks %d and %d, replicas of stage %d, wrote different parts (sha256 %.12s and %.12s): their weights diverged", step, a, b, p.Stage, sa, sb)
			return nil
		}
	}
	st.parts[rank] = &p
	if st.in++; st.in == len(st.parts) {
		st.manifest = l.manifest(step, st, now)
	}
	return nil
}

// manifest lists one part per stage, in stage order.
func (l *Ledger) manifest(step int, st *ledgerStep, now time.Time) *Manifest {
	m := &Manifest{Step: step, ConfigDigest: st.digest, Stages: l.stages, Committed: now.UTC()}
	seen := make([]bool, l.stages)
	for _, p := range st.parts {
		if !seen[p.Stage] {
			seen[p.Stage] = true
			m.Parts = append(m.Parts, *p)
		}
	}
	sort.Slice(m.Parts, func(i, j int) bool { return m.Parts[i].Stage < m.Parts[j].Stage })
	return m
}

// Outcome is step's commit: its manifest once every rank has reported, or
// why it never will be; both nil while parts are still to come.
func (l *Ledger) Outcome(step int) (*Manifest, error) {
	st := l.steps[step]
	if st == nil {
		return nil, nil
	}
	return st.manifest, st.err
}

// Missing lists the ranks whose part of step has not been reported, for
// messages.
func (l *Ledger) Missing(step int) []int {
	var out []int
	st := l.steps[step]
	for rank := range l.stageOf {
		if st == nil || st.parts[rank] == nil {
			out = append(out, rank)
		}
	}
	return out
}

// Hold records the parts rank holds on its disk (HeldParts), from a
// restarted run. Once every rank has reported, the run resumes from the
// newest step that every rank holds, the replicas of each stage with the
// same bytes (Resume); from step 0 if there is none.
func (l *Ledger) Hold(rank int, held []Held) error {
	if rank < 0 || rank >= len(l.stageOf) {
		return fmt.Errorf("rank %d is beyond the job's %d ranks", rank, len(l.stageOf))
	}
	for _, h := range held {
		if h.Part.Stage != l.stageOf[rank] {
			return fmt.Errorf("rank %d holds a part of stage %d; it runs stage %d", rank, h.Part.Stage, l.stageOf[rank])
		}
	}
	if l.decided {
		return nil
	}
	if l.held[rank] == nil {
		l.heldIn++
	}
	l.held[rank] = append([]Held{}, held...) // non-nil: reported, even if empty
	if l.heldIn == len(l.held) {
		l.resume, l.decided = l.newestHeldByAll(), true
	}
	return nil
}

// newestHeldByAll is the newest step every rank holds, with replicas of a
// stage agreeing on its bytes.
func (l *Ledger) newestHeldByAll() int {
	count := map[int]int{}
	part := map[[2]int]Part{} // (step, stage) → the first replica's part
	bad := map[int]bool{}
	for rank, hs := range l.held {
		for _, h := range hs {
			count[h.Step]++
			key := [2]int{h.Step, l.stageOf[rank]}
			if p, ok := part[key]; ok && p != h.Part {
				bad[h.Step] = true
			}
			part[key] = h.Part
		}
	}
	best := 0
	for step, n := range count {
		if n == len(l.held) && !bad[step] && step > best {
			best = step
		}
	}
	return best
}

// Resume is the step the run resumes from, once every rank has reported
// what it holds (decided).
func (l *Ledger) Resume() (step int, decided bool) { return l.resume, l.decided }

// Unheld lists the ranks that have not reported what they hold, for messages.
func (l *Ledger) Unheld() []int {
	var out []int
	for rank, h := range l.held {
		if h == nil {
			out = append(out, rank)
		}
	}
	return out
}
