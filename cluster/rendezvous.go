package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/transport"
)

// The rendezvous lets ranks find each other when their addresses are not
// known in advance (ports picked at start, hosts assigned by the cluster):
// rank 0 serves a registry, every rank (rank 0 too) registers its stage's
// address, and all of them receive the whole table once the last rank is
// in. It also stops a job whose ranks disagree on the config or the binary
// before any link is dialed, naming the rank at fault.
//
// It travels as a transport.Service, so it is exactly as well guarded as
// the links: the same token, the same mutual TLS, loopback only without
// either. A joiner that is refused (wrong config, wrong build, a rank out of
// range or already taken) hears why; the registry logs it and keeps waiting
// for the right rank, so a stranger or a stray process cannot stop the job
// by knocking. If the ranks are not all in within the timeout, the registry
// and every waiting joiner fail naming the ranks that are missing.
//
// Wire format: one bidirectional stream per joiner carries JSON messages,
// each an object whose "rendezvous" field is the format's version
// (rendezvousVersion). The joiner sends one
//
//	{"rendezvous":2,"join":{"rank":2,"address":"10.0.0.3:7102","config_digest":"…","build":"…"}}
//
// and the registry answers with progress as ranks come and go, then one
// final message that ends the stream:
//
//	{"rendezvous":2,"world":4,"registered":[0,2]}        progress
//	{"rendezvous":2,"world":4,"table":[{"rank":0,…},…]}   final: every rank's entry, in rank order
//	{"rendezvous":2,"refused":"…"}                        final: this joiner is refused, and why
//	{"rendezvous":2,"failed":"…"}                         final: the rendezvous failed (timeout, closed)
//
// A message of another version, or with fields this version does not know,
// is refused with the versions named, never guessed at.
//
// Once every rank is in, the registry goes on serving the job for as long as
// rank 0 runs: checkpoint commits and the resume agreement (a
// checkpoint.Ledger) and the gathering of the ranks' logs into rank 0's run
// directory (coordinate.go has those messages).

// Entry is one rank's registration.
type Entry struct {
	Rank         int    `json:"rank"`
	Address      string `json:"address"`       // where the rank's stage listens (host:port)
	ConfigDigest string `json:"config_digest"` // configs.Config.Digest() of the rank's config
	Build        string `json:"build"`         // the binary's version, as Build gives it
}

func (e Entry) String() string { return fmt.Sprintf("rank %d (%s)", e.Rank, e.Address) }

// Bounds on the rendezvous's text. A joiner's message is read before
// anything about it is known (holding the token is enough to send one), so
// its fields are bounded on receipt, before any of them is logged or kept,
// and so is what the registry logs and keeps of its refusals.
const (
	// maxEntryText bounds each text field of an entry: an address is a host
	// name of at most 253 bytes and a port, a config digest 64 hex digits,
	// a build (Build) about 100 bytes.
	maxEntryText = 1 << 10
	// maxJoinMessage bounds a join message, checked before it is decoded:
	// an entry's text at its limit, JSON-escaped (up to 6 bytes a byte),
	// and a secret.
	maxJoinMessage = 32 << 10
	// maxReplyText bounds a refusal or failure a joiner reads from the
	// registry; a longer one is cut.
	maxReplyText = 64 << 10
	// maxRefusalText bounds a refusal as the registry logs and keeps it.
	// At most maxRefusalsKept distinct ones are kept (64 KiB in all), and
	// the first maxRefusalsLogged are logged in full; after them only a
	// count is logged, at every power of two.
	maxRefusalText    = 1 << 10
	maxRefusalsKept   = 64
	maxRefusalsLogged = 16
)

// check refuses an entry with a text field longer than maxEntryText,
// naming the field but not repeating it.
func (e Entry) check() error {
	for _, f := range []struct{ name, value string }{{"address", e.Address}, {"config digest", e.ConfigDigest}, {"build", e.Build}} {
		if len(f.value) > maxEntryText {
			return fmt.Errorf("rank %d: its %s is %d bytes, more than the %d an entry may hold", e.Rank, f.name, len(f.value), maxEntryText)
		}
	}
	return nil
}

