package models

import (
	"fmt"
	"sort"
	"strings"

	"github.com/pipetrain/pipetrain/internal/ownkeys"
)

// Family is a kind of model that a config's model section names in
// model.name. A family owns its part of that section: it validates the keys
// it reads, says what they mean (the config schema takes its descriptions
// and allowed values from Doc), and builds the model. Families register
// themselves with Register in an init function, as mlp, cnn and gpt do; a
// program outside pipetrain registers its own the same way.
type Family interface {
	// Name is the model.name that selects the family.
	Name() string
	// Build validates spec and makes the model. It reports every problem it
	// finds, not only the first, as SpecErrors whose Field is the key in the
	// model section ("hidden[1]"), so that a config reports it as
	// model.hidden[1]. It ignores the keys it does not read: config
	// defaults fill in the image classifiers' sizes for every family.
	Build(Spec) (*Model, error)
	// Doc describes the family and the keys it reads.
	Doc() FamilyDoc
}

// FamilyDoc is what a family tells the config schema.
type FamilyDoc struct {
	// Summary says in a few words what the family builds ("Dense layers").
	Summary string
	// Keys are the model-section keys the family reads besides name and
	// dtype, which every family reads; an export's model_spec records
	// these.
	Keys []KeyDoc
}

// KeyDoc describes one model-section key as one family reads it.
type KeyDoc struct {
	// Key is the key inside the model section, e.g. "hidden", in lower
	// case, as configs match keys without regard to case.
	Key string
	// Type is "" for a key that is a field of Spec, and for a key of the
	// family's own, which it finds in Spec.Own, the key's JSON Schema type:
	// "integer", "number", "string", "boolean" or "array".
	Type string
	// Doc is one or more sentences on what the key means to the family.
	Doc string
	// Values, when not nil, lists every value the family accepts, the
	// default (which "" also means) first.
	Values []string
}

var registry = map[string]Family{}

// Register adds a model family under its name, replacing one registered
// before under the same name. It is meant to be called from init functions,
// before any config is loaded: the registry is not safe for concurrent
// registration.
func Register(f Family) { registry[f.Name()] = f }

// Lookup returns the family registered under name.
func Lookup(name string) (Family, bool) {
	f, ok := registry[name]
	return f, ok
}

// Names lists the registered model names, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build looks up spec.Name and builds the model.
func Build(spec Spec) (*Model, error) {
	f, ok := registry[spec.Name]
	if !ok {
		return nil, SpecErrors{{Field: "name", Msg: fmt.Sprintf("unknown model %q (known: %s)", spec.Name, strings.Join(Names(), ", "))}}
	}
	return f.Build(spec)
}

// family is a Family made of its three parts, for the families in this
// package.
type family struct {
	name  string
	build func(Spec) (*Model, error)
	doc   FamilyDoc
}

func (f family) Name() string                 { return f.name }
func (f family) Build(s Spec) (*Model, error) { return f.build(s) }
func (f family) Doc() FamilyDoc               { return f.doc }

// DecodeOwn decodes the family's own keys, spec.Own, into v, a pointer to a
// struct whose json tags name the keys. It decodes key by key, so that it
// reports every key whose value has the wrong type, as SpecErrors naming the
// key, in key order; a key v lacks is left alone (configs refuse a key no
// family documents before any family builds).
func DecodeOwn(spec Spec, v any) error {
	var errs SpecErrors
	for _, p := range ownkeys.Decode(spec.Own, v) {
		errs = append(errs, SpecError{Field: p.Key, Msg: p.String()})
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}
