package configs

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/models"
)

// schemaModeline is the first line of every example config: yaml-language-server
// (VS Code's YAML extension, and other editors' clients) resolves the path
// against the file.
const schemaModeline = "# yaml-language-server: $schema=./pipetrain.schema.json"

const regenerate = "go run ./cmd/pipetrain schema > configs/pipetrain.schema.json"

// loadSchema is the schema as editors read it: Schema's JSON, decoded.
func loadSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("Schema is not JSON: %v", err)
	}
	return s
}

// conform checks v, a YAML or JSON value, against schema s, supporting the
// keywords Schema emits; it reports each mismatch with the path of the value.
// A keyword it does not know fails the test, so the generator cannot emit
// one that these tests ignore.
func conform(t *testing.T, s map[string]any, v any, path string) []string {
	t.Helper()
	var errs []string
	badAt := func(where, format string, args ...any) {
		if where == "" {
			where = "(config)"
		}
		errs = append(errs, where+": "+fmt.Sprintf(format, args...))
	}
	bad := func(format string, args ...any) { badAt(path, format, args...) }
	if obj, ok := v.(map[any]any); ok {
		m := map[string]any{}
		for k, e := range obj {
			m[fmt.Sprint(k)] = e
		}
		v = m
	}
	for kw := range s {
		switch kw {
		case "$schema", "title", "description", "default", "type", "properties", "additionalProperties",
			"required", "enum", "items", "pattern", "minimum", "exclusiveMinimum":
		default:
			t.Fatalf("%s: the schema uses keyword %q, which conform does not check", path, kw)
		}
	}
	if ty, ok := s["type"]; ok {
		var types []string
		switch ty := ty.(type) {
		case string:
			types = []string{ty}
		case []any:
			for _, e := range ty {
				types = append(types, e.(string))
			}
		}
		if !slices.ContainsFunc(types, func(ty string) bool { return hasType(v, ty) }) {
			bad("%s (%T) is not of type %s", short(v), v, strings.Join(types, " or "))
			return errs // the other keywords assume the type
		}
	}
	if e, ok := s["enum"].([]any); ok && !slices.ContainsFunc(e, func(e any) bool { return sameValue(e, v) }) {
		bad("%s is not one of %v", short(v), e)
	}
	if p, ok := s["pattern"].(string); ok {
		if str, ok := v.(string); ok && !regexp.MustCompile(p).MatchString(str) {
			bad("%q does not match %s", str, p)
		}
	}
	if n, ok := number(v); ok {
		if m, ok := s["minimum"].(float64); ok && n < m {
			bad("%v is less than the minimum %v", n, m)
		}
		if m, ok := s["exclusiveMinimum"].(float64); ok && n <= m {
			bad("%v is not more than %v", n, m)
		}
	}
	switch v := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		required, _ := s["required"].([]any)
		for _, r := range required {
			if _, ok := v[r.(string)]; !ok {
				bad("%s is required", r)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			at := k
			if path != "" {
				at = path + "." + k
			}
			if p, ok := props[k]; ok {
				errs = append(errs, conform(t, p.(map[string]any), v[k], at)...)
			} else if ap, ok := s["additionalProperties"]; ok {
				if ap == false {
					badAt(at, "unknown key")
				} else if ap, ok := ap.(map[string]any); ok {
					errs = append(errs, conform(t, ap, v[k], at)...)
				}
			}
		}
	case []any:
		if items, ok := s["items"].(map[string]any); ok {
			for i, e := range v {
				errs = append(errs, conform(t, items, e, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	}
	return errs
}

func hasType(v any, ty string) bool {
	switch ty {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "number":
		_, ok := number(v)
		return ok
	case "integer":
		n, ok := number(v)
		return ok && n == math.Trunc(n)
	}
	return false
}

// number is v as a float64 if v is a number: YAML gives ints, JSON float64s.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

func sameValue(a, b any) bool {
	na, okA := number(a)
	nb, okB := number(b)
	if okA || okB {
		return okA && okB && na == nb
	}
	return reflect.DeepEqual(a, b)
}

func short(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// TestConformRejects keeps the checker honest: each keyword it supports
// rejects a value that breaks it.
func TestConformRejects(t *testing.T) {
	s := map[string]any{
		"type": "object", "additionalProperties": false, "required": []any{"n"},
		"properties": map[string]any{
			"n":    map[string]any{"type": "integer", "minimum": 1.0},
			"x":    map[string]any{"type": "number", "exclusiveMinimum": 0.0},
			"e":    map[string]any{"type": "string", "enum": []any{"a", "b"}},
			"p":    map[string]any{"type": []any{"string", "array"}, "pattern": "^[0-9]+$", "items": map[string]any{"type": "string"}},
			"list": map[string]any{"type": "array", "items": map[string]any{"type": "boolean"}},
		},
	}
	if errs := conform(t, s, map[string]any{"n": 1, "x": 0.5, "e": "a", "p": []any{"x"}, "list": []any{true}}, ""); len(errs) > 0 {
		t.Errorf("a conforming value is rejected: %v", errs)
	}
	for _, v := range []map[string]any{
		{"n": 0}, {"n": 1.5}, {"n": "1"}, {"n": 1, "x": 0}, {"n": 1, "e": "c"}, {"n": 1, "p": "1a"},
		{"n": 1, "p": []any{1}}, {"n": 1, "list": []any{true, "yes"}}, {"n": 1, "other": 1}, {},
	} {
		if errs := conform(t, s, v, ""); len(errs) == 0 {
			t.Errorf("%v conforms", v)
		}
	}
}

// TestSchemaFileIsCurrent: the committed schema is the one the code makes.
func TestSchemaFileIsCurrent(t *testing.T) {
	want, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("pipetrain.schema.json")
	if err != nil {
		t.Fatalf("%v; run `%s`", err, regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("configs/pipetrain.schema.json differs from the schema the config types make; run `%s`", regenerate)
	}
}

// examples are the example configs of this folder.
func examples(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("*.yaml")
	if len(files) == 0 {
		t.Fatal("no example configs found")
	}
	return files
}

// TestExamplesNameTheSchema: every example starts with the modeline that
// gives editors the schema.
func TestExamplesNameTheSchema(t *testing.T) {
	for _, f := range examples(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(string(b), "\n"); strings.TrimRight(first, "\r") != schemaModeline {
			t.Errorf("%s: the first line is %q, not %q", f, first, schemaModeline)
		}
	}
}

// TestExamplesMatchSchema: what Load accepts in the examples, the schema
// accepts too.
func TestExamplesMatchSchema(t *testing.T) {
	s := loadSchema(t)
	for _, f := range examples(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, e := range conform(t, s, doc, "") {
			t.Errorf("%s: %s", f, e)
		}
	}
}

// TestSchemaDescribesEveryKey: every key Load knows has a description, and
// the schema has the keys Load knows, each section closed as Load's
// unknown-key check closes it.
func TestSchemaDescribesEveryKey(t *testing.T) {
	// Load's keys with the own keys of every registered family and dataset
	// kind, which a config naming that family or kind may give.
	tree, docs := schema, allKeyDocs()
	for _, name := range models.Names() {
		tree = withFamilyKeys(tree, name)
	}
	for _, name := range data.Kinds() {
		tree = withDatasetKeys(tree, name)
		for _, k := range data.KeysOf(name) {
			docs["data."+k.Key] = k.Doc
		}
	}
	var walk func(tree *keyTree, s map[string]any, key string)
	walk = func(tree *keyTree, s map[string]any, key string) {
		switch {
		case tree.keys != nil:
			props, _ := s["properties"].(map[string]any)
			if s["type"] != "object" || s["additionalProperties"] != false {
				t.Errorf("%q: type %v, additionalProperties %v; want a closed object", key, s["type"], s["additionalProperties"])
			}
			if got, want := slices.Sorted(maps.Keys(props)), slices.Sorted(maps.Keys(tree.keys)); !slices.Equal(got, want) {
				t.Errorf("%q: the schema has keys %v, Load %v", key, got, want)
			}
			for name, sub := range tree.keys {
				k := name
				if key != "" {
					k = key + "." + name
				}
				if strings.TrimSpace(docs[k]) == "" {
					t.Errorf("%s has no description; add one to keyDocs in configs/schema.go", k)
				}
				if p, ok := props[name].(map[string]any); ok {
					if d, _ := p["description"].(string); strings.TrimSpace(d) == "" {
						t.Errorf("%s: no description in the schema", k)
					}
					walk(sub, p, k)
				}
			}
		case tree.entry != nil:
			items, _ := s["items"].(map[string]any)
			if s["type"] != "array" || items == nil {
				t.Errorf("%q: type %v; want an array of entries", key, s["type"])
				return
			}
			walk(tree.entry, items, key+"[i]")
		}
	}
	walk(tree, loadSchema(t), "")
}

// cleanEnv keeps PIPETRAIN_* variables of the test's environment out of Load.
func cleanEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, envPrefix) {
			t.Setenv(k, "")
		}
	}
}

// parseYAML is a config's text as a document to edit.
func parseYAML(t *testing.T, text string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// setKey sets the value at key in doc ("data.batch_size", "stages[1].cpus"),
// making sections as needed; a nil value deletes the key.
func setKey(t *testing.T, doc map[string]any, key string, v any) {
	t.Helper()
	parts := strings.Split(key, ".")
	m := doc
	for i, part := range parts {
		name, index, list := strings.Cut(strings.TrimSuffix(part, "]"), "[")
		if i == len(parts)-1 && !list {
			if v == nil {
				delete(m, name)
			} else {
				m[name] = v
			}
			return
		}
		if list {
			n, err := strconv.Atoi(index)
			entries, _ := m[name].([]any)
			if err != nil || n >= len(entries) {
				t.Fatalf("%s: no entry %s", key, part)
			}
			m = entries[n].(map[string]any)
			continue
		}
		next, ok := m[name].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[name] = next
		}
		m = next
	}
}

// judge checks doc with the schema and with Load: the schema's complaints,
// and Load's problems (each "field: message").
func judge(t *testing.T, s map[string]any, doc map[string]any) (schemaErrs, problems []string) {
	t.Helper()
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Load(writeConfig(t, string(b)))
	var p *Problems
	if errors.As(err, &p) {
		problems = p.Items
	} else if err != nil {
		problems = []string{err.Error()}
	}
	return conform(t, s, doc, ""), problems
}

// about is the problems that name field.
func about(problems []string, field string) []string {
	var out []string
	for _, p := range problems {
		if strings.HasPrefix(p, field+": ") || strings.HasPrefix(p, field+"[") {
			out = append(out, p)
		}
	}
	return out
}

// gptGood is a valid text config, for keys only dataset text reads.
const gptGood = `
model: {name: gpt, layers: 1, width: 8, heads: 2, context: 4, vocab: 256}
data: {dataset: text, corpus: "go:strings", batch_size: 4, micro_batches: 2}
stages:
  - {layers: "0-1", address: 127.0.0.1:7001}
  - {layers: "2", address: 127.0.0.1:7002}
`

// TestSchemaAgreesWithValidation: configs that Load refuses for a key's
// name, type or value, the schema refuses too, naming the same key.
func TestSchemaAgreesWithValidation(t *testing.T) {
	cleanEnv(t)
	s := loadSchema(t)
	if errs, problems := judge(t, s, parseYAML(t, good)); len(errs) > 0 || len(problems) > 0 {
		t.Fatalf("the base config: schema %v, Load %v", errs, problems)
	}
	for _, c := range []struct {
		key   string
		value any
	}{
		{"epochs", 3},                            // unknown, top level
		{"data.micro_batch", 4},                  // unknown, in a section
		{"train.optimizer.learning_rate", 0.1},   // unknown, in a nested section
		{"stages[1].metrics_adress", "x:1"},      // unknown, in a list entry
		{"schedule", "2f2b"},                     // not one of the schedules
		{"train.optimizer.name", "adagrad"},      // not one of the optimizers
		{"model.name", "resnet"},                 // not a registered model
		{"transport.compression", "fp8"},         // not a compression
		{"stages[0].device", "tpu"},              // not a device
		{"train.steps", "many"},                  // a word for a number
		{"train.evaluate", "sometimes"},          // a word for a boolean
		{"model.hidden", "wide"},                 // a word for a list of numbers
		{"data", 5},                              // a number for a section
		{"stages[0].layers", "0 to 1"},           // not a layer range
		{"stages[1].layers", []any{"x"}},         // a list with a bad range
		{"transport.connect_timeout", "30 secs"}, // not a duration
		{"transport.recv_timeout", "1d"},         // not a Go duration
		{"train.optimizer.lr", 0},                // not positive
		{"data.batch_size", 0},                   // below the minimum
	} {
		doc := parseYAML(t, good)
		setKey(t, doc, c.key, c.value)
		errs, problems := judge(t, s, doc)
		if len(about(errs, c.key)) == 0 {
			t.Errorf("%s: %v: the schema does not refuse it (%v); Load says %v", c.key, c.value, errs, problems)
		}
		if len(about(problems, c.key)) == 0 {
			t.Errorf("%s: %v: Load does not refuse it (%v); the schema says %v", c.key, c.value, problems, errs)
		}
	}
}

// TestSchemaEnumsAreWhatValidationAccepts: every value the schema offers
// for a key validation does not call unknown, and a value outside the list
// both refuse.
func TestSchemaEnumsAreWhatValidationAccepts(t *testing.T) {
	cleanEnv(t)
	s := loadSchema(t)
	bases := map[string]string{"data.tokenizer": gptGood}
	for key, values := range enums() {
		field := strings.ReplaceAll(key, "[i]", "[0]")
		base := cmp.Or(bases[key], good)
		for _, v := range append(slices.Clone(values), "bogus") {
			doc := parseYAML(t, base)
			setKey(t, doc, field, v)
			errs, problems := judge(t, s, doc)
			mine := about(problems, field)
			if v == "bogus" {
				if len(errs) == 0 || len(mine) == 0 {
					t.Errorf("%s: %s: schema %v, Load %v; want both to refuse it", field, v, errs, problems)
				}
				continue
			}
			if len(errs) > 0 {
				t.Errorf("%s: %s: the schema refuses it: %v", field, v, errs)
			}
			for _, p := range mine {
				if strings.Contains(p, "unknown") {
					t.Errorf("%s: %s is in the schema, but Load says %s", field, v, p)
				}
			}
		}
	}
}

// schemaKeys walks the schema's properties, calling f with each key (list
// entries written [i]) and its schema.
func schemaKeys(s map[string]any, key string, f func(key string, p map[string]any)) {
	if props, ok := s["properties"].(map[string]any); ok {
		for name, p := range props {
			k := name
			if key != "" {
				k = key + "." + name
			}
			f(k, p.(map[string]any))
			schemaKeys(p.(map[string]any), k, f)
		}
	}
	if items, ok := s["items"].(map[string]any); ok {
		schemaKeys(items, key+"[i]", f)
	}
}

// alongside are the keys a bound's test sets with the key, so that the rest
// of the config holds at the key's minimum: a batch of 1 is not divisible
// into the base config's 4 micro-batches.
var alongside = map[string]map[string]any{"data.batch_size": {"data.micro_batches": 1}}

// TestSchemaMinimumsAreValidations: at each key's minimum (or just above an
// exclusive one) Load has nothing to say about the key, and below it Load
// refuses the key.
func TestSchemaMinimumsAreValidations(t *testing.T) {
	cleanEnv(t)
	checked := 0
	schemaKeys(loadSchema(t), "", func(key string, p map[string]any) {
		lo, inclusive := p["minimum"].(float64)
		if !inclusive {
			var ok bool
			if lo, ok = p["exclusiveMinimum"].(float64); !ok {
				return
			}
		}
		checked++
		field := strings.ReplaceAll(key, "[i]", "[0]")
		at, below := lo, lo
		switch {
		case inclusive:
			below = lo - 1
		case p["type"] == "number":
			at = lo + 0.5
		default:
			at = lo + 1
		}
		for _, c := range []struct {
			v      float64
			refuse bool
		}{{at, false}, {below, true}} {
			doc := parseYAML(t, good)
			for k, v := range alongside[key] {
				setKey(t, doc, k, v)
			}
			var v any = c.v
			if c.v == math.Trunc(c.v) {
				v = int(c.v)
			}
			setKey(t, doc, field, v)
			_, problems := judge(t, nil, doc)
			if mine := about(problems, field); c.refuse != (len(mine) > 0) {
				t.Errorf("%s: %v: Load says %v; the schema's bound is %v (inclusive %v)", field, v, problems, lo, inclusive)
			}
		}
	})
	if checked < 10 {
		t.Errorf("only %d keys have bounds; is the walk broken?", checked)
	}
}

// fieldAt is the value of the config field at key.
func fieldAt(t *testing.T, c *Config, key string) reflect.Value {
	t.Helper()
	v := reflect.ValueOf(c).Elem()
	for part := range strings.SplitSeq(key, ".") {
		found := false
		for i := range v.NumField() {
			if name, ok := keyName(v.Type().Field(i)); ok && name == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			t.Fatalf("%s: no field %s in %v", key, part, v.Type())
		}
	}
	return v
}

// TestSchemaDefaultsAreLoadDefaults: the defaults editors show are what a
// config that leaves the keys out gets, and each is a valid value itself.
func TestSchemaDefaultsAreLoadDefaults(t *testing.T) {
	cleanEnv(t)
	c, err := LoadUnchecked(writeConfig(t, "stages: [{layers: \"0\", address: 127.0.0.1:7001}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	schemaKeys(loadSchema(t), "", func(key string, p map[string]any) {
		d, ok := p["default"]
		if !ok {
			return
		}
		n++
		for _, e := range conform(t, p, d, key) {
			t.Errorf("the default is invalid: %s", e)
		}
		got := fieldAt(t, c, key)
		var want any = d
		switch {
		case got.Type() == reflect.TypeFor[time.Duration]():
			if want, err = time.ParseDuration(d.(string)); err != nil {
				t.Errorf("%s: default %q: %v", key, d, err)
			}
		case got.CanInt() || got.CanUint() || got.CanFloat():
			want = reflect.ValueOf(d.(float64)).Convert(got.Type()).Interface()
		}
		if !reflect.DeepEqual(got.Interface(), want) {
			t.Errorf("%s: the schema's default is %v, loading gives %v", key, want, got.Interface())
		}
	})
	if n != len(defaults) {
		t.Errorf("the schema has %d defaults, Load %d", n, len(defaults))
	}
}

// TestSchemaDurationPattern: the schema takes the durations Load takes,
// positive ones; it refuses what time.ParseDuration refuses.
func TestSchemaDurationPattern(t *testing.T) {
	re := regexp.MustCompile(durationPattern)
	for _, d := range []string{"30s", "2m", "1h30m", "1.5s", ".5s", "500ms", "10us", "10µs", "10μs", "3ns", "1h2m3s4ms"} {
		if !re.MatchString(d) {
			t.Errorf("%q does not match, though Load takes it", d)
		}
		if v, err := time.ParseDuration(d); err != nil || v <= 0 {
			t.Errorf("%q: %v, %v", d, v, err)
		}
	}
	for _, d := range []string{"30", "s", "30 s", "30ss", "1d", "-5s", "", "1.s5", "5m s"} {
		if re.MatchString(d) {
			t.Errorf("%q matches, though Load refuses it", d)
		}
		if v, err := time.ParseDuration(d); err == nil && v > 0 {
			t.Errorf("%q is a positive duration: %v", d, v)
		}
	}
}
