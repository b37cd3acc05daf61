package main

import (
	"strings"
	"testing"
)

// help returns the help text of a subcommand.
func help(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runCommand(t, newRoot(), append(args, "--help")...)
	if err != nil {
		t.Fatalf("%v --help: %v", args, err)
	}
	return out
}

// flagLine is the help line of a flag.
func flagLine(text, flag string) string {
	for _, l := range strings.Split(text, "\n") {
		// The flag's own line starts with it (after "-c, "), unlike a
		// mention in another flag's description.
		f := strings.Fields(l)
		if len(f) > 0 && (f[0] == "--"+flag || len(f) > 1 && f[1] == "--"+flag) {
			return l
		}
	}
	return ""
}

// TestHelpShowsOneDefault: each command's --run-dir states one default, the
// one it uses.
func TestHelpShowsOneDefault(t *testing.T) {
	for cmd, want := range map[string]string{"stage": `(default "runs/latest")`, "launch": "(default: runs/NAME-TIME, a new one per run)", "reference": "(default: runs/NAME-TIME, a new one per run)"} {
		l := flagLine(help(t, cmd), "run-dir")
		if !strings.Contains(l, want) || strings.Count(l, "default") != 1 {
			t.Errorf("%s --help: run-dir line %q, want one default %s", cmd, l, want)
		}
	}
}

// TestSampleOffersOnlyItsFlags: sample does not train, so it has no --steps.
func TestSampleOffersOnlyItsFlags(t *testing.T) {
	text := help(t, "sample")
	if flagLine(text, "steps") != "" || flagLine(text, "resume") != "" {
		t.Errorf("sample --help offers flags it does not use:\n%s", text)
	}
	if flagLine(text, "run-dir") == "" || flagLine(text, "prompt") == "" {
		t.Errorf("sample --help lacks its own flags:\n%s", text)
	}
}
