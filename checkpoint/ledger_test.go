package checkpoint

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A 2-stage, 2-replica grid: ranks 0, 1 run stage 0, ranks 2, 3 stage 1.
var grid2x2 = []int{0, 0, 1, 1}

// plan100 checkpoints every 10 steps of 100.
var plan100 = Plan{Every: 10, Steps: 100}

func part(stage int, sum string) Part {
	return Part{Stage: stage, File: PartFile(stage), SHA256: sum, Bytes: int64(len(sum))}
}

func TestLedgerCommitsOnceEveryRankReported(t *testing.T) {
	l := NewLedger(grid2x2, plan100)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for rank, sum := range []string{"aa", "aa", "bb"} {
		if err := l.Report(rank, 10, "d", part(grid2x2[rank], sum), now); err != nil {
			t.Fatal(err)
		}
		if m, err := l.Outcome(10); m != nil || err != nil {
			t.Fatalf("after rank %d: committed early: %v %v", rank, m, err)
		}
	}
	// A retried report changes nothing.
	if err := l.Report(2, 10, "d", part(1, "bb"), now); err != nil {
		t.Fatal(err)
	}
	if got := l.Missing(10); len(got) != 1 || got[0] != 3 {
		t.Fatalf("missing = %v, want [3]", got)
	}
	if err := l.Report(3, 10, "d", part(1, "bb"), now); err != nil {
		t.Fatal(err)
	}
	m, err := l.Outcome(10)
	if err != nil || m == nil {
		t.Fatalf("not committed: %v", err)
	}
	if m.Step != 10 || m.Stages != 2 || m.ConfigDigest != "d" || len(m.Parts) != 2 || m.Parts[0].SHA256 != "aa" || m.Parts[1].SHA256 != "bb" || !m.Committed.Equal(now) {
		t.Fatalf("manifest = %+v", m)
	}
	if m, err := l.Outcome(20); m != nil || err != nil {
		t.Fatal("a step nobody reported has an outcome")
	}
}

func TestLedgerRefusesWhatCannotBeCommitted(t *testing.T) {
	l := NewLedger(grid2x2, plan100)
	now := time.Now()
	if err := l.Report(4, 10, "d", part(1, "x"), now); err == nil || !strings.Contains(err.Error(), "rank 4 is beyond") {
		t.Fatalf("rank out of range: %v", err)
	}
	if err := l.Report(0, 10, "d", part(1, "x"), now); err == nil || !strings.Contains(err.Error(), "runs stage 0") {
		t.Fatalf("wrong stage: %v", err)
	}
	l.Report(0, 10, "d", part(0, "aa"), now)
	if err := l.Report(0, 10, "d", part(0, "ab"), now); err == nil || !strings.Contains(err.Error(), "two different parts") {
		t.Fatalf("changed report: %v", err)
	}
	// Replicas whose parts differ fail the step for everyone.
	l.Report(1, 10, "d", part(0, "zz"), now)
	if _, err := l.Outcome(10); err == nil || !strings.Contains(err.Error(), "ranks 0 and 1, replicas of stage 0") {
		t.Fatalf("diverged replicas: %v", err)
	}
	// A part of another config fails its step.
	l.Report(0, 20, "d", part(0, "aa"), now)
	l.Report(2, 20, "other", part(1, "bb"), now)
	if _, err := l.Outcome(20); err == nil || !strings.Contains(err.Error(), "rank 2 wrote its part for a run of another config") {
		t.Fatalf("other config: %v", err)
	}
}

func held(stage int, steps ...int) []Held {
	var out []Held
	for _, s := range steps {
		out = append(out, Held{Step: s, Part: part(stage, string(rune('a'+s/10)))})
	}
	return out
}

func TestLedgerResumesFromNewestStepEveryRankHolds(t *testing.T) {
	l := NewLedger(grid2x2, plan100)
	l.Hold(0, held(0, 30, 20, 10))
	l.Hold(1, held(0, 20, 10))
	l.Hold(2, held(1, 30, 20))
	if _, decided := l.Resume(); decided {
		t.Fatal("decided before rank 3 reported")
	}
	if got := l.Unheld(); len(got) != 1 || got[0] != 3 {
		t.Fatalf("unheld = %v", got)
	}
	l.Hold(3, held(1, 40, 30, 20))
	if step, decided := l.Resume(); !decided || step != 20 {
		t.Fatalf("resume = %d, %v; want step 20", step, decided)
	}

	// Nothing in common: start over.
	l = NewLedger([]int{0, 1}, plan100)
	l.Hold(0, held(0, 10))
	l.Hold(1, nil)
	if step, decided := l.Resume(); !decided || step != 0 {
		t.Fatalf("resume = %d, %v; want step 0", step, decided)
	}

	// A step whose replicas hold different bytes is passed over.
	l = NewLedger([]int{0, 0}, plan100)
	l.Hold(0, []Held{{Step: 20, Part: part(0, "x")}, {Step: 10, Part: part(0, "a")}})
	l.Hold(1, []Held{{Step: 20, Part: part(0, "y")}, {Step: 10, Part: part(0, "a")}})
	if step, _ := l.Resume(); step != 10 {
		t.Fatalf("resume = %d, want 10 (step 20's replicas differ)", step)
	}
	if err := l.Hold(0, held(1, 10)); err == nil {
		t.Fatal("a part of another stage was accepted")
	}
}

