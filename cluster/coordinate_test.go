package cluster

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
)

// rvComplete serves a registry for world ranks (replicas per stage) and
// completes its rendezvous.
func rvComplete(t *testing.T, world, replicas int, gatherDir string) *Registry {
	t.Helper()
	reg := rvServe(t, world, RendezvousOptions{Timeout: 20 * time.Second, Replicas: replicas, GatherDir: gatherDir, Checkpoints: checkpoint.Plan{Every: 10, Steps: 100}})
	var joins []<-chan rvResult
	for rank := range world {
		joins = append(joins, rvJoin(reg.Addr(), rvEntry(rank), RendezvousOptions{Timeout: 20 * time.Second}))
	}
	for _, j := range joins {
		rvWantTable(t, "joiner", rvGet(t, j), world)
	}
	return reg
}

func coPart(stage int, sum string) checkpoint.Part {
	return checkpoint.Part{Stage: stage, File: checkpoint.PartFile(stage), SHA256: sum, Bytes: 8}
}

type commitResult struct {
	m   *checkpoint.Manifest
	err error
}

func TestCoordinatorCommitsOnceEveryRankReported(t *testing.T) {
	rvLeaks(t)
	reg := rvComplete(t, 4, 2, "") // stages 0 and 1, two replicas each
	results := make([]chan commitResult, 4)
	for rank := range 4 {
		results[rank] = make(chan commitResult, 1)
		if rank == 3 {
			continue
		}
		go func() {
			co := Coordinator{Addr: reg.Addr(), Rank: rank}
			m, err := co.Commit(context.Background(), 10, "train", coPart(rank/2, map[int]string{0: "aa", 1: "bb"}[rank/2]))
			results[rank] <- commitResult{m, err}
		}()
	}
	select {
	case r := <-results[0]:
		t.Fatalf("committed with rank 3's part missing: %v %v", r.m, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	co := Coordinator{Addr: reg.Addr(), Rank: 3}
	m, err := co.Commit(context.Background(), 10, "train", coPart(1, "bb"))
	results[3] <- commitResult{m, err}
	for rank, ch := range results {
		r := <-ch
		if r.err != nil {
			t.Fatalf("rank %d: %v", rank, r.err)
		}
		if r.m.Step != 10 || r.m.Stages != 2 || len(r.m.Parts) != 2 || r.m.Parts[1].SHA256 != "bb" || r.m.ConfigDigest != "train" {
			t.Fatalf("rank %d: manifest %+v", rank, r.m)
		}
	}
	// Replicas whose parts differ: every rank hears the step failed.
	errs := make(chan error, 4)
	for rank, sum := range []string{"aa", "ab", "bb", "bb"} {
		go func() {
			_, err := Coordinator{Addr: reg.Addr(), Rank: rank}.Commit(context.Background(), 20, "train", coPart(rank/2, sum))
			errs <- err
		}()
	}
	for range 4 {
		rvWantErr(t, "diverged", <-errs, "checkpoint of step 20 not committed", "ranks 0 and 1, replicas of stage 0, wrote different parts")
	}
}

func TestCoordinatorAgreesWhereToResume(t *testing.T) {
	rvLeaks(t)
	reg := rvComplete(t, 2, 1, "")
	held := [][]checkpoint.Held{
		{{Step: 30, Part: coPart(0, "c")}, {Step: 20, Part: coPart(0, "b")}},
		{{Step: 20, Part: coPart(1, "y")}, {Step: 10, Part: coPart(1, "x")}},
	}
	steps := make(chan int, 2)
	for rank := range 2 {
		go func() {
			step, err := Coordinator{Addr: reg.Addr(), Rank: rank}.Resume(context.Background(), held[rank])
			if err != nil {
				t.Error(err)
			}
			steps <- step
		}()
	}
	for range 2 {
		if s := <-steps; s != 20 {
			t.Fatalf("resume from %d, want 20", s)
		}
	}
}

func TestCoordinationNeedsTheRendezvous(t *testing.T) {
	rvLeaks(t)
	reg := rvServe(t, 2, RendezvousOptions{Timeout: 20 * time.Second, Logf: (&rvLog{}).logf})
	_, err := Coordinator{Addr: reg.Addr(), Rank: 1}.Commit(context.Background(), 10, "train", coPart(1, "x"))
	rvWantErr(t, "commit before the table", err, "coordination before every rank registered")
}

func TestGatherCopiesPrivateRunDirectories(t *testing.T) {
	rvLeaks(t)
	root := t.TempDir()
	reg := rvComplete(t, 3, 1, root)
	private := t.TempDir()
	files := map[string]string{
		"events/stage-2.jsonl":          strings.Repeat("{\"step\":1}\n", 600000), // several pieces
		"weights/stage-2.safetensors":   "w",
		"checkpoints/step-10/stage-2.x": "never sent",
		".hidden":                       "never sent",
	}
	for rel, body := range files {
		p := filepath.Join(private, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	own := []string{"events/stage-2.jsonl", "weights/stage-2.safetensors", "events/absent.jsonl"}
	n, err := Coordinator{Addr: reg.Addr(), Rank: 2}.Gather(context.Background(), private, own)
	if err != nil || n != 2 {
		t.Fatalf("gather: %d files, %v; want the 2 that exist", n, err)
	}
	_, err = Coordinator{Addr: reg.Addr(), Rank: 2}.Gather(context.Background(), private, []string{"checkpoints/step-10/stage-2.x"})
	rvWantErr(t, "a checkpoint", err, "not a log of the run directory")
	for rel, body := range files {
		got, err := os.ReadFile(filepath.Join(root, rel))
		sent := slices.Contains(own, rel)
		if sent && (err != nil || string(got) != body) {
			t.Fatalf("%s: not gathered intact (%d bytes, %v)", rel, len(got), err)
		}
		if !sent && err == nil {
			t.Fatalf("%s was gathered", rel)
		}
	}
	// Two ranks sending the same file at once: both succeed, one copy lands.
	errs := make(chan error, 2)
	for rank := 1; rank <= 2; rank++ {
		go func() {
			_, err := Coordinator{Addr: reg.Addr(), Rank: rank}.Gather(context.Background(), private, own[:1])
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent gathers: %v", err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(root, own[0])); string(got) != files[own[0]] {
		t.Fatalf("%s damaged by concurrent gathers", own[0])
	}
	if left, _ := filepath.Glob(filepath.Join(root, "events", ".*gathering*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	// Rank 1 shares rank 0's directory: nothing travels.
	n, err = Coordinator{Addr: reg.Addr(), Rank: 1}.Gather(context.Background(), root, own)
	if err != nil || n != 0 {
		t.Fatalf("shared gather: %d files, %v; want 0", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reg.WaitGathered(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = Coordinator{Addr: reg.Addr(), Rank: 0}.Gather(context.Background(), private, own)
	rvWantErr(t, "rank 0", err, "refused to gather rank 0")
}

func TestWaitGatheredNamesMissingRanks(t *testing.T) {
	rvLeaks(t)
	reg := rvComplete(t, 3, 1, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rvWantErr(t, "wait", reg.WaitGathered(ctx), "the logs of rank 1, 2 did not arrive")
}
