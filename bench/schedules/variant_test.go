package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
)

// TestVariantPinsAndRecomputes: a variant of a shipped config sets every
// stage to recompute, pins stage i to CPU i, or both, loads as a config
// with exactly that, and is written beside the original (its paths stay
// valid).
func TestVariantPinsAndRecomputes(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile("../../configs/bench-mlp-4stage-pinned-zbv.yaml")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "zbv.yaml")
	if err := os.WriteFile(src, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	orig, err := configs.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ recompute, pin bool }{{true, false}, {false, true}, {true, true}} {
		path, err := variant(src, tc.recompute, tc.pin)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Dir(path) != dir {
			t.Errorf("variant written to %s, not beside %s", path, src)
		}
		// Loaded without validation: the pins are checked against this
		// machine's CPUs, and it may have fewer than 4.
		got, err := configs.LoadUnchecked(path)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		os.Remove(path)
		if len(got.Stages) != len(orig.Stages) {
			t.Fatalf("%+v: %d stages, want %d", tc, len(got.Stages), len(orig.Stages))
		}
		for i, st := range got.Stages {
			wantRecompute, wantCPUs := "", ""
			if tc.recompute {
				wantRecompute = "full"
			}
			if tc.pin {
				wantCPUs = string(rune('0' + i))
			}
			if st.Recompute != wantRecompute || st.CPUs != wantCPUs || st.Address != orig.Stages[i].Address {
				t.Errorf("%+v: stage %d: recompute %q, cpus %q, address %s; want %q, %q, %s", tc, i, st.Recompute, st.CPUs, st.Address, wantRecompute, wantCPUs, orig.Stages[i].Address)
			}
		}
	}
	if err := os.WriteFile(src, []byte("stages: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := variant(src, true, false); err == nil {
		t.Error("a config with no {layers: ...} stage lines was rewritten")
	}
}
