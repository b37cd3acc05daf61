package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/transport"
)

// After the table, the registry coordinates the job's ranks, each of which
// may keep its run directory on its own disk. Each is one call of the
// rendezvous service, opened by a rank with its first message:
//
//	{"part":{"rank":2,"step":20,"digest":"…","part":{…}}}     a checkpoint part is written;
//	    the reply, once every rank's part of step 20 is in:  {"committed":{manifest}} or {"failed":"…"}
//	{"held":{"rank":2,"parts":[{"step":20,"part":{…}},…]}}    a restarted rank's parts;
//	    the reply, once every rank's are in:                 {"resume":20}
//	{"gather":{"rank":2,"id":"…"}}                             a rank's logs, for rank 0's run directory;
//	    the reply: {"gathered":{"rank":2,"shared":true}} when the rank's run directory is rank 0's,
//	    else {"gather":{"rank":2}}, after which the rank sends {"file":{…}}… and {"gathered":{"files":5}},
//	    and the final reply is                               {"gathered":{"rank":2,"files":5}}
//
// All of them need the rendezvous to have completed: a rank that is not in
// the table has nothing to coordinate. Each first message also carries
// "secret", the secret the rank joined with: the token lets a process speak
// to the registry, the secret lets it speak for one rank, so that a holder
// of the token cannot commit, resume or gather in another process's name.
//
// What a gather may write is bounded by what the rank itself writes: only
// the files RendezvousOptions.Owns gives the rank, named exactly as it
// gives them (no ".", "..", absolute or uncleaned path), each at most once
// and no larger than its bound, so a rank sends at most the sum of its
// files' bounds; a rank gathers once, and everything is written through an
// os.Root on the run directory, so that no symbolic link leads outside it.
// A refusal names the rank, the file and why, and rank 0 logs it.

// partReport is a rank's checkpoint part, written to its disk.
type partReport struct {
	Rank   int             `json:"rank"`
	Step   int             `json:"step"`
	Digest string          `json:"digest"` // the run's training digest
	Part   checkpoint.Part `json:"part"`
}

// heldReport is what a restarted rank holds on its disk.
type heldReport struct {
	Rank  int               `json:"rank"`
	Parts []checkpoint.Held `json:"parts"`
}

// gatherStart opens a rank's gathering; ID is the gather token the rank
// found in its own run directory ("" for none): the registry's own means the
// directory is shared, and nothing need travel.
type gatherStart struct {
	Rank int    `json:"rank"`
	ID   string `json:"id"`
}