// RendezvousOptions tune ServeRendezvous and JoinRendezvous. Zero values
// take the defaults.
type RendezvousOptions struct {
	// Token and TLS are the links' (transport.Options.Token, TLS): the
	// registry refuses a joiner without them as a listener refuses a dialer.
	Token string
	TLS   *transport.TLS
	// Timeout is how long the registry waits for all ranks, from
	// ServeRendezvous, and how long a joiner waits for the table, from
	// JoinRendezvous, its retries to reach the registry included; default
	// 5m.
	Timeout time.Duration
	// Logf receives the registry's refusals, which only the refused joiner
	// hears of otherwise; default log.Printf.
	Logf func(format string, args ...any)
	// Replicas is the registry's data_parallel, for its checkpoint ledger:
	// rank r runs stage r / Replicas. Default 1.
	Replicas int
	// Servers is how many of the last ranks are parameter servers
	// (configs.Config.PSRanks): they register and gather like every rank,
	// and the ledger waits for their shards (checkpoint.ServerPartFile)
	// beside the stages' parts.
	Servers int
	// GatherDir is rank 0's run directory, where the registry writes the
	// logs other ranks send (Coordinator.Gather); none are taken without.
	GatherDir string
	// Checkpoints is the run's checkpoint schedule, for the ledger: a rank
	// reporting a checkpoint of a step off it is refused.
	Checkpoints checkpoint.Plan
	// Owns lists, for a rank, the files it may send into GatherDir (paths
	// relative to it, with slashes), each with the most bytes the rank can
	// legitimately have written into it; the registry asks once per rank.
	// Without it no file is taken, only gathers into a shared directory.
	Owns func(rank int) map[string]int64
	// Secret is this process's own (NewSecret): JoinRendezvous registers it
	// with the rank, and a Coordinator presents it with every call, so that
	// rank 0 takes a rank's checkpoint parts and logs only from the process
	// that joined as that rank, not from anyone who holds the token. A
	// rank that joins without one can coordinate nothing.
	Secret string
}

const defaultRendezvousTimeout = 5 * time.Minute

func (o RendezvousOptions) withDefaults() RendezvousOptions {
	if o.Timeout <= 0 {
		o.Timeout = defaultRendezvousTimeout
	}
	if o.Logf == nil {
		o.Logf = log.Printf
	}
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	return o
}

func (o RendezvousOptions) transport() transport.Options {
	return transport.Options{Token: o.Token, TLS: o.TLS, Logf: o.Logf}
}

var rendezvousService = transport.Service{Name: "pipetrain.cluster.Rendezvous", Noun: "rendezvous"}

// rendezvousVersion 2 added the coordination after the table.
const rendezvousVersion = 2

// Registry is rank 0's side of the rendezvous.
type Registry struct {
	svc           *transport.ServiceServer
	addr          string
	world         int
	digest, build string
	timeout       time.Duration
	logf          func(format string, args ...any)
	timer         *time.Timer
	ready         chan struct{} // closed once the fields above are set

	gatherDir string
	gatherID  string // the token in gatherDir that tells a rank it shares the directory
	owns      func(rank int) map[string]int64

	mu       sync.Mutex
	ledger   *checkpoint.Ledger // commits and the resume agreement, after the table
	gathered []bool             // ranks whose logs are in
	arriving []bool             // ranks whose logs are on their way
	ranks    []*registration    // by rank; nil until the rank registers
	refusals []string           // distinct, in order, for the timeout's message
	refusedN int                // refusals so far, for the log's count
	changed  chan struct{}      // closed and replaced whenever ranks change
	done     chan struct{}      // closed once table or err is set
	table    []Entry
	err      error
}

// registration is a registered rank and the number of its calls still
// waiting for the table: a rank that retried after a dropped connection
// may briefly have two, and a rank with none has left.
type registration struct {
	entry   Entry
	secret  string // what the rank's coordination calls must present
	waiting int
}

