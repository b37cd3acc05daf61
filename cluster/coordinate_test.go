package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// rvJob is a registry whose rendezvous is complete, and the secret each
// rank joined with.
type rvJob struct {
	*Registry
	secrets []string
}

// co is rank's coordinator, as the process that joined as rank has it.
func (j rvJob) co(rank int) Coordinator {
	return Coordinator{Addr: j.Addr(), Rank: rank, Options: RendezvousOptions{Secret: j.secrets[rank]}}
}

// rvComplete serves a registry for world ranks (replicas per stage) and
// completes its rendezvous.
func rvComplete(t *testing.T, world, replicas int, gatherDir string) rvJob {
	t.Helper()
	return rvCompleteWith(t, world, RendezvousOptions{Timeout: 20 * time.Second, Replicas: replicas, GatherDir: gatherDir, Checkpoints: checkpoint.Plan{Every: 10, Steps: 100}})
}

// rvCompleteWith is rvComplete with the registry's options o; each rank
// joins with a secret of its own.
func rvCompleteWith(t *testing.T, world int, o RendezvousOptions) rvJob {
	t.Helper()
	j := rvJob{Registry: rvServe(t, world, o)}
	var joins []<-chan rvResult
	for rank := range world {
		j.secrets = append(j.secrets, NewSecret())
		joins = append(joins, rvJoin(j.Addr(), rvEntry(rank), RendezvousOptions{Token: o.Token, Timeout: 20 * time.Second, Secret: j.secrets[rank]}))
	}
	for _, ch := range joins {
		rvWantTable(t, "joiner", rvGet(t, ch), world)
	}
	return j
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
			co := reg.co(rank)
			m, err := co.Commit(context.Background(), 10, "train", coPart(rank/2, map[int]string{0: "aa", 1: "bb"}[rank/2]))
			results[rank] <- commitResult{m, err}
		}()
	}
	select {
	case r := <-results[0]:
		t.Fatalf("committed with rank 3's part missing: %v %v", r.m, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	co := reg.co(3)
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
			_, err := reg.co(rank).Commit(context.Background(), 20, "train", coPart(rank/2, sum))
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
			step, err := reg.co(rank).Resume(context.Background(), held[rank])
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

// rvOwns is what each rank writes in the gather tests: its event log and
// weights (bounded at 64 bytes), and for rank 0 run.json.
func rvOwns(rank int) map[string]int64 {
	own := map[string]int64{
		fmt.Sprintf("events/stage-%d.jsonl", rank):        16 << 20,
		fmt.Sprintf("weights/stage-%d.safetensors", rank): 64,
	}
	if rank == 0 {
		own["run.json"] = 1 << 20
	}
	return own
}

func TestGatherCopiesPrivateRunDirectories(t *testing.T) {
	rvLeaks(t)
	root := t.TempDir()
	// A folder others may list: what is gathered into it is the run's
	// owner's alone all the same (run_dir_mode private, the default).
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var log rvLog
	reg := rvCompleteWith(t, 4, RendezvousOptions{Timeout: 20 * time.Second, GatherDir: root, Owns: rvOwns, Logf: log.logf})
	private := t.TempDir()
	files := map[string]string{
		"events/stage-2.jsonl":          strings.Repeat("{\"step\":1}\n", 600000), // several pieces
		"weights/stage-2.safetensors":   "w",
		"events/stage-1.jsonl":          "{\"step\":1}\n",
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
	// Ranks 1 and 2 share a folder other than rank 0's: each sends its own
	// files, at once; a file that is absent is skipped.
	own := map[int][]string{1: {"events/stage-1.jsonl"}, 2: {"events/stage-2.jsonl", "weights/stage-2.safetensors", "events/absent.jsonl"}}
	sent := make(chan string, 2)
	for rank := 1; rank <= 2; rank++ {
		go func() {
			n, err := reg.co(rank).Gather(context.Background(), private, own[rank])
			sent <- fmt.Sprintf("rank %d: %d files, %v", rank, n, err)
		}()
	}
	got := []string{<-sent, <-sent}
	slices.Sort(got)
	if want := []string{"rank 1: 1 files, <nil>", "rank 2: 2 files, <nil>"}; !slices.Equal(got, want) {
		t.Fatalf("gathers: %q, want %q", got, want)
	}
	for rel, body := range files {
		got, err := os.ReadFile(filepath.Join(root, rel))
		wanted := slices.Contains(own[1], rel) || slices.Contains(own[2], rel)
		if wanted && (err != nil || string(got) != body) {
			t.Fatalf("%s: not gathered intact (%d bytes, %v)", rel, len(got), err)
		}
		if !wanted && err == nil {
			t.Fatalf("%s was gathered", rel)
		}
		if wanted {
			wantMode(t, filepath.Join(root, rel), runlog.PrivateFile)
			wantMode(t, filepath.Dir(filepath.Join(root, rel)), runlog.PrivateDir)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(root, "*", ".*gathering*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	// Rank 3 shares rank 0's directory: nothing travels.
	n, err := reg.co(3).Gather(context.Background(), root, []string{"events/stage-3.jsonl"})
	if err != nil || n != 0 {
		t.Fatalf("shared gather: %d files, %v; want 0", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reg.WaitGathered(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = reg.co(0).Gather(context.Background(), private, own[2])
	rvWantErr(t, "rank 0", err, "refused to gather rank 0")
}

// rvChunk is a whole file in one piece, as a client would send it.
func rvChunk(path, body string) fileChunk {
	sum := sha256.Sum256([]byte(body))
	return fileChunk{Path: path, Data: []byte(body), Last: true, SHA256: hex.EncodeToString(sum[:])}
}

// rvGatherAs plays a client that holds the token and calls itself rank,
// presenting secret: it sends chunks as they are, then the end of its
// gathering, and returns the registry's refusal or failure, if any.
func rvGatherAs(addr, token string, rank int, secret string, chunks ...fileChunk) error {
	co := Coordinator{Addr: addr, Rank: rank, Options: RendezvousOptions{Token: token, Secret: secret}}
	_, err := co.exchange(context.Background(), message{Gather: &gatherStart{Rank: rank}, Secret: secret}, func(c *transport.ServiceStream, m message) (bool, error) {
		if m.Gather == nil {
			return false, nil
		}
		for _, ch := range chunks {
			if err := c.Send(message{File: &ch}.marshal()); err != nil {
				return false, err
			}
		}
		return true, c.Send(message{Gathered: &gatherEnd{Files: len(chunks)}}.marshal())
	})
	return err
}

// TestGatherTakesOnlyWhatTheRankWrites plays, with the token in hand, each
// way a gather could write into rank 0's run directory what the rank did
// not write: every one is refused, logged on rank 0 naming the rank, the
// file and why, and rank 0's files stay as they were; rank 1's own gather
// still works, once.
func TestGatherTakesOnlyWhatTheRankWrites(t *testing.T) {
	rvLeaks(t)
	const token = "gather-token"
	root, outside := t.TempDir(), t.TempDir()
	var log rvLog
	reg := rvCompleteWith(t, 3, RendezvousOptions{Token: token, Timeout: 20 * time.Second, GatherDir: root, Owns: rvOwns, Logf: log.logf})
	rank0 := map[string]string{
		"run.json":                                "{}\n",
		"weights/stage-0.safetensors":             "stage 0",
		"checkpoints/step-10/stage-0.safetensors": "part 0",
		"checkpoints/step-10/manifest.json":       "{}",
		"checkpoints/x":                           "x",
	}
	for rel, body := range rank0 {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gatherID, err := os.ReadFile(filepath.Join(root, gatherIDFile))
	if err != nil {
		t.Fatal(err)
	}
	// A planted link from the run directory to outside it.
	if err := os.Symlink(outside, filepath.Join(root, "events")); err != nil {
		t.Fatal(err)
	}
	secret := reg.secrets[1]
	for _, c := range []struct {
		what   string
		secret string
		chunk  fileChunk
		want   []string // in the refusal and in rank 0's log
	}{
		{"a path through .", secret, rvChunk("./checkpoints/x", "poison"), []string{"rank 1's logs: ./checkpoints/x: not a clean relative path"}},
		{"a path through ..", secret, rvChunk("weights/../checkpoints/step-10/stage-0.safetensors", "poison"), []string{"rank 1's logs: weights/../checkpoints/step-10/stage-0.safetensors: not a clean relative path"}},
		{"the gather id as a folder", secret, rvChunk(gatherIDFile+"/.", "poison"), []string{"rank 1's logs: " + gatherIDFile + "/.: not a clean relative path"}},
		{"an absolute path", secret, rvChunk(filepath.Join(outside, "x"), "poison"), []string{"not a clean relative path"}},
		{"run.json", secret, rvChunk("run.json", "poison"), []string{"rank 1's logs: run.json: not a file rank 1 writes (it may send: events/stage-1.jsonl, weights/stage-1.safetensors)"}},
		{"rank 0's weights", secret, rvChunk("weights/stage-0.safetensors", "poison"), []string{"rank 1's logs: weights/stage-0.safetensors: not a file rank 1 writes"}},
		{"a file over its bound", secret, rvChunk("weights/stage-1.safetensors", strings.Repeat("w", 65)), []string{"rank 1's logs: weights/stage-1.safetensors: more than the 64 bytes"}},
		{"a file twice", secret, rvChunk("weights/stage-1.safetensors", "w"), []string{"rank 1's logs: weights/stage-1.safetensors: sent twice"}},
		{"through the planted link", secret, rvChunk("events/stage-1.jsonl", "poison"), []string{"rank 1's logs: events/stage-1.jsonl:", "escapes"}},
		{"without the secret", "", rvChunk("events/stage-1.jsonl", "poison"), []string{"a gather as rank 1 without the secret rank 1 joined with"}},
		{"with another rank's secret", reg.secrets[2], rvChunk("events/stage-1.jsonl", "poison"), []string{"a gather as rank 1 without the secret rank 1 joined with"}},
	} {
		chunks := []fileChunk{c.chunk}
		if c.what == "a file twice" {
			chunks = append(chunks, c.chunk)
		}
		err := rvGatherAs(reg.Addr(), token, 1, c.secret, chunks...)
		rvWantErr(t, c.what, err, c.want...)
		log.waitFor(t, c.want...)
	}
	for rel, body := range rank0 {
		if got, err := os.ReadFile(filepath.Join(root, rel)); err != nil || string(got) != body {
			t.Errorf("rank 0's %s: %q, %v; want it untouched", rel, got, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(root, gatherIDFile)); string(got) != string(gatherID) {
		t.Errorf("the gather id changed")
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("the planted link let a gather write outside the run directory: %v", left)
	}
	// None of that counts as rank 1's logs.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rvWantErr(t, "wait", reg.WaitGathered(ctx), "the logs of rank 1, 2 did not arrive")

	// Rank 1 itself sends its own files, once: a second gather, even with
	// the secret, is refused and changes nothing.
	os.Remove(filepath.Join(root, "events"))
	if err := rvGatherAs(reg.Addr(), token, 1, secret, rvChunk("events/stage-1.jsonl", "{}\n"), rvChunk("weights/stage-1.safetensors", "w")); err != nil {
		t.Fatal(err)
	}
	err = rvGatherAs(reg.Addr(), token, 1, secret, rvChunk("events/stage-1.jsonl", "poison"))
	rvWantErr(t, "a second gather", err, "rank 1's logs: rank 1 has sent its logs already")
	if got, _ := os.ReadFile(filepath.Join(root, "events", "stage-1.jsonl")); string(got) != "{}\n" {
		t.Errorf("rank 1's events: %q after a second gather", got)
	}
	if err := rvGatherAs(reg.Addr(), token, 2, reg.secrets[2]); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reg.WaitGathered(ctx); err != nil {
		t.Fatal(err)
	}
}

// A holder of the token who gathers as rank 1 while the job runs neither
// ends rank 0's wait nor takes the real rank 1's place (both happened
// before gathers carried the rank's secret).
func TestGatherAsAnotherRankMidRun(t *testing.T) {
	rvLeaks(t)
	const token = "gather-token"
	root, private := t.TempDir(), t.TempDir()
	reg := rvCompleteWith(t, 2, RendezvousOptions{Token: token, Timeout: 20 * time.Second, GatherDir: root, Owns: rvOwns, Logf: (&rvLog{}).logf})
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		waited <- reg.WaitGathered(ctx)
	}()
	for _, secret := range []string{"", NewSecret()} {
		_, err := Coordinator{Addr: reg.Addr(), Rank: 1, Options: RendezvousOptions{Token: token, Secret: secret}}.Gather(context.Background(), private, nil)
		rvWantErr(t, "an impostor's gather", err, "without the secret rank 1 joined with")
	}
	select {
	case err := <-waited:
		t.Fatalf("rank 0 stopped waiting for rank 1's logs after an impostor's gather: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := os.WriteFile(filepath.Join(private, "events.jsonl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	real := Coordinator{Addr: reg.Addr(), Rank: 1, Options: RendezvousOptions{Token: token, Secret: reg.secrets[1]}}
	if _, err := real.Gather(context.Background(), private, nil); err != nil {
		t.Fatalf("the real rank 1: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}

// A second process joining as a registered rank, from the same address,
// is refused; the process that registered may ask again.
func TestRendezvousSecretBindsTheRank(t *testing.T) {
	rvLeaks(t)
	reg := rvCompleteWith(t, 2, RendezvousOptions{Timeout: 20 * time.Second, Logf: (&rvLog{}).logf})
	o := RendezvousOptions{Timeout: 5 * time.Second, Secret: reg.secrets[1]}
	if _, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), o); err != nil {
		t.Fatalf("rank 1 asking again: %v", err)
	}
	o.Secret = NewSecret()
	_, err := JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), o)
	rvWantErr(t, "another process as rank 1", err, "rank 1 registered twice from 127.0.0.1:7101, by two processes")
	o.Secret = strings.Repeat("s", maxSecret+1)
	_, err = JoinRendezvous(context.Background(), reg.Addr(), rvEntry(1), o)
	rvWantErr(t, "a long secret", err, "its secret is 129 bytes, more than 128")
}

func TestWaitGatheredNamesMissingRanks(t *testing.T) {
	rvLeaks(t)
	reg := rvComplete(t, 3, 1, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	rvWantErr(t, "wait", reg.WaitGathered(ctx), "the logs of rank 1, 2 did not arrive")
}

// A registry told no rank's files takes none, and says so.
func TestGatherWithoutOwnsTakesNoFile(t *testing.T) {
	rvLeaks(t)
	root := t.TempDir()
	reg := rvCompleteWith(t, 2, RendezvousOptions{Timeout: 20 * time.Second, GatherDir: root, Logf: (&rvLog{}).logf})
	err := rvGatherAs(reg.Addr(), "", 1, reg.secrets[1], rvChunk("events/stage-1.jsonl", "{}\n"))
	rvWantErr(t, "a file", err, "rank 1's logs: events/stage-1.jsonl: rank 0 takes no files from rank 1")
	if _, err := os.Stat(filepath.Join(root, "events")); err == nil {
		t.Error("a file was gathered")
	}
}

// wantMode fails the test unless path has exactly the permission bits mode.
func wantMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != mode {
		t.Errorf("%s: mode %v, want %v", path, got, mode)
	}
}
