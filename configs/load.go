package configs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

// envPrefix starts every environment variable that sets a config key.
const envPrefix = "PIPETRAIN_"

// nonConfigEnv lists PIPETRAIN_* variables that pipetrain reads for other
// purposes than config keys; Load accepts them. Add a variable here when a
// part of the program starts reading one, or Load will report it as an
// unknown setting. PIPETRAIN_BLAS (internal/blas.Env) is read at start-up,
// before any config: it picks the library a process computes with.
// PIPETRAIN_REQUIRE_ALL (internal/testenv.RequireAllEnv) is read by the
// tests, which CI runs with it set, and every pipetrain they start inherits it.
// PIPETRAIN_BLAS_PROBE and PIPETRAIN_BLAS_CHOSEN pass internal/blas's
// kernel choice to the child processes and the restarted process it makes.
// PIPETRAIN_CUBLAS names the cuBLAS library cuda:N stages load (docs/gpu.md).
// PIPETRAIN_BENCH_SLOW_REPLICA slows a worker down for the benchmarks
// (stages.SlowReplicaEnv).
var nonConfigEnv = map[string]bool{"PIPETRAIN_BLAS": true, "PIPETRAIN_REQUIRE_ALL": true, "PIPETRAIN_BLAS_PROBE": true, "PIPETRAIN_BLAS_CHOSEN": true, "PIPETRAIN_CUBLAS": true,
	"PIPETRAIN_BENCH_SLOW_REPLICA": true}

// secretKeys are keys whose values never appear in messages.
var secretKeys = map[string]bool{"transport.token": true}

// SecretVariables are the PIPETRAIN_* variables of the secret keys, whose
// values must never be shown or written down.
func SecretVariables() []string {
	var out []string
	for k := range secretKeys {
		out = append(out, EnvName(k))
	}
	slices.Sort(out)
	return out
}

// keyTree is the schema of a config section, read from the mapstructure tags
// of the struct that holds it: a section has keys, a list of sections (stages)
// has the keys of one entry, and a value has neither.
type keyTree struct {
	keys  map[string]*keyTree
	entry *keyTree
}

// schema is every key a config file may hold.
var schema = keysOf(reflect.TypeFor[Config]())

// settings are the dotted keys of the values outside lists (train.log_every,
// model.hidden), sorted: the keys an environment variable can set.
var settings = leafKeys(schema, "")

// envSettings maps the variable of each of settings (EnvName:
// PIPETRAIN_TRAIN_LOG_EVERY) to its key.
var envSettings = func() map[string]string {
	m := map[string]string{}
	for _, k := range settings {
		m[EnvName(k)] = k
	}
	return m
}()

func keysOf(t reflect.Type) *keyTree {
	switch {
	case t == reflect.TypeFor[time.Duration]():
		return &keyTree{}
	case t.Kind() == reflect.Struct:
		n := &keyTree{keys: map[string]*keyTree{}}
		for i := range t.NumField() {
			if name, ok := keyName(t.Field(i)); ok {
				n.keys[name] = keysOf(t.Field(i).Type)
			}
		}
		return n
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return &keyTree{entry: keysOf(t.Elem())}
	}
	return &keyTree{}
}

// keyName is the config key of a struct field, as mapstructure names it;
// ok is false for a field that is no key.
func keyName(f reflect.StructField) (name string, ok bool) {
	name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	if !f.IsExported() || name == "-" || opts == "remain" {
		// A remain field (models.Spec.Own) holds the keys the others do
		// not; withFamilyKeys admits the own keys of the family named.
		return "", false
	}
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, true
}

func leafKeys(t *keyTree, prefix string) []string {
	var out []string
	for name, sub := range t.keys {
		switch {
		case sub.keys != nil:
			out = append(out, leafKeys(sub, prefix+name+".")...)
		case sub.entry == nil:
			out = append(out, prefix+name)
		}
	}
	slices.Sort(out)
	return out
}