// fileChunk is a piece of one file; the last piece of a file carries the
// whole file's SHA-256.
type fileChunk struct {
	Path   string `json:"path"` // relative to the run directory, with slashes
	Data   []byte `json:"data"`
	Last   bool   `json:"last,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// gatherEnd closes a rank's gathering, and is the registry's answer.
type gatherEnd struct {
	Rank  int  `json:"rank"`
	Files int  `json:"files"`
	Share bool `json:"shared,omitempty"` // nothing travelled: the directory is rank 0's
}

// gatherIDFile holds the registry's gather token in rank 0's run directory.
const gatherIDFile = ".pipetrain-gather-id"

// maxSecret bounds the secret a joiner registers; NewSecret's are 26 bytes.
const maxSecret = 128

// NewSecret draws a process's rendezvous secret (RendezvousOptions.Secret).
func NewSecret() string { return rand.Text() }

// same says whether e with secret is g again: the process that registered
// it, retrying, rather than another process claiming its rank.
func (g *registration) same(e Entry, secret string) bool {
	return g.entry == e && subtle.ConstantTimeCompare([]byte(g.secret), []byte(secret)) == 1
}

// registeredTwice is the refusal of e, whose rank g holds.
func registeredTwice(g *registration, e Entry) string {
	if g.entry.Address == e.Address {
		return fmt.Sprintf("rank %d registered twice from %s, by two processes (their secrets differ)", e.Rank, e.Address)
	}
	return fmt.Sprintf("rank %d registered twice: from %s and %s", e.Rank, g.entry.Address, e.Address)
}

// gatherChunk bounds a file piece: JSON carries bytes as base64, and a
// service message is at most 16 MiB.
const gatherChunk = 4 << 20

func writeGatherID(dir string) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b)
	if err := runlog.MkdirAll(dir); err != nil {
		return "", err
	}
	return id, checkpoint.WriteAtomic(filepath.Join(dir, gatherIDFile), func(w io.Writer) error {
		_, err := io.WriteString(w, id)
		return err
	})
}

// coordinates says whether m may open a coordination call now.
func (r *Registry) coordinates(m message) error {
	if m.Part == nil && m.Held == nil && m.Gather == nil {
		return errors.New("protocol error: the first message is not a join, a part, a held list or a gather")
	}
	select {
	case <-r.done:
		if r.err != nil {
			return fmt.Errorf("the rendezvous failed: %v", r.err)
		}
		return r.speaksFor(m)
	default:
		return errors.New("coordination before every rank registered")
	}
}

// speaksFor checks that m carries the secret of the rank it speaks for,
// once the table is complete.
func (r *Registry) speaksFor(m message) error {
	var rank int
	var kind string
	switch {
	case m.Part != nil:
		rank, kind = m.Part.Rank, "checkpoint part"
	case m.Held != nil:
		rank, kind = m.Held.Rank, "held list"
	default:
		rank, kind = m.Gather.Rank, "gather"
	}
	if rank < 0 || rank >= r.world {
		return fmt.Errorf("a %s as rank %d, beyond the job's %d ranks (0-%d)", kind, rank, r.world, r.world-1)
	}
	g := r.ranks[rank] // complete and fixed once done
	if g.secret == "" || subtle.ConstantTimeCompare([]byte(g.secret), []byte(m.Secret)) != 1 {
		return fmt.Errorf("a %s as rank %d without the secret rank %d joined with: only the process that joined as rank %d speaks for it", kind, rank, rank, rank)
	}
	return nil
}

// coordinate serves one coordination call, opened by m.
func (r *Registry) coordinate(c *transport.ServiceStream, m message) error {
	var reply message
	var err error
	switch {
	case m.Part != nil:
		reply, err = r.awaitCommit(c.Context(), *m.Part)
	case m.Held != nil:
		reply, err = r.awaitResume(c.Context(), *m.Held)
	default:
		reply, err = r.receiveGather(c, *m.Gather)
	}
	if err != nil {
		return err
	}
	return c.Send(reply.marshal())
}

// awaitCommit records a part and answers once its step is decided.
func (r *Registry) awaitCommit(ctx context.Context, p partReport) (message, error) {
	return r.record(ctx, func(l *checkpoint.Ledger) error {
		return l.Report(p.Rank, p.Step, p.Digest, p.Part, time.Now())
	}, func(l *checkpoint.Ledger) (message, bool) {
		m, err := l.Outcome(p.Step)
		switch {
		case err != nil:
			return message{Failed: fmt.Sprintf("%s: checkpoint of step %d not committed: %v", r.who(), p.Step, err)}, true
		case m != nil:
			return message{Committed: m}, true
		}
		return message{}, false
	})
}

// awaitResume records what a rank holds and answers once every rank has.
func (r *Registry) awaitResume(ctx context.Context, h heldReport) (message, error) {
	return r.record(ctx, func(l *checkpoint.Ledger) error {
		return l.Hold(h.Rank, h.Parts)
	}, func(l *checkpoint.Ledger) (message, bool) {
		step, decided := l.Resume()
		return message{Resume: &step}, decided
	})
}

// record feeds the ledger one rank's report, then waits until answer has
// the reply: a refused report is answered at once.
func (r *Registry) record(ctx context.Context, report func(*checkpoint.Ledger) error, answer func(*checkpoint.Ledger) (message, bool)) (message, error) {
	r.mu.Lock()
	err := report(r.ledger)
	r.broadcastLocked()
	r.mu.Unlock()
	if err != nil {
		r.refused(err.Error())
		return message{Refused: r.who() + " refused " + err.Error()}, nil
	}
	for {
		r.mu.Lock()
		reply, ok := answer(r.ledger)
		changed := r.changed
		r.mu.Unlock()
		if ok {
			return reply, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return message{}, ctx.Err()
		}
	}
}

// receiveGather writes the files a rank sends into rank 0's run directory,
// each atomically and only when it differs from what is there.
func (r *Registry) receiveGather(c *transport.ServiceStream, g gatherStart) (message, error) {
	if g.Rank <= 0 || g.Rank >= r.world {
		return message{Refused: fmt.Sprintf("%s refused to gather rank %d: ranks 1-%d send their logs to rank 0", r.who(), g.Rank, r.world-1)}, nil
	}
	if r.gatherDir == "" {
		return message{Refused: r.who() + " takes no logs: rank 0 has no run directory to gather into"}, nil
	}
	if err := r.claimGather(c.Context(), g.Rank); err != nil {
		return r.refuseGather(g.Rank, err), nil
	}
	gathered := false
	defer func() { r.releaseGather(g.Rank, gathered) }()
	end := gatherEnd{Rank: g.Rank, Share: g.ID == r.gatherID}
	if !end.Share {
		if err := c.Send(message{Gather: &gatherStart{Rank: g.Rank}}.marshal()); err != nil {
			return message{}, err
		}
		n, err := r.receiveFiles(c, g.Rank)
		var no *gatherRefusal
		switch {
		case errors.As(err, &no):
			return r.refuseGather(g.Rank, err), nil
		case err != nil:
			msg := fmt.Sprintf("%s: rank %d's logs: %v", r.who(), g.Rank, err)
			r.logf("%s", msg)
			return message{Failed: msg}, nil
		}
		end.Files = n
	}
	gathered = true
	return message{Gathered: &end}, nil
}

// gatherRefusal is what a rank may not send: the file (or "" for the whole
// gathering) and why.
type gatherRefusal struct {
	path string
	why  string
}

func (e *gatherRefusal) Error() string {
	if e.path == "" {
		return e.why
	}
	return e.path + ": " + e.why
}

func refuseFile(path, format string, args ...any) error {
	return &gatherRefusal{path: path, why: fmt.Sprintf(format, args...)}
}

// refuseGather logs a refused gathering of rank and is the rank's reply.
func (r *Registry) refuseGather(rank int, err error) message {
	msg := fmt.Sprintf("rank %d's logs: %v", rank, err)
	r.refused(msg)
	return message{Refused: r.who() + " refused " + msg}
}

// claimGather makes this call rank's one gathering. A rank whose logs are
// in is refused; a call of the rank still under way (its connection
// dropped and the rank retried) is waited for.
func (r *Registry) claimGather(ctx context.Context, rank int) error {
	for {
		r.mu.Lock()
		gathered, arriving, changed := r.gathered[rank], r.arriving[rank], r.changed
		if !gathered && !arriving {
			r.arriving[rank] = true
		}
		r.mu.Unlock()
		switch {
		case gathered:
			return refuseFile("", "rank %d has sent its logs already, and a rank sends them once", rank)
		case !arriving:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// releaseGather ends rank's gathering, which brought its logs in or not.
func (r *Registry) releaseGather(rank int, gathered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arriving[rank] = false
	r.gathered[rank] = r.gathered[rank] || gathered
	r.broadcastLocked()
}

// receiveFiles receives rank's files until the end of its gathering and
// returns how many arrived.
func (r *Registry) receiveFiles(c *transport.ServiceStream, rank int) (int, error) {
	var owned map[string]int64
	if r.owns != nil {
		owned = r.owns(rank)
	}
	root, err := os.OpenRoot(r.gatherDir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	// Gathered files take the modes of every other file of the run
	// directory (run_dir_mode), whatever the folder they land in allows.
	dirMode, fileMode := runlog.DirMode(), runlog.FileMode()
	sent := map[string]bool{}
	for {
		b, err := c.Recv()
		if err != nil {
			return len(sent), err
		}
		var m message
		if err := m.unmarshal(b); err != nil {
			return len(sent), refuseFile("", "%v", err)
		}
		if m.Gathered != nil {
			if m.Gathered.Files != len(sent) {
				return len(sent), refuseFile("", "rank %d sent %d files and announced %d", rank, len(sent), m.Gathered.Files)
			}
			return len(sent), nil
		}
		if m.File == nil {
			return len(sent), refuseFile("", "protocol error: rank %d sent neither a file nor the end of its gathering", rank)
		}
		limit, err := ownedFile(rank, m.File.Path, owned)
		if err == nil && sent[m.File.Path] {
			err = refuseFile(m.File.Path, "sent twice")
		}
		if err != nil {
			return len(sent), err
		}
		sent[m.File.Path] = true
		if err := receiveFile(c, root, *m.File, limit, dirMode, fileMode); err != nil {
			return len(sent), err
		}
	}
}

// ownedFile checks a path a rank sends against owned, the files it writes,
// as given by RendezvousOptions.Owns, and returns the file's bound.
func ownedFile(rank int, p string, owned map[string]int64) (int64, error) {
	if p == "" || path.IsAbs(p) || path.Clean(p) != p || !filepath.IsLocal(filepath.FromSlash(p)) {
		return 0, refuseFile(p, "not a clean relative path inside the run directory")
	}
	limit, ok := owned[p]
	switch {
	case len(owned) == 0:
		return 0, refuseFile(p, "rank 0 takes no files from rank %d (it knows none that rank %d writes)", rank, rank)
	case !ok:
		list := slices.Sorted(maps.Keys(owned))
		return 0, refuseFile(p, "not a file rank %d writes (it may send: %s)", rank, strings.Join(list, ", "))
	}
	return limit, nil
}

// receiveFile receives one file, starting with first, its pieces following
// on c, into root: under a temporary name of its own, then renamed.
func receiveFile(c *transport.ServiceStream, root *os.Root, first fileChunk, limit int64, dirMode, fileMode os.FileMode) (err error) {
	rel := first.Path
	dir := path.Dir(rel)
	if err := root.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	tmp := path.Join(dir, "."+path.Base(rel)+".gathering-"+rand.Text())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			root.Remove(tmp)
		}
	}()
	h := sha256.New()
	var size int64
	chunk := first
	for {
		if chunk.Path != rel {
			return refuseFile(rel, "protocol error: a piece of %s inside it", chunk.Path)
		}
		if size += int64(len(chunk.Data)); size > limit {
			return refuseFile(rel, "more than the %d bytes its writer can write into it", limit)
		}
		if _, err := f.Write(chunk.Data); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		h.Write(chunk.Data)
		if chunk.Last {
			break
		}
		b, err := c.Recv()
		if err != nil {
			return err
		}
		var m message
		if err := m.unmarshal(b); err != nil {
			return refuseFile(rel, "%v", err)
		}
		if m.File == nil {
			return refuseFile(rel, "protocol error: it ended without its last piece")
		}
		chunk = *m.File
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != chunk.SHA256 {
		return refuseFile(rel, "arrived with sha256 %.12s, sent with %.12s", got, chunk.SHA256)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if old, err := rootFileSHA256(root, rel); err == nil && old == chunk.SHA256 {
		return root.Remove(tmp)
	}
	if err := root.Rename(tmp, rel); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

func rootFileSHA256(root *os.Root, rel string) (string, error) {
	f, err := root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Excuse stops WaitGathered waiting for rank's logs: the rank is gone
// and the run went on without it (a worker of async parameter servers the
// launcher saw die), so its logs will never come.
func (r *Registry) Excuse(rank int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gathered[rank] = true
	r.broadcastLocked()
}

// WaitGathered returns once every rank but rank 0 has sent its logs (or
// been excused), or when ctx ends, naming the ranks whose logs are missing.
func (r *Registry) WaitGathered(ctx context.Context) error {
	for {
		r.mu.Lock()
		var missing []string
		for rank := 1; rank < r.world; rank++ {
			if !r.gathered[rank] {
				missing = append(missing, fmt.Sprint(rank))
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%s: the logs of rank %s did not arrive: %w", r.who(), strings.Join(missing, ", "), context.Cause(ctx))
		}
	}
}

// Coordinator is a rank's side of the coordination: it reaches rank 0's
// registry at Addr with Options' security, and speaks for Rank with
// Options.Secret, the secret the rank joined with. Each method is one call, safe to
// make from several goroutines at once.
type Coordinator struct {
	Addr    string
	Rank    int
	Options RendezvousOptions
}

func (co Coordinator) who() string { return "rendezvous at " + co.Addr }

// exchange sends first and returns the registry's final reply: an error
// for a refusal or a failure. A reply that is more's business (a go-ahead)
// goes to more, whose answer is sent before the next reply is read.
func (co Coordinator) exchange(ctx context.Context, first message, more func(*transport.ServiceStream, message) (bool, error)) (message, error) {
	o := co.Options.withDefaults()
	b := first.marshal()
	var reply message
	err := rendezvousService.Call(ctx, co.Addr, o.transport(), func(c *transport.ServiceStream) error {
		if err := c.Send(b); err != nil {
			return err
		}
		for {
			reply = message{}
			in, err := c.Recv()
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s ended the call without a reply", co.who())
			}
			if err != nil {
				return err
			}
			if err := reply.unmarshal(in); err != nil {
				return fmt.Errorf("%s: %w", co.who(), err)
			}
			if more == nil || reply.Refused != "" || reply.Failed != "" {
				return nil
			}
			if handled, err := more(c, reply); err != nil || !handled {
				return err
			}
		}
	})
	switch {
	case err != nil:
		return message{}, err
	case reply.Refused != "":
		return message{}, errors.New(reply.Refused)
	case reply.Failed != "":
		return message{}, errors.New(reply.Failed)
	}
	return reply, nil
}

// Commit reports p, this rank's part of step's checkpoint, and returns the
// step's manifest once every rank has reported its own.
func (co Coordinator) Commit(ctx context.Context, step int, digest string, p checkpoint.Part) (*checkpoint.Manifest, error) {
	reply, err := co.exchange(ctx, message{Part: &partReport{Rank: co.Rank, Step: step, Digest: digest, Part: p}, Secret: co.Options.Secret}, nil)
	if err != nil {
		return nil, err
	}
	if reply.Committed == nil || reply.Committed.Step != step {
		return nil, fmt.Errorf("%s: protocol error: the reply to a part of step %d is not its commit", co.who(), step)
	}
	return reply.Committed, nil
}

// Resume reports the parts this rank holds and returns the step every rank
// resumes from (0: from the start), once every rank has reported.
func (co Coordinator) Resume(ctx context.Context, held []checkpoint.Held) (int, error) {
	reply, err := co.exchange(ctx, message{Held: &heldReport{Rank: co.Rank, Parts: held}, Secret: co.Options.Secret}, nil)
	if err != nil {
		return 0, err
	}
	if reply.Resume == nil {
		return 0, fmt.Errorf("%s: protocol error: the reply to a held list is not a step", co.who())
	}
	return *reply.Resume, nil
}

// Gather sends files (relative to runDir; those that exist) to rank 0's
// run directory, unless runDir is that directory, and returns how many
// travelled. files must be this rank's own (stages.Outputs): ranks that
// share a folder other than rank 0's each send theirs.
func (co Coordinator) Gather(ctx context.Context, runDir string, files []string) (int, error) {
	id, _ := os.ReadFile(filepath.Join(runDir, gatherIDFile))
	var present []string
	for _, rel := range files {
		if st, err := os.Stat(filepath.Join(runDir, rel)); err == nil && st.Mode().IsRegular() {
			present = append(present, rel)
		}
	}
	reply, err := co.exchange(ctx, message{Gather: &gatherStart{Rank: co.Rank, ID: string(id)}, Secret: co.Options.Secret}, func(c *transport.ServiceStream, m message) (bool, error) {
		if m.Gather == nil {
			return false, nil // the final reply
		}
		return true, sendFiles(c, runDir, present)
	})
	if err != nil {
		return 0, err
	}
	if reply.Gathered == nil {
		return 0, fmt.Errorf("%s: protocol error: the reply to a gathering is not its end", co.who())
	}
	return reply.Gathered.Files, nil
}

// sendFiles streams files (relative to dir), then the end of the gathering.
func sendFiles(c *transport.ServiceStream, dir string, files []string) error {
	for _, rel := range files {
		if err := sendFile(c, dir, rel); err != nil {
			return err
		}
	}
	return c.Send(message{Gathered: &gatherEnd{Files: len(files)}}.marshal())
}

func sendFile(c *transport.ServiceStream, dir, rel string) error {
	b, err := os.ReadFile(filepath.Join(dir, rel))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	for off := 0; ; off += gatherChunk {
		end := min(off+gatherChunk, len(b))
		chunk := fileChunk{Path: filepath.ToSlash(rel), Data: b[off:end]}
		if end == len(b) {
			chunk.Last, chunk.SHA256 = true, hex.EncodeToString(sum[:])
		}
		if err := c.Send(message{File: &chunk}.marshal()); err != nil {
			return err
		}
		if chunk.Last {
			return nil
		}
	}
}