func TestHeldPartsListsCompleteMatchingParts(t *testing.T) {
	root := t.TempDir()
	meta := map[string]string{"training_digest": "d"}
	ts := []Tensor{{Name: "w", Shape: []int{1}, F32: []float32{1}}}
	for _, step := range []int{10, 20, 30} {
		if _, err := WritePart(root, step, 1, ts, meta); err != nil {
			t.Fatal(err)
		}
	}
	// Step 30's part torn after its checksum was written; step 40's of another run.
	if err := os.Truncate(filepath.Join(StepDir(root, 30), PartFile(1)), 9); err != nil {
		t.Fatal(err)
	}
	if _, err := WritePart(root, 40, 1, ts, map[string]string{"training_digest": "other"}); err != nil {
		t.Fatal(err)
	}
	got, err := HeldParts(root, 1, "d")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Step != 20 || got[1].Step != 10 || got[0].Part.Stage != 1 {
		t.Fatalf("held = %+v, want steps 20 and 10", got)
	}
}

// TestLedgerRefusesAPartNamingAnotherFile: a rank (or whoever holds the
// token and claims its rank) cannot make the manifest every rank writes
// name a file outside the checkpoint's folder.
func TestLedgerRefusesAPartNamingAnotherFile(t *testing.T) {
	l := NewLedger([]int{0, 1}, plan100)
	now := time.Now()
	if err := l.Report(0, 10, "d", part(0, "aa"), now); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"../../x", "stage-0.safetensors", "./stage-1.safetensors", "/etc/passwd"} {
		bad := Part{Stage: 1, File: file, SHA256: "bb", Bytes: 2}
		if err := l.Report(1, 10, "d", bad, now); err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), strconv.Quote(file)) {
			t.Fatalf("part naming %q: %v", file, err)
		}
		if err := l.Hold(1, []Held{{Step: 10, Part: bad}}); err == nil || !strings.Contains(err.Error(), strconv.Quote(file)) {
			t.Fatalf("held part naming %q: %v", file, err)
		}
	}
	if m, err := l.Outcome(10); m != nil || err != nil {
		t.Fatalf("step 10 decided by refused reports: %+v, %v", m, err)
	}
	if err := l.Report(1, 10, "d", part(1, "bb"), now); err != nil {
		t.Fatal(err)
	}
	m, err := l.Outcome(10)
	if err != nil || m == nil || m.Parts[1].File != "stage-1.safetensors" {
		t.Fatalf("the genuine part: %+v, %v", m, err)
	}
	long := part(1, strings.Repeat("f", 65))
	if err := l.Report(1, 20, "d", long, now); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("a 65-character checksum: %v", err)
	}
	if err := l.Report(1, 20, strings.Repeat("d", 1<<20), part(1, "bb"), now); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("a 1 MiB digest: %v", err)
	}
}

// TestLedgerRefusesStepsOffThePlan: the ledger opens only the steps the run
// checkpoints (every 10, and the last), near where the ranks are, and one
// step elsewhere: the one a stopped launch checkpoints.
func TestLedgerRefusesStepsOffThePlan(t *testing.T) {
	l := NewLedger([]int{0, 1}, Plan{Every: 10, Steps: 95})
	now := time.Now()
	refused := func(step int, want string) {
		t.Helper()
		if err := l.Report(1, step, "d", part(1, "bb"), now); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("step %d: %v, want %q", step, err, want)
		}
	}
	refused(0, "the run has steps 1-95")
	refused(-10, "the run has steps 1-95")
	refused(100, "the run has steps 1-95")
	refused(30, "more than 2 checkpoints past step 0")
	commit := func(step int) {
		t.Helper()
		for rank := range 2 {
			if err := l.Report(rank, step, "d", part(rank, "cc"), now); err != nil {
				t.Fatalf("rank %d, step %d: %v", rank, step, err)
			}
		}
		if m, err := l.Outcome(step); m == nil || err != nil {
			t.Fatalf("step %d not committed: %v", step, err)
		}
	}
	commit(10)
	commit(20)
	refused(10, "every rank has reached step 20")
	// The interrupt's step, off the plan, once.
	commit(23)
	refused(27, "off the run's checkpoints (every 10 steps and after step 95), after step 23's")

	// After a resume from step 90, the last step, 95, is on the plan.
	l = NewLedger([]int{0, 1}, Plan{Every: 10, Steps: 95})
	l.Hold(0, []Held{{Step: 90, Part: part(0, "aa")}})
	l.Hold(1, []Held{{Step: 90, Part: part(1, "bb")}})
	if step, _ := l.Resume(); step != 90 {
		t.Fatalf("resume = %d", step)
	}
	refused(80, "every rank has reached step 90")
	commit(95)

	// Without checkpoint.every, a stopped launch's step is the only one.
	l = NewLedger([]int{0, 1}, Plan{Steps: 95})
	commit(61)
	refused(95, "off the run's checkpoints (no checkpoints but an interrupt's, steps 1-95), after step 61's")
}

