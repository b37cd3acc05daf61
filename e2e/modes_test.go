package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunDirectoriesAreTheOwners launches a run whose stages meet at a
// rendezvous (checkpoints committed through rank 0, logs gathered there)
// and then resumes it: every folder of its run directory is 0700 and every
// file 0600, weights, checkpoints, logs and the gather's id included, so
// other users of the host read nothing. With --share-run-dir, which the
// resume keeps, they are 0755 and 0644 as before.
func TestRunDirectoriesAreTheOwners(t *testing.T) {
	needData(t)
	body := strings.Replace(gridMLP, "checkpoint: {every: 0}", "checkpoint: {every: 10, keep: 3}", 1) + "\nschedule: 1f1b\nstages:\n  - {layers: \"0-1\", address: auto}\n  - {layers: \"2-3\", address: auto}\n"
	cfg := filepath.Join(t.TempDir(), "modes.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	mask := syscall.Umask(0)
	syscall.Umask(mask)
	for _, share := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "runs", "modes")
		args := []string{"launch", "--config", cfg, "--run-dir", dir, "--steps", "20"}
		wantDir, wantFile := fs.FileMode(0o700), fs.FileMode(0o600)
		if share {
			args = append(args, "--share-run-dir")
			wantDir, wantFile = 0o755&^fs.FileMode(mask), 0o644
		}
		if r := run(t, 3*time.Minute, nil, args...); r.err != nil {
			t.Fatalf("launch (shared %v): %v\n%s", share, r.err, r.out)
		}
		if r := run(t, 3*time.Minute, nil, "launch", "--resume", dir, "--steps", "30"); r.err != nil {
			t.Fatalf("launch --resume (shared %v): %v\n%s", share, r.err, r.out)
		}
		var seen []string
		err := filepath.WalkDir(filepath.Dir(dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			st, err := os.Stat(p)
			if err != nil {
				return err
			}
			want := wantFile
			if d.IsDir() {
				want = wantDir
			}
			if st.Mode().Perm() != want {
				t.Errorf("shared %v: %s has mode %v, want %v", share, p, st.Mode().Perm(), want)
			}
			rel, _ := filepath.Rel(dir, p)
			seen = append(seen, rel)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"launch.json", "run.json", "metrics.jsonl", "events/stage-1.jsonl", "weights/stage-0.safetensors", "weights/stage-0.sha256",
			"logs", "checkpoints/step-00000030/manifest.json", "checkpoints/step-00000030/stage-1.safetensors", ".pipetrain-gather-id"} {
			if !slices.Contains(seen, f) {
				t.Errorf("shared %v: the run directory lacks %s (it holds %v)", share, f, seen)
			}
		}
	}
}