// ServeRendezvous binds addr and serves the registry for world ranks, all
// of which must register with digest and build equal to the server's (a
// joiner that differs is refused, naming both values). Without o.Token or
// o.TLS it binds loopback addresses only, as links do. The registry waits
// o.Timeout for all ranks; Wait reports the outcome.
func ServeRendezvous(addr string, world int, digest, build string, o RendezvousOptions) (*Registry, error) {
	if world < 1 {
		return nil, fmt.Errorf("rendezvous at %s: a job needs at least 1 rank, not %d", addr, world)
	}
	o = o.withDefaults()
	if o.Servers < 0 || o.Servers >= world {
		return nil, fmt.Errorf("rendezvous at %s: %d of the job's %d ranks cannot be parameter servers: at least one rank runs a stage", addr, o.Servers, world)
	}
	stageOf := make([]int, world-o.Servers)
	for rank := range stageOf {
		stageOf[rank] = rank / o.Replicas
	}
	r := &Registry{
		world: world, digest: digest, build: build, timeout: o.Timeout, logf: o.Logf,
		gatherDir: o.GatherDir,
		owns:      o.Owns,
		ledger:    checkpoint.NewServerLedger(stageOf, o.Servers, o.Checkpoints),
		gathered:  make([]bool, world),
		arriving:  make([]bool, world),
		ranks:     make([]*registration, world),
		changed:   make(chan struct{}),
		done:      make(chan struct{}),
		ready:     make(chan struct{}),
	}
	if r.gatherDir != "" {
		id, err := writeGatherID(r.gatherDir)
		if err != nil {
			return nil, fmt.Errorf("rendezvous at %s: %w", addr, err)
		}
		r.gatherID = id
	}
	svc, err := rendezvousService.Serve(addr, o.transport(), r.serve)
	if err != nil {
		return nil, err
	}
	r.svc, r.addr = svc, svc.Addr()
	r.timer = time.AfterFunc(o.Timeout, r.expire)
	close(r.ready)
	return r, nil
}

// Addr is the bound address (useful after listening on 127.0.0.1:0).
func (r *Registry) Addr() string { return r.addr }

// Wait returns every rank's entry, indexed by rank, once all have
// registered, or why they did not: the timeout, naming the missing ranks
// (and any refusal meanwhile), or Close.
func (r *Registry) Wait() ([]Entry, error) {
	<-r.done
	if r.err != nil {
		return nil, r.err
	}
	return slices.Clone(r.table), nil
}

// Close stops serving. Joiners that already have the table keep it, and
// replies on their way still reach them; joiners still waiting fail.
func (r *Registry) Close() error {
	r.timer.Stop()
	r.finish(nil, fmt.Errorf("rendezvous at %s: closed before all %d ranks registered", r.addr, r.world))
	return r.svc.Close()
}

func (r *Registry) who() string { return "rendezvous at " + r.addr }

// finish sets the outcome once; later outcomes are dropped.
func (r *Registry) finish(table []Entry, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finishLocked(table, err)
}

func (r *Registry) finishLocked(table []Entry, err error) {
	select {
	case <-r.done:
		return
	default:
	}
	r.table, r.err = table, err
	close(r.done)
}

func (r *Registry) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var missing []int
	for rank, g := range r.ranks {
		if g == nil {
			missing = append(missing, rank)
		}
	}
	msg := notRegistered(r.who(), missing, r.world, r.timeout)
	if len(r.refusals) > 0 {
		const shown = 4
		msg += "; refused meanwhile: " + strings.Join(r.refusals[:min(len(r.refusals), shown)], "; ")
		if n := len(r.refusals) - shown; n > 0 {
			msg += fmt.Sprintf("; and %d more", n)
		}
	}
	r.finishLocked(nil, errors.New(msg))
}

// notRegistered is the timeout's message, the same at the registry and at
// a joiner whose own deadline passed first.
func notRegistered(who string, missing []int, world int, timeout time.Duration) string {
	noun := "ranks"
	if len(missing) == 1 {
		noun = "rank"
	}
	list := make([]string, len(missing))
	for i, m := range missing {
		list[i] = strconv.Itoa(m)
	}
	return fmt.Sprintf("%s: %s %s of %d did not register within %v", who, noun, strings.Join(list, ", "), world, timeout)
}

// registeredLocked lists the registered ranks, for progress messages.
func (r *Registry) registeredLocked() []int {
	var in []int
	for rank, g := range r.ranks {
		if g != nil {
			in = append(in, rank)
		}
	}
	return in
}

