// Package ownkeys decodes the keys a model family or a dataset kind reads
// besides its config section's shared fields, so both name a wrongly typed
// value the same way.
package ownkeys

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// Problem is one key whose value the target cannot take: a value of the
// wrong type (Value and Want) or another decoding error (Err).
type Problem struct {
	Key         string
	Value, Want string
	Err         error
}

// String says what is wrong with the value: "a string, want an integer".
func (p Problem) String() string {
	if p.Err != nil {
		return p.Err.Error()
	}
	return fmt.Sprintf("a %s, want %s", p.Value, p.Want)
}

// Decode decodes own into v, a pointer to a struct whose json tags name the
// keys, key by key in key order, so that every wrongly typed key is found,
// not only the first; a key v lacks is left alone.
func Decode(own map[string]any, v any) []Problem {
	var out []Problem
	for _, k := range slices.Sorted(maps.Keys(own)) {
		b, err := json.Marshal(map[string]any{k: own[k]})
		if err == nil {
			err = json.Unmarshal(b, v)
		}
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			out = append(out, Problem{Key: k, Value: te.Value, Want: kindWord(te.Type.Kind())})
		case err != nil:
			out = append(out, Problem{Key: k, Err: err})
		}
	}
	return out
}

// kindWord names a Go kind as a config's value.
func kindWord(k reflect.Kind) string {
	switch {
	case k >= reflect.Int && k <= reflect.Uint64:
		return "an integer"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	case k == reflect.Bool:
		return "a boolean"
	case k == reflect.Slice || k == reflect.Array:
		return "a list"
	case k == reflect.Map || k == reflect.Struct:
		return "a section"
	}
	return "a " + k.String()
}
