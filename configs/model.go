package configs

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pipetrain/pipetrain/models"
)

// The model section is decoded into models.Spec: the keys of its fields,
// which several families read, and Spec.Own, the keys a family reads that
// no other does. Those are known only to the family registered under
// model.name, so the unknown-key check and the schema ask the registry.

// ownKeys are the keys of family name's own (models.KeyDoc with a Type).
func ownKeys(name string) []models.KeyDoc {
	f, ok := models.Lookup(name)
	if !ok {
		return nil
	}
	var out []models.KeyDoc
	for _, k := range f.Doc().Keys {
		if k.Type != "" {
			out = append(out, k)
		}
	}
	return out
}

// withFamilyKeys is root with the model section extended by the own keys of
// family name: the keys a config naming that family may give besides
// Spec's. A key of another family's own stays unknown.
func withFamilyKeys(root *keyTree, name string) *keyTree {
	own := ownKeys(name)
	if len(own) == 0 {
		return root
	}
	model := &keyTree{keys: maps.Clone(root.keys["model"].keys)}
	for _, k := range own {
		model.keys[k.Key] = &keyTree{}
	}
	out := &keyTree{keys: maps.Clone(root.keys), entry: root.entry}
	out.keys["model"] = model
	return out
}

// ownKeyTypes are the JSON Schema types a family may give its own keys.
var ownKeyTypes = []string{"integer", "number", "string", "boolean", "array"}

// addFamilyKeys adds every registered family's own keys to the model
// section of the schema root: a config may give each when it names that
// family, which the schema leaves to validation.
func (b *schemaBuilder) addFamilyKeys(root map[string]any) {
	owners := map[string][]ownKey{}
	for _, name := range models.Names() {
		for _, k := range ownKeys(name) {
			owners[name] = append(owners[name], ownKey{k.Key, k.Type})
		}
	}
	b.addOwnKeys(root, "model", "model family", "models.Spec; give it no Type", models.Names(), owners, func(key string, k ownKey) map[string]any {
		n := map[string]any{"type": k.Type, "description": b.docs[key]}
		if e, ok := b.enums[key]; ok {
			n["enum"] = e
		}
		return n
	})
}

// ownKey is a key a model family or a dataset kind reads besides its
// section's shared fields, with its JSON Schema type.
type ownKey struct{ Key, Type string }

// addOwnKeys adds the own keys of each owner (in the order of names) to
// section's properties in the schema root, refusing a type the schema
// cannot hold, a key that is a shared field (struct names the Go type), and
// one two owners give different types; node describes an accepted key.
func (b *schemaBuilder) addOwnKeys(root map[string]any, section, what, field string, names []string, owners map[string][]ownKey, node func(key string, k ownKey) map[string]any) {
	sec, _ := root["properties"].(map[string]any)[section].(map[string]any)
	props, _ := sec["properties"].(map[string]any)
	types := map[string]string{}
	for _, name := range names {
		for _, k := range owners[name] {
			key := section + "." + k.Key
			switch {
			case !slices.Contains(ownKeyTypes, k.Type):
				b.errs = append(b.errs, fmt.Sprintf("%s %s: %s has type %q, not one of %v", what, name, key, k.Type, ownKeyTypes))
				continue
			case types[key] == "" && props[k.Key] != nil:
				b.errs = append(b.errs, fmt.Sprintf("%s %s: %s is a field of %s", what, name, key, field))
				continue
			case types[key] != "" && types[key] != k.Type:
				b.errs = append(b.errs, fmt.Sprintf("%s %s: %s has type %s, another %s's %s", what, name, key, k.Type, strings.TrimPrefix(strings.TrimPrefix(what, "model "), "dataset "), types[key]))
				continue
			}
			types[key] = k.Type
			b.keys[key] = true
			props[k.Key] = node(key, k)
		}
	}
}