// broadcastLocked wakes every waiting call to report progress.
func (r *Registry) broadcastLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// register checks e and adds it, or says why not ("rank 5 (ADDR): ...").
// waiting reports whether the call should now wait for the outcome (and
// withdraw if it ends first).
func (r *Registry) register(e Entry, secret string) (refusal string, waiting bool) {
	refuse := func(format string, args ...any) string {
		return e.String() + ": " + fmt.Sprintf(format, args...)
	}
	switch {
	case len(secret) > maxSecret:
		return refuse("its secret is %d bytes, more than %d", len(secret), maxSecret), false
	case e.Rank < 0 || e.Rank >= r.world:
		return refuse("rank %d is beyond the job's %d ranks (0-%d)", e.Rank, r.world, r.world-1), false
	case e.ConfigDigest != r.digest:
		return refuse("its config digest %s differs from the rendezvous's %s (started from different configs or overrides)", short(e.ConfigDigest), short(r.digest)), false
	case e.Build != r.build:
		return refuse("its build %q differs from the rendezvous's %q (every rank must run the same binary)", e.Build, r.build), false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		// A rank whose connection dropped as the table went out may ask
		// again and get it; anyone else only hears the outcome.
		if r.err == nil && !r.ranks[e.Rank].same(e, secret) {
			return refuse("%s", registeredTwice(r.ranks[e.Rank], e)), false
		}
		return "", false
	default:
	}
	if g := r.ranks[e.Rank]; g != nil {
		if !g.same(e, secret) {
			return refuse("%s", registeredTwice(g, e)), false
		}
		g.waiting++
		return "", true
	}
	r.ranks[e.Rank] = &registration{entry: e, secret: secret, waiting: 1}
	r.broadcastLocked()
	if slices.Contains(r.ranks, nil) {
		return "", true
	}
	table := make([]Entry, r.world)
	for i, g := range r.ranks {
		table[i] = g.entry
	}
	r.timer.Stop()
	r.finishLocked(table, nil)
	return "", true
}

// withdraw ends one waiting call of rank; a rank with none left is no
// longer registered, so it may come back from another address (restarted
// on another port) rather than be refused as a duplicate.
func (r *Registry) withdraw(e Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return
	default:
	}
	g := r.ranks[e.Rank]
	if g == nil || g.entry != e {
		return
	}
	if g.waiting--; g.waiting == 0 {
		r.ranks[e.Rank] = nil
		r.broadcastLocked()
		r.logf("%s: %s left before all ranks registered", r.who(), e)
	}
}

// refused logs a refusal and keeps it for the timeout's message, both
// bounded (maxRefusalText, maxRefusalsKept, maxRefusalsLogged), so that
// a process that knocks again and again cannot fill rank 0's log or memory.
func (r *Registry) refused(msg string) {
	msg = words.Clip(msg, maxRefusalText)
	r.mu.Lock()
	r.refusedN++
	n := r.refusedN
	if !slices.Contains(r.refusals, msg) && len(r.refusals) < maxRefusalsKept {
		r.refusals = append(r.refusals, msg)
	}
	r.mu.Unlock()
	switch {
	case n <= maxRefusalsLogged:
		r.logf("%s refused %s", r.who(), msg)
	case n&(n-1) == 0:
		r.logf("%s has refused %d calls (the first %d are logged in full); the latest: %s", r.who(), n, maxRefusalsLogged, words.Clip(msg, 256))
	}
}