// TestLedgerStaysBoundedUnderSpammedSteps: a rank reporting every step
// number leaves the ledger holding a handful of steps, and the run's own
// checkpoints still commit.
func TestLedgerStaysBoundedUnderSpammedSteps(t *testing.T) {
	l := NewLedger([]int{0, 1}, Plan{Every: 10, Steps: 10000})
	now := time.Now()
	most := 0
	for step := 10; step <= 10000; step += 10 {
		for spam := step; spam < step+100; spam++ {
			l.Report(1, spam, "d", part(1, "bb"), now)
			most = max(most, len(l.steps))
		}
		for rank := range 2 {
			l.Report(rank, step, "d", part(rank, "cc"), now)
		}
		if m, err := l.Outcome(step); m == nil || err != nil {
			t.Fatalf("step %d not committed: %v", step, err)
		}
	}
	if most > 4 {
		t.Fatalf("the ledger held %d steps at once; want at most 4", most)
	}
}

func serverPart(i int, sum string) Part {
	return Part{Stage: i, File: ServerPartFile(i), SHA256: sum, Bytes: int64(len(sum))}
}

// TestLedgerWaitsForEveryServer: with 2 parameter servers as ranks 4 and 5
// of a 2 × 2 grid, a step commits only once both servers' parts are in
// too, listed under server_parts; a server's part is not a stage's (server
// 1's part differs from stage 1's without the replicas' check minding),
// a server reporting a stage's file or another server's is refused, and a
// resume needs the servers to hold the step as well.
func TestLedgerWaitsForEveryServer(t *testing.T) {
	l := NewServerLedger(grid2x2, 2, plan100)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := l.Report(4, 10, "d", part(0, "aa"), now); err == nil {
		t.Error("server 0 reported stage 0's part and was not refused")
	}
	if err := l.Report(5, 10, "d", serverPart(0, "ss"), now); err == nil {
		t.Error("rank 5 (server 1) reported server 0's part and was not refused")
	}
	for rank, p := range []Part{part(0, "aa"), part(0, "aa"), part(1, "bb"), part(1, "bb"), serverPart(0, "s0")} {
		if err := l.Report(rank, 10, "d", p, now); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := l.Outcome(10); m != nil || err != nil {
		t.Fatalf("committed without server 1: %+v %v", m, err)
	}
	if got := l.Missing(10); len(got) != 1 || got[0] != 5 {
		t.Fatalf("missing = %v, want [5]", got)
	}
	if err := l.Report(5, 10, "d", serverPart(1, "s1"), now); err != nil {
		t.Fatal(err)
	}
	m, err := l.Outcome(10)
	if err != nil || m == nil {
		t.Fatalf("not committed: %v", err)
	}
	if m.Servers != 2 || len(m.ServerParts) != 2 || m.ServerParts[0] != serverPart(0, "s0") || m.ServerParts[1] != serverPart(1, "s1") || len(m.Parts) != 2 {
		t.Fatalf("manifest = %+v", m)
	}
	if err := m.check(); err != nil {
		t.Fatalf("the committed manifest fails its own check: %v", err)
	}

	l = NewServerLedger(grid2x2, 2, plan100)
	both := func(stage int, sum string) []Held {
		return []Held{{Step: 20, Part: part(stage, sum)}, {Step: 10, Part: part(stage, sum)}}
	}
	for rank, h := range [][]Held{both(0, "a"), both(0, "a"), both(1, "b"), both(1, "b"),
		{{Step: 20, Part: serverPart(0, "s")}, {Step: 10, Part: serverPart(0, "s")}}} {
		if err := l.Hold(rank, h); err != nil {
			t.Fatal(err)
		}
	}
	if _, decided := l.Resume(); decided {
		t.Fatal("decided without server 1's held parts")
	}
	if err := l.Hold(5, []Held{{Step: 10, Part: serverPart(1, "t")}}); err != nil {
		t.Fatal(err)
	}
	if step, decided := l.Resume(); !decided || step != 10 {
		t.Fatalf("resume = %d (decided %v), want 10: server 1 holds only step 10", step, decided)
	}
}
