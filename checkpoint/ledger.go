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
// replicas' parts must be the same bytes: their weights are. Parameter
// servers that are ranks of the job follow the stages' ranks, each writing
// its own shard (ServerPartFile), which a checkpoint needs as much.
type Ledger struct {
	stageOf []int // the stage of each stage rank
	stages  int
	servers int // ranks after the stages' that run parameter servers
	plan    Plan
	steps   map[int]*ledgerStep

	// reached is the newest step each rank has reported; the smallest of
	// them (or the step resumed from, if newer) is the floor every rank has
	// passed, below which no step is kept and near which every new step
	// must lie (admit).
	reached []int
	// interrupt is the one step off the plan the ledger has admitted: the
	// checkpoint a stopped launch writes where its stages agreed to stop
	// (stages.Pause); 0 while there is none.
	interrupt int

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

// Plan is the schedule of a run's checkpoints, from its config: the steps a
// ledger admits reports of.
type Plan struct {
	// Every is checkpoint.every: a checkpoint every so many steps and after
	// the last; 0, none but an interrupted launch's.
	Every int
	// Steps is train.steps, the run's last step.
	Steps int
}

// onPlan says whether the run checkpoints after step in the course of
// training (stages' checkpointsAfter).
func (p Plan) onPlan(step int) bool {
	return p.Every > 0 && (step%p.Every == 0 || step == p.Steps)
}

func (p Plan) String() string {
	if p.Every == 0 {
		return fmt.Sprintf("no checkpoints but an interrupt's, steps 1-%d", p.Steps)
	}
	return fmt.Sprintf("every %d steps and after step %d", p.Every, p.Steps)
}

// Bounds on what a rank may report: the ledger keeps what it is told, and
// whoever holds the token may tell it anything.
const (
	// maxDigestLen bounds a report's training digest and a part's checksum:
	// both are SHA-256 sums in hex.
	maxDigestLen = 64
	// aheadChecks is how many checkpoints past the floor a new step may be.
	// A rank reports a step only once the step before it is decided, which
	// takes every rank, so a genuine report is at most one checkpoint ahead;
	// the second is slack.
	aheadChecks = 2
)

// NewLedger makes the ledger of a job whose rank r runs stage stageOf[r] and
// whose checkpoints follow plan.
func NewLedger(stageOf []int, plan Plan) *Ledger { return NewServerLedger(stageOf, 0, plan) }

// NewServerLedger is NewLedger for a job whose ranks after the stages'
// run servers parameter servers, rank len(stageOf)+i server i: a step is
// committed once every stage rank's part and every server's are in.
func NewServerLedger(stageOf []int, servers int, plan Plan) *Ledger {
	stages := 0
	for _, s := range stageOf {
		stages = max(stages, s+1)
	}
	ranks := len(stageOf) + servers
	return &Ledger{stageOf: slices.Clone(stageOf), stages: stages, servers: servers, plan: plan, steps: map[int]*ledgerStep{},
		reached: make([]int, ranks), held: make([][]Held, ranks)}
}

// ranks is the number of ranks that write parts: the stages' and the servers'.
func (l *Ledger) ranks() int { return len(l.stageOf) + l.servers }

// serverOf says which parameter server rank runs, if it runs one.
func (l *Ledger) serverOf(rank int) (int, bool) {
	if rank < len(l.stageOf) {
		return 0, false
	}
	return rank - len(l.stageOf), true
}

// owner is what a rank's part belongs to, for telling parts apart: the
// stage, or -1-i for server i.
func (l *Ledger) owner(rank int) int {
	if i, ok := l.serverOf(rank); ok {
		return -1 - i
	}
	return l.stageOf[rank]
}

// Report records that rank wrote p, its part of step's checkpoint, for a run
// whose training digest is digest. When it is the last part the step needs,
// the step is committed at now (Outcome). A report repeated as it was (a
// retried call) changes nothing. An error says why the report is refused;
// a report that makes the whole step impossible (parts of another config,
// replicas whose parts differ) fails the step for every rank.
func (l *Ledger) Report(rank, step int, digest string, p Part, now time.Time) error {
	if rank < 0 || rank >= l.ranks() {
		return fmt.Errorf("rank %d is beyond the job's %d ranks", rank, l.ranks())
	}
	if err := l.checkPart(rank, p); err != nil {
		return err
	}
	if len(digest) > maxDigestLen {
		return fmt.Errorf("rank %d reported a training digest of %d characters; a digest has at most %d", rank, len(digest), maxDigestLen)
	}
	st := l.steps[step]
	if st == nil {
		if err := l.admit(rank, step); err != nil {
			return err
		}
		st = &ledgerStep{digest: digest, parts: make([]*Part, l.ranks())}
		l.steps[step] = st
	}
	l.reach(rank, step)
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
		if q != nil && l.owner(other) == l.owner(rank) && (q.SHA256 != p.SHA256 || q.Bytes != p.Bytes) {
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

// checkPart refuses a part that is not the file rank's stage writes: the
// manifest made of the parts names them to every rank, which joins each name
// to its own checkpoint folder.
func (l *Ledger) checkPart(rank int, p Part) error {
	if i, ok := l.serverOf(rank); ok {
		if p.Stage != i || p.File != ServerPartFile(i) {
			return fmt.Errorf("rank %d reported %q as its part of parameter server %d; it runs server %d, whose part is %s", rank, p.File, p.Stage, i, ServerPartFile(i))
		}
		return l.checkSum(rank, p)
	}
	if p.Stage != l.stageOf[rank] {
		return fmt.Errorf("rank %d reported a part of stage %d; it runs stage %d", rank, p.Stage, l.stageOf[rank])
	}
	if p.File != PartFile(p.Stage) {
		return fmt.Errorf("rank %d reported the file %q as its part; stage %d's part is %s", rank, p.File, p.Stage, PartFile(p.Stage))
	}
	return l.checkSum(rank, p)
}

// checkSum refuses a part whose size and checksum cannot be a file's.
func (l *Ledger) checkSum(rank int, p Part) error {
	if len(p.SHA256) > maxDigestLen || p.Bytes < 0 {
		return fmt.Errorf("rank %d reported a part of %d bytes with a checksum of %d characters: not a part's size and SHA-256", rank, p.Bytes, len(p.SHA256))
	}
	return nil
}

// admit refuses a report that opens a step the run does not checkpoint, or
// one too far from where the ranks are: each opened step is kept until
// every rank has passed it, so these bound the ledger's memory.
func (l *Ledger) admit(rank, step int) error {
	if step < 1 || step > l.plan.Steps {
		return fmt.Errorf("rank %d reported a checkpoint of step %d; the run has steps 1-%d", rank, step, l.plan.Steps)
	}
	floor := l.floor()
	if step <= floor {
		return fmt.Errorf("rank %d reported a checkpoint of step %d; every rank has reached step %d", rank, step, floor)
	}
	if l.plan.Every > 0 && step > floor+aheadChecks*l.plan.Every {
		return fmt.Errorf("rank %d reported a checkpoint of step %d, more than %d checkpoints past step %d, which every rank has reached", rank, step, aheadChecks, floor)
	}
	if l.plan.onPlan(step) {
		return nil
	}
	// A stopped launch checkpoints the step its stages agreed to stop
	// after, wherever it falls, and its stages then exit: one such step
	// per job.
	if l.interrupt != 0 {
		return fmt.Errorf("rank %d reported a checkpoint of step %d, off the run's checkpoints (%v), after step %d's: a stopped run writes one", rank, step, l.plan, l.interrupt)
	}
	l.interrupt = step
	return nil
}

// reach records that rank reported step and forgets the steps every rank
// has passed: no rank reports them again.
func (l *Ledger) reach(rank, step int) {
	if step <= l.reached[rank] {
		return
	}
	l.reached[rank] = step
	floor := l.floor()
	for s := range l.steps {
		if s < floor {
			delete(l.steps, s)
		}
	}
}

// floor is the step every rank has reached: the oldest of their newest
// reports, or the step the run resumed from.
func (l *Ledger) floor() int {
	if len(l.reached) == 0 {
		return l.resume
	}
	return max(slices.Min(l.reached), l.resume)
}

// manifest lists one part per stage, in stage order, and each server's.
func (l *Ledger) manifest(step int, st *ledgerStep, now time.Time) *Manifest {
	m := &Manifest{Step: step, ConfigDigest: st.digest, Stages: l.stages, Servers: l.servers, Committed: now.UTC()}
	seen := make([]bool, l.stages)
	for rank, p := range st.parts {
		if _, server := l.serverOf(rank); server {
			m.ServerParts = append(m.ServerParts, *p) // in server order: their ranks are
			continue
		}
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
	if st == nil && step < l.floor() {
		return nil, fmt.Errorf("step %d is no longer awaited: every rank has reported step %d", step, l.floor())
	}
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
	for rank := range l.ranks() {
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
	if rank < 0 || rank >= l.ranks() {
		return fmt.Errorf("rank %d is beyond the job's %d ranks", rank, l.ranks())
	}
	for _, h := range held {
		if err := l.checkPart(rank, h.Part); err != nil {
			return fmt.Errorf("step %d: %w", h.Step, err)
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
			key := [2]int{h.Step, l.owner(rank)}
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
