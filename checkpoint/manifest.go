package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
)

// A run's checkpoints live under one root folder, one folder per step:
//
//	ROOT/step-00000150/stage-0.safetensors   weights and optimizer state of stage 0
//	ROOT/step-00000150/stage-0.sha256        its checksum, written after it
//	ROOT/step-00000150/ps-1.safetensors      parameter server 1's shard, with servers
//	ROOT/step-00000150/manifest.json         written last, once every part is in
//
// Each stage writes its own part. On a run directory every process shares, one
// process (stage 0) commits the checkpoint by writing the manifest once every
// part is present and matches its checksum (Commit). Where each process has a
// folder of its own, the parts' checksums travel instead: a Ledger decides the
// commit from what every rank reports, and each rank writes the same manifest
// into its own folder (WriteManifest), naming parts it does not hold. A folder
// without a manifest is a checkpoint still being written, or one a crash
// interrupted: it is never resumed from on a shared directory; on private ones
// the ranks agree on the newest step that every one of them holds (Held,
// Ledger.Hold).

// ManifestName is the file whose presence commits a checkpoint.
const ManifestName = "manifest.json"

// Part is one stage's file in a checkpoint.
type Part struct {
	Stage  int    `json:"stage"`
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
}

// Manifest describes a committed checkpoint.
type Manifest struct {
	Step         int       `json:"step"`
	ConfigDigest string    `json:"config_digest"`
	Stages       int       `json:"stages"`
	Parts        []Part    `json:"parts"`
	Committed    time.Time `json:"committed"`
	// Servers is parameter_servers.count, and ServerParts their shards
	// (each Part's Stage is the server's index, its File ServerPartFile's):
	// the weights and optimizer state live on the servers, so a checkpoint
	// is whole only with every server's part.
	Servers     int    `json:"servers,omitempty"`
	ServerParts []Part `json:"server_parts,omitempty"`

	// Dir is the checkpoint's folder; it is not stored.
	Dir string `json:"-"`
}

// StepDir is the folder of step's checkpoint under root.
func StepDir(root string, step int) string {
	return filepath.Join(root, fmt.Sprintf("step-%08d", step))
}

// PartFile is the name of a stage's part inside a checkpoint folder.
func PartFile(stage int) string { return fmt.Sprintf("stage-%d.safetensors", stage) }

// ServerPartFile is the name of parameter server i's part inside a
// checkpoint folder.
func ServerPartFile(i int) string { return fmt.Sprintf("ps-%d.safetensors", i) }

// WritePart writes stage's part of step's checkpoint, then its checksum file,
// both atomically: a checksum file on disk always describes a complete part.
// It returns the part as a manifest lists it.
func WritePart(root string, step, stage int, tensors []Tensor, meta map[string]string) (Part, error) {
	return writePart(root, step, stage, PartFile(stage), tensors, meta)
}

// WriteServerPart writes parameter server i's part of step's checkpoint as
// WritePart writes a stage's.
func WriteServerPart(root string, step, i int, tensors []Tensor, meta map[string]string) (Part, error) {
	return writePart(root, step, i, ServerPartFile(i), tensors, meta)
}

func writePart(root string, step, index int, file string, tensors []Tensor, meta map[string]string) (Part, error) {
	dir := StepDir(root, step)
	if err := runlog.MkdirAll(dir); err != nil {
		return Part{}, err
	}
	sum, size, err := WriteChecked(filepath.Join(dir, file), tensors, meta)
	return Part{Stage: index, File: file, SHA256: sum, Bytes: size}, err
}

// readSum reads a part's checksum file.
func readSum(dir string, stage int) (sum string, size int64, err error) {
	return readSumFile(filepath.Join(dir, PartFile(stage)))
}

