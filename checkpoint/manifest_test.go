package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
)

func writeParts(t *testing.T, root string, step, stages int) {
	t.Helper()
	for s := 0; s < stages; s++ {
		ts := []Tensor{{Name: "w", Shape: []int{2}, F32: []float32{float32(step), float32(s)}}}
		if _, err := WritePart(root, step, s, ts, map[string]string{"step": strconv.Itoa(step)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCommitWaitsForEveryPart(t *testing.T) {
	root := t.TempDir()
	writeParts(t, root, 10, 2) // stages 0 and 1 of 3
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Commit(ctx, root, 10, 3, 0, "d", Keep(2), 5*time.Millisecond); err == nil || !strings.Contains(err.Error(), "stage 2") {
		t.Fatalf("commit with stage 2 missing: %v", err)
	}
	if _, err := os.Stat(filepath.Join(StepDir(root, 10), ManifestName)); !os.IsNotExist(err) {
		t.Fatal("manifest written for an incomplete checkpoint")
	}
	done := make(chan error, 1)
	go func() {
		_, err := Commit(context.Background(), root, 10, 3, 0, "d", Keep(2), 5*time.Millisecond)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if _, err := WritePart(root, 10, 2, []Tensor{{Name: "w", Shape: []int{1}, F32: []float32{1}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m, skipped, err := Latest(root, "d")
	if err != nil || m == nil || m.Step != 10 || len(skipped) != 0 || len(m.Parts) != 3 {
		t.Fatalf("Latest = %+v, %v, %v", m, skipped, err)
	}
}

func TestLatestSkipsCorruptAndForeign(t *testing.T) {
	root := t.TempDir()
	for _, step := range []int{5, 10, 15} {
		writeParts(t, root, step, 2)
		digest := "d"
		if step == 15 {
			digest = "other"
		}
		if _, err := Commit(context.Background(), root, step, 2, 0, digest, Keep(5), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	writeParts(t, root, 20, 1) // never committed
	part := filepath.Join(StepDir(root, 10), PartFile(1))
	b, _ := os.ReadFile(part)
	b[len(b)-1] ^= 1
	os.WriteFile(part, b, 0o644)

	m, skipped, err := Latest(root, "d")
	if err != nil {
		t.Fatal(err)
	}
	if m == nil || m.Step != 5 {
		t.Fatalf("latest good checkpoint is %+v, want step 5", m)
	}
	if len(skipped) != 3 || skipped[0].Committed || !strings.Contains(skipped[0].Error(), "step-00000020: no manifest.json: never committed") ||
		!strings.Contains(skipped[1].Error(), "another config") || !strings.Contains(skipped[2].Error(), "checksum mismatch") {
		t.Errorf("skipped: %v", skipped)
	}
	if bad := Unusable(skipped); len(bad) != 2 {
		t.Errorf("Unusable(%v) = %v, want the two committed ones", skipped, bad)
	}
	if err := RemoveAfter(root, 5); err != nil {
		t.Fatal(err)
	}
	if all, _ := steps(root); len(all) != 1 || all[0] != 5 {
		t.Errorf("after RemoveAfter(5): %v", all)
	}
}

func TestPruneKeepsNewest(t *testing.T) {
	root := t.TempDir()
	for _, step := range []int{1, 2, 3, 4} {
		writeParts(t, root, step, 1)
		if step != 2 { // 2 is a crash's leftover
			if _, err := Commit(context.Background(), root, step, 1, 0, "d", Keep(10), time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeParts(t, root, 5, 1) // in progress
	if err := Prune(root, Keep(2)); err != nil {
		t.Fatal(err)
	}
	all, _ := steps(root)
	if want := []int{5, 4, 3}; len(all) != len(want) || all[0] != 5 || all[1] != 4 || all[2] != 3 {
		t.Errorf("after Prune(2): %v, want %v", all, want)
	}
}

// TestLatestChecksTheManifestsStep: a manifest whose step is not its parts'
// (edited, or copied into another step's folder) makes its checkpoint
// unusable, named, and the one before it is used.
func TestLatestChecksTheManifestsStep(t *testing.T) {
	for name, edit := range map[string]func(t *testing.T, root string){
		"edited step": func(t *testing.T, root string) {
			m, err := ReadManifest(StepDir(root, 20))
			if err != nil {
				t.Fatal(err)
			}
			m.Step = 200
			b, _ := json.Marshal(m)
			if err := os.WriteFile(filepath.Join(StepDir(root, 20), ManifestName), b, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"moved folder": func(t *testing.T, root string) {
			if err := os.Rename(StepDir(root, 20), StepDir(root, 30)); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			for _, step := range []int{10, 20} {
				writeParts(t, root, step, 2)
				if _, err := Commit(context.Background(), root, step, 2, 0, "d", Keep(5), time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			edit(t, root)
			m, skipped, err := Latest(root, "d")
			if err != nil || m == nil || m.Step != 10 {
				t.Fatalf("Latest = %+v, %v: want step 10", m, err)
			}
			if len(skipped) != 1 || !skipped[0].Committed || !strings.Contains(skipped[0].Error(), "the manifest says step") {
				t.Errorf("skipped: %v", skipped)
			}
		})
	}
}

// TestManifestNamesOnlyItsParts: a manifest that names a file outside its
// folder, even one matching the checksum it gives, is refused where it is
// read, verified or written, and resuming passes over its checkpoint.
func TestManifestNamesOnlyItsParts(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "checkpoints")
	for _, step := range []int{10, 20} {
		writeParts(t, root, step, 2)
		if _, err := Commit(context.Background(), root, step, 2, 0, "d", Keep(5), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	// A file outside the checkpoints, with the bytes the manifest will give.
	b, err := os.ReadFile(filepath.Join(StepDir(root, 20), PartFile(1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := ReadManifest(StepDir(root, 20))
	if err != nil {
		t.Fatal(err)
	}
	m.Parts[1].File = "../../x"
	if err := m.Verify(); err == nil || !strings.Contains(err.Error(), `"../../x"`) {
		t.Fatalf("Verify: %v", err)
	}
	if err := m.VerifyPart(1); err == nil || !strings.Contains(err.Error(), `"../../x"`) {
		t.Fatalf("VerifyPart: %v", err)
	}
	if err := WriteManifest(t.TempDir(), m); err == nil || !strings.Contains(err.Error(), `"../../x"`) {
		t.Fatalf("WriteManifest: %v", err)
	}
	tampered, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(StepDir(root, 20), ManifestName), tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(StepDir(root, 20), ManifestName)
	if _, err := ReadManifest(StepDir(root, 20)); err == nil || !strings.Contains(err.Error(), manifest+`: the manifest names "../../x" as the part of stage 1`) {
		t.Fatalf("ReadManifest: %v", err)
	}
	latest, skipped, err := Latest(root, "d")
	if err != nil || latest == nil || latest.Step != 10 {
		t.Fatalf("Latest = %+v, %v: want step 10", latest, err)
	}
	if len(skipped) != 1 || !skipped[0].Committed || !strings.Contains(skipped[0].Error(), `"../../x"`) {
		t.Errorf("skipped: %v", skipped)
	}

	// A part listed twice, or of a stage the checkpoint lacks.
	m.Parts[1] = m.Parts[0]
	if err := WriteManifest(t.TempDir(), m); err == nil || !strings.Contains(err.Error(), "stage 0's part twice") {
		t.Fatalf("a stage twice: %v", err)
	}
	m.Parts[1] = Part{Stage: 2, File: PartFile(2)}
	if err := WriteManifest(t.TempDir(), m); err == nil || !strings.Contains(err.Error(), "part of stage 2") {
		t.Fatalf("a stage beyond the checkpoint's: %v", err)
	}
}

// umask is the process's file mode creation mask, which takes bits from
// the folders MkdirAll creates.
func umask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

// TestCheckpointsAreTheOwnersAlone: a checkpoint's folders are 0700 and its
// part, checksum and manifest 0600, unless the run directory is shared.
func TestCheckpointsAreTheOwnersAlone(t *testing.T) {
	for _, share := range []bool{false, true} {
		runlog.ShareRunDirs(share)
		root := filepath.Join(t.TempDir(), "checkpoints")
		writeParts(t, root, 10, 1)
		if _, err := Commit(context.Background(), root, 10, 1, 0, "d", Keep(2), time.Millisecond); err != nil {
			t.Fatal(err)
		}
		dir, file := os.FileMode(0o700), os.FileMode(0o600)
		if share {
			dir, file = 0o755&^umask(), 0o644
		}
		for _, p := range []string{root, StepDir(root, 10)} {
			if st, err := os.Stat(p); err != nil || st.Mode().Perm() != dir {
				t.Errorf("shared %v: %s: mode %v, %v; want %v", share, p, st.Mode().Perm(), err, dir)
			}
		}
		for _, name := range []string{PartFile(0), "stage-0.sha256", ManifestName} {
			p := filepath.Join(StepDir(root, 10), name)
			if st, err := os.Stat(p); err != nil || st.Mode().Perm() != file {
				t.Errorf("shared %v: %s: mode %v, %v; want %v", share, p, st.Mode().Perm(), err, file)
			}
		}
	}
	runlog.ShareRunDirs(false)
}

// TestCommitWaitsForEveryServer: with parameter servers a checkpoint is
// whole only with each server's shard; Commit waits for it, the manifest
// lists it, and a corrupt shard makes Latest pass the checkpoint over.
func TestCommitWaitsForEveryServer(t *testing.T) {
	root := t.TempDir()
	writeParts(t, root, 10, 2)
	shard := func(i int) {
		ts := []Tensor{{Name: "w", Shape: []int{1}, F32: []float32{float32(i)}}}
		if _, err := WriteServerPart(root, 10, i, ts, map[string]string{"step": "10"}); err != nil {
			t.Fatal(err)
		}
	}
	shard(0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Commit(ctx, root, 10, 2, 2, "d", Keep(2), 5*time.Millisecond); err == nil || !strings.Contains(err.Error(), "parameter server 1's part is not written") {
		t.Fatalf("commit with server 1's shard missing: %v", err)
	}
	shard(1)
	m, err := Commit(context.Background(), root, 10, 2, 2, "d", Keep(2), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if m.Servers != 2 || len(m.ServerParts) != 2 || m.ServerParts[1].File != "ps-1.safetensors" {
		t.Fatalf("manifest %+v", m)
	}
	got, _, err := Latest(root, "d")
	if err != nil || got == nil || len(got.ServerParts) != 2 {
		t.Fatalf("Latest = %+v, %v", got, err)
	}
	path := got.ServerPartPath(1)
	b, _ := os.ReadFile(path)
	b[len(b)-1] ^= 1
	os.WriteFile(path, b, 0o644)
	if got, skipped, _ := Latest(root, "d"); got != nil || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "ps-1.safetensors") {
		t.Fatalf("Latest with a corrupt shard = %+v, %v", got, skipped)
	}
}