// LoadUnchecked reads a config as Load does (defaults and PIPETRAIN_*
// overrides included) but does not validate it. It serves commands that
// prepare what makes a config valid, such as `pipetrain certs`, which runs
// before the TLS files the config names exist; the caller checks the fields
// it uses. Unknown keys in the file or the environment do not stop it; they
// are reported by Validate, with everything else.
func LoadUnchecked(path string) (*Config, error) {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	// Every setting is bound to its variable, set or not, so a variable sets
	// keys the file does not mention too; nothing else is read from the
	// environment (readEnv reports the rest).
	for _, k := range settings {
		if err := v.BindEnv(k, EnvName(k)); err != nil {
			return nil, err
		}
	}
	v.SetConfigFile(path)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return nil, fmt.Errorf("%s: %w", path, pathErr.Err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	env, envProblems := readEnv(os.Environ())
	p := &Problems{Path: path, env: env}
	if b, err := os.ReadFile(path); err == nil {
		var doc map[string]any
		if yaml.Unmarshal(b, &doc) == nil {
			unknownKeys(p, withDatasetKeys(withFamilyKeys(schema, modelName(v, path)), v.GetString("data.dataset")), doc, "")
		}
	}
	p.Items = append(p.Items, envProblems...)
	var c Config
	if err := v.Unmarshal(&c); err != nil {
		before := len(p.Items)
		decodeProblems(p, err)
		if len(p.Items) == before {
			p.Items = append(p.Items, err.Error())
		}
		return nil, p
	}
	c.Path = path
	if err := c.resolveModelFrom(); err != nil {
		p.Items = append(p.Items, err.Error())
		return nil, p
	}
	c.normaliseAddresses()
	c.readScheduleFile()
	c.env = env
	c.keyProblems = p.Items
	// transport.token and token_file are one setting: the environment's
	// beats the file's, whichever of the two each names.
	_, tokenEnv := env["transport.token"]
	_, fileEnv := env["transport.token_file"]
	if tokenEnv && !fileEnv {
		c.Transport.TokenFile = ""
	} else if fileEnv && !tokenEnv {
		c.Transport.Token = ""
	}
	return &c, nil
}

// Overrides lists the PIPETRAIN_* variables that set keys of this config, as
// NAME=value (a secret by its name only), sorted.
func (c *Config) Overrides() []string {
	out := make([]string, 0, len(c.env))
	for _, from := range c.env {
		out = append(out, from)
	}
	slices.Sort(out)
	return out
}

// readEnv returns, for every key an environment variable sets, how it was set
// (PIPETRAIN_SCHEDULE=gpipe), and a problem for every PIPETRAIN_* variable
// that sets no key. Empty variables set nothing, as in viper.
func readEnv(environ []string) (map[string]string, []string) {
	set := map[string]string{}
	var problems []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || nonConfigEnv[name] {
			continue
		}
		key, ok := envSettings[name]
		switch {
		case ok && value == "":
		case ok && secretKeys[key]:
			set[key] = name
		case ok:
			set[key] = name + "=" + quoteIfNeeded(value)
		case strings.HasPrefix(name, envPrefix+"STAGES"):
			problems = append(problems, name+": stages can only be set in the config file")
		default:
			// The value is not shown: a misspelled name may hold a secret.
			msg := name + ": no config key is set by this variable"
			if near := nearest(name, slices.Collect(maps.Keys(envSettings))); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
			problems = append(problems, msg)
		}
	}
	slices.Sort(problems)
	return set, problems
}

// quoteIfNeeded quotes a value for a message when it holds space or
// unprintable characters.
func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || !strconv.IsPrint(r) }) {
		return strconv.Quote(s)
	}
	return s
}

// unknownKeys reports every key of the YAML value v (a section described by
// t) that the schema lacks, by its full path, with the nearest known key.
// Keys match without regard to case, as mapstructure matches them; a dotted
// key (train.steps: 5) is read as the path it names, as viper reads it.
func unknownKeys(p *Problems, t *keyTree, v any, path string) {
	switch {
	case t.keys != nil:
		var names []string
		values := map[string]any{}
		switch m := v.(type) {
		case map[string]any:
			for k, e := range m {
				names, values[k] = append(names, k), e
			}
		case map[any]any:
			for k, e := range m {
				s := fmt.Sprint(k)
				names, values[s] = append(names, s), e
			}
		default:
			return // not a section: decoding reports it
		}
		slices.Sort(names)
		for _, name := range names {
			sub, at := t, path
			for part := range strings.SplitSeq(name, ".") {
				if at != "" {
					at += "."
				}
				at += part
				next, ok := sub.keys[strings.ToLower(part)]
				if !ok {
					p.add(at, "unknown key%s", hint(strings.ToLower(part), sub))
					sub = nil
					break
				}
				sub = next
			}
			if sub != nil {
				unknownKeys(p, sub, values[name], at)
			}
		}
	case t.entry != nil:
		list, _ := v.([]any)
		for i, e := range list {
			unknownKeys(p, t.entry, e, fmt.Sprintf("%s[%d]", path, i))
		}
	}
}

// hint suggests the known key nearest to an unknown one: a key of the same
// section spelled alike, else a key of that name in another section.
func hint(name string, section *keyTree) string {
	if near := nearest(name, slices.Collect(maps.Keys(section.keys))); near != "" {
		return fmt.Sprintf(" (did you mean %s?)", near)
	}
	var elsewhere []string
	for _, k := range settings {
		if k == name || strings.HasSuffix(k, "."+name) {
			elsewhere = append(elsewhere, k)
		}
	}
	for list, t := range schema.keys {
		if t.entry != nil && t.entry.keys[name] != nil {
			elsewhere = append(elsewhere, list+"[i]."+name)
		}
	}
	if len(elsewhere) > 0 {
		return fmt.Sprintf(" (did you mean %s?)", strings.Join(elsewhere, " or "))
	}
	return ""
}

// nearest is the candidate closest to s in edit distance (a swap of
// neighbours counts as one edit), if close enough to be a misspelling of it:
// at most a third of s's letters wrong, and at least one.
func nearest(s string, candidates []string) string {
	slices.Sort(candidates)
	best, bestDist := "", max(1, len(strings.TrimPrefix(s, envPrefix))/3)+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent letters.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// decodeProblems turns mapstructure's decoding errors, one per field, into
// problems naming the field.
func decodeProblems(p *Problems, err error) {
	switch u := err.(type) {
	case interface {
		Name() string
		Unwrap() error
	}:
		p.add(u.Name(), "%v", u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			decodeProblems(p, e)
		}
	case interface{ Unwrap() error }:
		decodeProblems(p, u.Unwrap())
	}
}
