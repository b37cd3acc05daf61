package data

import (
	"fmt"
	"slices"
	"sync"

	"github.com/pipetrain/pipetrain/internal/ownkeys"
)

// Kind is a kind of dataset, picked by a config's data.dataset. Register one
// to train on data pipetrain does not ship: the kind validates the data
// section's fields it reads, checks its data cheaply against the model before
// any stage starts, and opens the Source the pipeline's first and last stages
// draw their batches from.
//
// A config's data section holds the keys of every kind (see Section); a kind
// reads those it needs and leaves the others alone.
type Kind interface {
	// Name is the value of data.dataset that picks the kind.
	Name() string
	// Validate reports, through problem, each field of s the kind cannot
	// use (by its key, "data.corpus") and each way the model m does not fit
	// the kind. It reads no file. m is nil when the model section is itself
	// invalid.
	Validate(s *Section, m *Model, problem func(key, format string, args ...any))
	// Check checks the data s names against m before a run starts: that the
	// files exist, that their headers give examples of the model's size and
	// that no target lies beyond the model's classes or vocabulary. It
	// reads headers and small files (labels), never a whole dataset into
	// memory. Data not found on this machine is an error that wraps
	// fs.ErrNotExist; data unfit for the model one that wraps ErrBadData.
	Check(s *Section, m *Model) error
	// Open returns the source a stage draws its batches from, loading what
	// o says the stage needs and checking it as Check does, so that a stage
	// started on its own refuses bad data with Check's error.
	Open(s *Section, m *Model, o OpenOptions) (Source, error)
}

// Section is a config's data section as a kind sees it, with what a kind
// needs from the rest of the config to cut batches.
type Section struct {
	// Config is the config file, which errors name first.
	Config string
	// Dataset picks the kind.
	Dataset string
	// Dir is data.dir, relative paths taken from the config's folder.
	Dir string
	// Corpus, Glob, MaxBytes, Tokenizer and ValFraction are the text keys
	// (data.corpus etc.), Corpus as written.
	Corpus, Glob, Tokenizer string
	MaxBytes                int64
	ValFraction             float64
	// BatchSize is the examples of one step (data.batch_size), and
	// MicroBatch those of one micro-batch of one replica.
	BatchSize, MicroBatch int
	// Seed orders the examples (train.seed).
	Seed uint64
	// Evaluate says the run evaluates (train.evaluate or train.eval_every):
	// its held-out split is read too.
	Evaluate bool
	// Resolve takes a path of the config (data.corpus) from the config's
	// folder; nil leaves paths as they are.
	Resolve func(path string) string
	// Own holds the values of the kind's own keys (see OwnKeys), by key.
	Own map[string]any
}

// OwnKeys is implemented by a kind that reads data-section keys of its own,
// beyond Section's fields: a config naming the kind may give them, and the
// kind finds their values in Section.Own (DecodeOwn decodes them); a config
// naming another kind refuses them as unknown keys.
type OwnKeys interface {
	Keys() []KeyDoc
}

// KeyDoc describes one key of a kind's own.
type KeyDoc struct {
	// Key is the key inside the data section ("shards"), in lower case,
	// as configs match keys without regard to case.
	Key string
	// Type is its JSON Schema type: "integer", "number", "string",
	// "boolean" or "array".
	Type string
	// Doc says in one or more sentences what the key means.
	Doc string
}

// DecodeOwn decodes s.Own into v, a pointer to a struct whose json tags name
// the keys, key by key, reporting through problem each key whose value has
// the wrong type ("data.shards", "is a string, want an integer").
func (s *Section) DecodeOwn(v any, problem func(key, format string, args ...any)) {
	for _, p := range ownkeys.Decode(s.Own, v) {
		if p.Err != nil {
			problem("data."+p.Key, "%v", p.Err)
			continue
		}
		problem("data."+p.Key, "is %s", p)
	}
}

// KeysOf returns the own keys of the kind registered as name, if any.
func KeysOf(name string) []KeyDoc {
	k, _ := Lookup(name)
	if o, ok := k.(OwnKeys); ok {
		return o.Keys()
	}
	return nil
}

// resolve takes path from the config's folder.
func (s *Section) resolve(path string) string {
	if s.Resolve == nil {
		return path
	}
	return s.Resolve(path)
}

// Model is what a kind checks its data against.
type Model struct {
	// Name is model.name, for messages.
	Name string
	// Example is the shape of one input example: [features] for a
	// classifier, [context] for a language model.
	Example []int
	// Classes is the number of classes a target indexes: the vocabulary of
	// a language model.
	Classes int
	// Vocab is model.vocab as written (0 for a classifier).
	Vocab int
	// Targets is how many targets one example yields: 1 for a classifier,
	// the context for a language model.
	Targets int
}

// Features is the number of input values of one example.
func (m *Model) Features() int {
	n := 1
	for _, d := range m.Example {
		n *= d
	}
	return n
}

// OpenOptions says what a stage needs of the data, and hands in data the
// caller holds already.
type OpenOptions struct {
	// Inputs is set on the stage that reads the examples (the model's first
	// stage) and Targets on the one that scores them (its last): a source
	// may load only what they need.
	Inputs, Targets bool
	// Train, Test and Text are data already loaded, as reference runs and
	// tests hand in: a kind uses those of its own type instead of loading
	// them, and loads the rest.
	Train, Test *Dataset
	Text        *Text
}

// Inputs is a micro-batch's input buffer in the model's dtype: one of F32
// and F64 is set, or neither on a stage that reads no inputs.
type Inputs struct {
	F32 []float32
	F64 []float64
}

// Source serves the ends of the pipeline: the first stage's inputs and the
// last stage's targets, for training steps and evaluation passes. Every
// batch is a pure function of (seed, step, micro-batch), so both ends agree
// on it without talking, and targets never cross the wire. A replica's
// micro-batches are numbered after those of the replicas before it. A Source
// is used by one goroutine.
type Source interface {
	// Train fills x with micro-batch mb of step and returns its targets
	// when targets is set (nil otherwise).
	Train(step, mb int, x Inputs, targets bool) []int
	// EvalBatches is the number of micro-batches in one evaluation pass.
	EvalBatches() int
	// Eval fills x with evaluation micro-batch k and returns its targets
	// (when targets is set) and how many of its rows are real, the rest
	// padding.
	Eval(k int, x Inputs, targets bool) (y []int, rows int)
	// EvalName says what an evaluation reports on ("test", "validation").
	EvalName() string
	// NextToken says the targets are next tokens, so an evaluation reports
	// perplexity.
	NextToken() bool
}

var (
	kindsMu sync.RWMutex
	kinds   = map[string]Kind{}
)

// Register makes k the kind of data.dataset k.Name(), replacing a kind
// registered before under that name (as a program may replace a built-in
// one). Call it from an init function, before configs are validated; it
// panics on an empty name.
func Register(k Kind) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	name := k.Name()
	if name == "" {
		panic("data: Register of a dataset kind with no name")
	}
	kinds[name] = k
}

// Lookup returns the kind registered as name.
func Lookup(name string) (Kind, bool) {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	k, ok := kinds[name]
	return k, ok
}

// Kinds returns the registered kinds' names, sorted.
func Kinds() []string {
	kindsMu.RLock()
	defer kindsMu.RUnlock()
	var names []string
	for n := range kinds {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Open opens the source of s's kind for a stage.
func Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	k, ok := Lookup(s.Dataset)
	if !ok {
		return nil, fmt.Errorf("%s: data.dataset: unknown dataset %q", s.Config, s.Dataset)
	}
	return k.Open(s, m, o)
}
