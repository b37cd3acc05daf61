package ownkeys

import (
	"slices"
	"testing"
)

// TestDecodeNamesEveryWrongKey: every wrongly typed key is named, in key
// order, with what it is and what it should be; the right ones decode and a
// key the target lacks is left alone.
func TestDecodeNamesEveryWrongKey(t *testing.T) {
	var v struct {
		Shards int     `json:"shards"`
		Gain   float64 `json:"gain"`
		Tags   []string
	}
	got := Decode(map[string]any{"shards": "many", "gain": 0.5, "tags": true, "unknown": 1}, &v)
	var said []string
	for _, p := range got {
		said = append(said, p.Key+": "+p.String())
	}
	want := []string{"shards: a string, want an integer", "tags: a bool, want a list"}
	if !slices.Equal(said, want) {
		t.Errorf("problems %q, want %q", said, want)
	}
	if v.Gain != 0.5 {
		t.Errorf("gain %v, want 0.5 decoded beside the wrong keys", v.Gain)
	}
}