// serve is one joiner's call.
func (r *Registry) serve(c *transport.ServiceStream) error {
	<-r.ready // a joiner may call before ServeRendezvous has returned
	b, err := c.Recv()
	if err != nil {
		return err // gone before it said anything
	}
	var m message
	err = m.unmarshal(b)
	if err == nil && m.Join == nil {
		err = r.coordinates(m)
		if err == nil {
			return r.coordinate(c, m)
		}
	}
	if err != nil {
		r.refused(fmt.Sprintf("a joiner from %s: %v", c.Peer(), err))
		return c.Send(message{Refused: fmt.Sprintf("%s refused a joiner from %s: %v", r.who(), c.Peer(), err)}.marshal())
	}
	e := *m.Join
	refusal, waiting := r.register(e, m.Secret)
	if refusal != "" {
		r.refused(fmt.Sprintf("%s (joiner from %s)", refusal, c.Peer()))
		return c.Send(message{Refused: r.who() + " refused " + refusal}.marshal())
	}
	if waiting {
		defer r.withdraw(e) // a no-op once the outcome is out
	}
	var sent []int
	for {
		r.mu.Lock()
		changed, registered := r.changed, r.registeredLocked()
		r.mu.Unlock()
		select {
		case <-r.done:
			if r.err != nil {
				return c.Send(message{Failed: r.err.Error()}.marshal())
			}
			return c.Send(message{World: r.world, Table: r.table}.marshal())
		default:
		}
		if !slices.Equal(registered, sent) {
			if err := c.Send(message{World: r.world, Registered: registered}.marshal()); err != nil {
				return err
			}
			sent = registered
		}
		select {
		case <-r.done:
		case <-changed:
		case <-c.Context().Done():
			return c.Context().Err()
		}
	}
}

// JoinRendezvous registers e with the registry at addr and returns every
// rank's entry, indexed by rank, once all have registered. Rank 0 may
// start later than the others, so an unreachable registry is retried, for
// at most o.Timeout in all. A refusal (another config or build, a rank out
// of range or taken by another address, a bad token or certificate) is
// returned as soon as the registry sends it. If the table does not come
// within o.Timeout, the error names the ranks still missing.
func JoinRendezvous(ctx context.Context, addr string, e Entry, o RendezvousOptions) ([]Entry, error) {
	o = o.withDefaults()
	who := "rendezvous at " + addr
	if e.Rank < 0 {
		return nil, fmt.Errorf("%s: cannot join as rank %d", who, e.Rank)
	}
	if e.Address == "" {
		return nil, fmt.Errorf("%s: rank %d has no address to register", who, e.Rank)
	}
	jctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	join := message{Join: &e, Secret: o.Secret}.marshal()
	var table []Entry
	var progress *message // the last one heard, for a timeout's message
	err := rendezvousService.Call(jctx, addr, o.transport(), func(c *transport.ServiceStream) error {
		if err := c.Send(join); err != nil {
			return err
		}
		for {
			b, err := c.Recv()
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s ended the call without a reply", who)
			}
			if err != nil {
				return err
			}
			var m message
			if err := m.unmarshal(b); err != nil {
				return fmt.Errorf("%s: %w", who, err)
			}
			switch {
			case m.Refused != "":
				return errors.New(m.Refused)
			case m.Failed != "":
				return errors.New(m.Failed)
			case m.Table != nil:
				if err := checkTable(m.Table, m.World, e); err != nil {
					return fmt.Errorf("%s: %w", who, err)
				}
				table = m.Table
				return nil
			case m.Registered != nil:
				progress = &m
			default:
				return fmt.Errorf("%s: protocol error: a reply that is neither progress, table, refusal nor failure", who)
			}
		}
	})
	if err == nil {
		return table, nil
	}
	if ctx.Err() == nil && jctx.Err() != nil {
		if progress == nil {
			return nil, fmt.Errorf("%w (gave up after %v)", err, o.Timeout)
		}
		var missing []int
		for rank := range progress.World {
			if !slices.Contains(progress.Registered, rank) {
				missing = append(missing, rank)
			}
		}
		return nil, errors.New(notRegistered(who, missing, progress.World, o.Timeout))
	}
	return nil, err
}

// checkTable makes sure a table is whole and holds e as this rank sent it,
// before any address in it is dialed.
func checkTable(table []Entry, world int, e Entry) error {
	if len(table) != world || e.Rank >= world {
		return fmt.Errorf("protocol error: a table of %d entries for %d ranks, joined as rank %d", len(table), world, e.Rank)
	}
	for i, t := range table {
		if t.Rank != i {
			return fmt.Errorf("protocol error: entry %d of the table is rank %d", i, t.Rank)
		}
	}
	if table[e.Rank] != e {
		return fmt.Errorf("the table holds %s, not this rank's %s", table[e.Rank], e)
	}
	return nil
}