// fileSum hashes a file.
func fileSum(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Commit waits until every stage and every one of servers parameter servers
// has written its part of step's checkpoint and each part matches its
// checksum, then writes the manifest atomically and deletes the committed
// checkpoints keep does not retain (Prune). It polls every interval until ctx
// ends; a part that does not match its checksum yet (being rewritten) is waited for.
func Commit(ctx context.Context, root string, step, stages, servers int, digest string, keep Retention, interval time.Duration) (*Manifest, error) {
	dir := StepDir(root, step)
	m := &Manifest{Step: step, ConfigDigest: digest, Stages: stages, Servers: servers, Dir: dir}
	// Verified so far; each part is hashed once it is complete.
	parts, serverParts := make([]*Part, stages), make([]*Part, servers)
	for {
		missing := collectParts(dir, parts, PartFile, "stage")
		if missing == "" {
			missing = collectParts(dir, serverParts, ServerPartFile, "parameter server")
		}
		if missing == "" {
			for _, p := range parts {
				m.Parts = append(m.Parts, *p)
			}
			for _, p := range serverParts {
				m.ServerParts = append(m.ServerParts, *p)
			}
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("checkpoint of step %d not committed: %s: %w", step, missing, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
	m.Committed = time.Now().UTC()
	if err := WriteManifest(root, m); err != nil {
		return nil, err
	}
	return m, Prune(root, keep)
}

// WriteManifest commits m's checkpoint under root by writing its manifest
// atomically. Ranks that share root may all write the same manifest: the
// bytes are the same, and each rename replaces a whole file.
func WriteManifest(root string, m *Manifest) error {
	if err := m.check(); err != nil {
		return err
	}
	dir := StepDir(root, m.Step)
	if err := runlog.MkdirAll(dir); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	return WriteAtomic(filepath.Join(dir, ManifestName), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// Held is a part a rank holds on its own disk, complete and matching its
// checksum file, for the ranks to agree on where to resume.
type Held struct {
	Step int  `json:"step"`
	Part Part `json:"part"`
}

// HeldParts lists stage's parts under root that are complete and match
// their checksum files and whose training digest (the part's metadata) is
// digest, newest first. A part being written, torn by a crash or left by
// another config is left out: no rank resumes from it.
func HeldParts(root string, stage int, digest string) ([]Held, error) {
	all, err := steps(root)
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, s := range all {
		dir := StepDir(root, s)
		sum, size, err := readSum(dir, stage)
		if err != nil {
			continue
		}
		path := filepath.Join(dir, PartFile(stage))
		got, n, err := fileSum(path)
		if err != nil || got != sum || n != size {
			continue
		}
		if meta, err := ReadMeta(path); err != nil || meta["training_digest"] != digest || (meta["step"] != "" && meta["step"] != strconv.Itoa(s)) {
			continue
		}
		out = append(out, Held{Step: s, Part: Part{Stage: stage, File: PartFile(stage), SHA256: sum, Bytes: size}})
	}
	return out, nil
}

// collectParts verifies the parts of a checkpoint folder not verified yet
// (nil in parts), part i being the file file(i) of the owner noun i;
// missing says which one is not ready, or is empty when all are.
func collectParts(dir string, parts []*Part, file func(int) string, noun string) (missing string) {
	for s, p := range parts {
		if p != nil {
			continue
		}
		path := filepath.Join(dir, file(s))
		sum, size, err := readSumFile(path)
		if err != nil {
			return fmt.Sprintf("%s %d's part is not written", noun, s)
		}
		got, n, err := fileSum(path)
		if err != nil || got != sum || n != size {
			return fmt.Sprintf("%s %d's part does not match its checksum yet", noun, s)
		}
		parts[s] = &Part{Stage: s, File: file(s), SHA256: sum, Bytes: size}
	}
	return ""
}

// ReadManifest reads the manifest of one checkpoint folder.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestName), err)
	}
	m.Dir = dir
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// check refuses a manifest that names any file but its stages' parts, or
// one stage's twice: every reader joins the names to the checkpoint's
// folder, and a name such as ../../x would read, or let export copy, a
// file outside it. A manifest comes from disk, where anyone who can write
// the run directory may have edited it, or from rank 0 over the wire.
func (m *Manifest) check() error {
	seen := map[int]bool{}
	for _, p := range m.Parts {
		if err := m.checkPart(p); err != nil {
			return err
		}
		if seen[p.Stage] {
			return fmt.Errorf("%s: the manifest lists stage %d's part twice", m.path(), p.Stage)
		}
		seen[p.Stage] = true
	}
	servers := map[int]bool{}
	for _, p := range m.ServerParts {
		if p.Stage < 0 || p.Stage >= m.Servers || p.File != ServerPartFile(p.Stage) || servers[p.Stage] {
			return fmt.Errorf("%s: the manifest names %q as the part of parameter server %d; a checkpoint of %d servers holds each server's ps-<i>.safetensors once, for i below %d",
				m.path(), p.File, p.Stage, m.Servers, m.Servers)
		}
		servers[p.Stage] = true
	}
	return nil
}

// checkPart refuses a part whose file is not the one its stage writes.
func (m *Manifest) checkPart(p Part) error {
	if p.Stage < 0 || p.Stage >= m.Stages || p.File != PartFile(p.Stage) {
		return fmt.Errorf("%s: the manifest names %q as the part of stage %d; a checkpoint of %d stages holds only stage-<i>.safetensors for i below %d",
			m.path(), p.File, p.Stage, m.Stages, m.Stages)
	}
	return nil
}

// path is the manifest's file, for messages; its step's name when the
// manifest came over the wire and has no folder yet.
func (m *Manifest) path() string {
	if m.Dir == "" {
		return fmt.Sprintf("the manifest of step %d", m.Step)
	}
	return filepath.Join(m.Dir, ManifestName)
}

// Verify checks every part of a committed checkpoint against the manifest's
// checksums.
func (m *Manifest) Verify() error {
	if len(m.Parts) != m.Stages {
		return fmt.Errorf("%s: manifest lists %d parts for %d stages", m.Dir, len(m.Parts), m.Stages)
	}
	if len(m.ServerParts) != m.Servers {
		return fmt.Errorf("%s: manifest lists %d parts for %d parameter servers", m.Dir, len(m.ServerParts), m.Servers)
	}
	for _, p := range m.Parts {
		if err := m.verify(p); err != nil {
			return err
		}
	}
	for _, p := range m.ServerParts {
		if err := m.verifyFile(m.ServerPartPath(p.Stage), p); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manifest) verify(p Part) error {
	if err := m.checkPart(p); err != nil {
		return err
	}
	return m.verifyFile(m.PartPath(p.Stage), p)
}

// verifyFile checks the part p at path against its checksum and step.
func (m *Manifest) verifyFile(path string, p Part) error {
	sum, n, err := fileSum(path)
	if err != nil {
		return err
	}
	if sum != p.SHA256 || n != p.Bytes {
		return fmt.Errorf("%s: checksum mismatch (%d bytes, sha256 %.12s; manifest says %d bytes, %.12s): the file is corrupt", path, n, sum, p.Bytes, p.SHA256)
	}
	return m.checkStep(path)
}

// checkStep holds the manifest's step against the folder it is in and the
// step the part at path records: the manifest is the one file of a
// checkpoint no checksum covers, and a step it misstates would resume the
// run at the wrong step (and skip or repeat steps of its data).
func (m *Manifest) checkStep(path string) error {
	manifest := filepath.Join(m.Dir, ManifestName)
	meta, err := ReadMeta(path)
	if err != nil {
		return err
	}
	// Parts written before the step was recorded have none to compare.
	if got, ok := meta["step"]; ok && got != strconv.Itoa(m.Step) {
		return fmt.Errorf("%s: the manifest says step %d, its part %s says step %s: the manifest was edited or copied from another checkpoint", manifest, m.Step, filepath.Base(path), got)
	}
	if m.Dir != "" && filepath.Base(m.Dir) != filepath.Base(StepDir("", m.Step)) {
		return fmt.Errorf("%s: the manifest says step %d, its folder is %s: the folder was renamed or the manifest copied from another checkpoint", manifest, m.Step, filepath.Base(m.Dir))
	}
	return nil
}

// VerifyPart checks the one part of a committed checkpoint that a rank
// holds on its own disk against the manifest's checksum.
func (m *Manifest) VerifyPart(stage int) error {
	for _, p := range m.Parts {
		if p.Stage == stage {
			return m.verify(p)
		}
	}
	return fmt.Errorf("%s: the manifest lists no part of stage %d", m.Dir, stage)
}

// PartPath is stage's file in the checkpoint.
func (m *Manifest) PartPath(stage int) string { return filepath.Join(m.Dir, PartFile(stage)) }

// ServerPartPath is parameter server i's file in the checkpoint.
func (m *Manifest) ServerPartPath(i int) string { return filepath.Join(m.Dir, ServerPartFile(i)) }

// steps lists the step folders under root, newest first.
func steps(root string) ([]int, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name(), "step-"); ok && e.IsDir() {
			if s, err := strconv.Atoi(n); err == nil {
				out = append(out, s)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return out, nil
}

// Skipped is a checkpoint folder Latest passed over, and why.
type Skipped struct {
	Dir string
	// Committed is false for a folder without a manifest: a checkpoint
	// still being written, one a crash interrupted, or one whose manifest
	// was deleted. Such a folder is no sign that the run's checkpoints are
	// unusable, as a committed one that fails its checks is.
	Committed bool
	Err       error
}

func (s *Skipped) Error() string { return s.Err.Error() }
func (s *Skipped) Unwrap() error { return s.Err }

// Latest returns the newest committed checkpoint under root that belongs to a run
// of the given digest, whose files all match their checksums and whose
// manifest's step is its parts', or nil if there is none. Each newer
// checkpoint folder passed over, committed or not, is reported in skipped,
// with why.
func Latest(root, digest string) (m *Manifest, skipped []*Skipped, err error) {
	all, err := steps(root)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range all {
		dir := StepDir(root, s)
		m, err := ReadManifest(dir)
		if errors.Is(err, os.ErrNotExist) {
			skipped = append(skipped, &Skipped{Dir: dir, Err: fmt.Errorf("%s: no %s: never committed (the run stopped while writing it) or the manifest was deleted", dir, ManifestName)})
			continue
		}
		if err == nil && m.ConfigDigest != digest {
			err = fmt.Errorf("%s: written by a run of another config (digest %.12s, this run's is %.12s)", dir, m.ConfigDigest, digest)
		}
		if err == nil {
			err = m.Verify()
		}
		if err != nil {
			skipped = append(skipped, &Skipped{Dir: dir, Committed: true, Err: err})
			continue
		}
		return m, skipped, nil
	}
	return nil, skipped, nil
}

// Unusable is the committed checkpoints among skipped: where there are some
// and Latest found none to use, the run has checkpoints, all of them bad.
func Unusable(skipped []*Skipped) []*Skipped {
	var out []*Skipped
	for _, s := range skipped {
		if s.Committed {
			out = append(out, s)
		}
	}
	return out
}

// MetricKey is the metadata key of a checkpoint part that records the
// evaluation of its step (its loss), by which Retention.Best ranks it.
const MetricKey = "val_loss"

// Retention says which committed checkpoints Prune keeps: the newest Keep,
// and the Best whose parts record the lowest MetricKey (lower is better),
// whether or not they are among the newest.
type Retention struct{ Keep, Best int }

// Keep retains the newest n committed checkpoints.
func Keep(n int) Retention { return Retention{Keep: n} }

// Prune deletes the committed checkpoints keep does not retain, and any
// uncommitted folder older than the newest committed one (a crash's leftovers).
func Prune(root string, keep Retention) error {
	all, err := steps(root)
	if err != nil {
		return err
	}
	var committed []int // newest first
	for _, s := range all {
		if _, err := os.Stat(filepath.Join(StepDir(root, s), ManifestName)); err == nil {
			committed = append(committed, s)
		}
	}
	retained := map[int]bool{}
	for i, s := range committed {
		retained[s] = i < keep.Keep
	}
	for _, s := range best(root, committed, keep.Best) {
		retained[s] = true
	}
	newest := -1
	if len(committed) > 0 {
		newest = committed[0]
	}
	for _, s := range all {
		kept, isCommitted := retained[s]
		switch {
		case kept:
			continue
		case !isCommitted && (newest < 0 || s > newest):
			continue // may still be being written
		}
		if err := os.RemoveAll(StepDir(root, s)); err != nil {
			return err
		}
	}
	return nil
}

// best returns the n of steps whose parts record the lowest metric, the
// newer first among equals; a checkpoint without one is not ranked.
func best(root string, steps []int, n int) []int {
	if n <= 0 {
		return nil
	}
	type ranked struct {
		step   int
		metric float64
	}
	var rs []ranked
	for _, s := range steps {
		if v, ok := stepMetric(StepDir(root, s)); ok {
			rs = append(rs, ranked{s, v})
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].metric < rs[j].metric })
	var out []int
	for i := 0; i < len(rs) && i < n; i++ {
		out = append(out, rs[i].step)
	}
	return out
}

// stepMetric reads the metric a checkpoint's parts record, from whichever
// part the folder holds (each process's own folder may hold only its own).
func stepMetric(dir string) (float64, bool) {
	parts, _ := filepath.Glob(filepath.Join(dir, "stage-*.safetensors"))
	for _, p := range parts {
		meta, err := ReadMeta(p)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseFloat(meta[MetricKey], 64); err == nil {
			return v, true
		}
	}
	return 0, false
}

// RemoveAfter deletes every checkpoint folder, committed or not, of a step after
// step: a resumed run recomputes those steps and must not mix its parts with
// those of the attempt that failed.
func RemoveAfter(root string, step int) error {
	all, err := steps(root)
	if err != nil {
		return err
	}
	for _, s := range all {
		if s > step {
			if err := os.RemoveAll(StepDir(root, s)); err != nil {
				return err
			}
		}
	}
	return nil
}