// message is every message of the wire format; exactly one of Join,
// Registered, Table, Refused, Failed and the coordination's kinds is set.
type message struct {
	Version    int     `json:"rendezvous"`
	Join       *Entry  `json:"join,omitempty"`
	World      int     `json:"world,omitempty"`
	Registered []int   `json:"registered,omitempty"`
	Table      []Entry `json:"table,omitempty"`
	Refused    string  `json:"refused,omitempty"`
	Failed     string  `json:"failed,omitempty"`

	Part      *partReport          `json:"part,omitempty"`
	Committed *checkpoint.Manifest `json:"committed,omitempty"`
	Held      *heldReport          `json:"held,omitempty"`
	Resume    *int                 `json:"resume,omitempty"`
	Gather    *gatherStart         `json:"gather,omitempty"`
	File      *fileChunk           `json:"file,omitempty"`
	Gathered  *gatherEnd           `json:"gathered,omitempty"`

	// Secret rides with a join (the secret the rank registers) and with
	// the first message of a coordination call (the same secret, proving
	// the caller is the process that joined as the rank); no other
	// message carries one.
	Secret string `json:"secret,omitempty"`
}

func (m message) marshal() []byte {
	m.Version = rendezvousVersion
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("cluster: rendezvous message: %v", err)) // plain data, nothing JSON cannot encode
	}
	return b
}

// unmarshal reads the version before anything else, so that a message of
// another version is refused as such rather than misread, then the rest
// strictly. The first pass also rejects anything after the message.
func (m *message) unmarshal(b []byte) error {
	// The first pass skips every value but the version (a join's too, into
	// an empty struct), so it allocates nothing for them; a value of an
	// unexpected type is left to the second pass to name.
	var v struct {
		Version *int      `json:"rendezvous"`
		Join    *struct{} `json:"join"`
	}
	var typeErr *json.UnmarshalTypeError
	if err := json.Unmarshal(b, &v); (err != nil && !errors.As(err, &typeErr)) || v.Version == nil {
		return fmt.Errorf("protocol error: expected a rendezvous message, got %d bytes starting %q", len(b), b[:min(len(b), 16)])
	}
	if *v.Version != rendezvousVersion {
		return fmt.Errorf("protocol error: unsupported rendezvous version %d (this build speaks version %d): the ranks run different pipetrain builds", *v.Version, rendezvousVersion)
	}
	if v.Join != nil && len(b) > maxJoinMessage {
		return fmt.Errorf("protocol error: bad rendezvous message: a join of %d bytes, more than the %d one may take", len(b), maxJoinMessage)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	var out message
	if err := d.Decode(&out); err != nil {
		// The decoder's message may quote the input (an unknown field's name).
		return fmt.Errorf("protocol error: bad rendezvous message: %s", words.Clip(err.Error(), maxRefusalText))
	}
	kinds := 0
	for _, set := range []bool{out.Join != nil, out.Registered != nil, out.Table != nil, out.Refused != "", out.Failed != "",
		out.Part != nil, out.Committed != nil, out.Held != nil, out.Resume != nil, out.Gather != nil, out.File != nil, out.Gathered != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return fmt.Errorf("protocol error: bad rendezvous message: %d kinds of content, want 1", kinds)
	}
	if err := out.checkText(); err != nil {
		return fmt.Errorf("protocol error: bad rendezvous message: %w", err)
	}
	*m = out
	return nil
}

// checkText bounds the text of the rendezvous's own kinds on receipt:
// entries (a join, a table) are refused beyond maxEntryText, a refusal or
// failure is cut to maxReplyText.
func (m *message) checkText() error {
	if m.Join != nil {
		if err := m.Join.check(); err != nil {
			return fmt.Errorf("join of %w", err)
		}
	}
	for i, e := range m.Table {
		if err := e.check(); err != nil {
			return fmt.Errorf("entry %d of the table, %w", i, err)
		}
	}
	m.Refused, m.Failed = words.Clip(m.Refused, maxReplyText), words.Clip(m.Failed, maxReplyText)
	return nil
}

// short abbreviates a digest for messages, as transport does.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
