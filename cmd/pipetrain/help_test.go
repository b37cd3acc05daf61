package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/spf13/cobra"
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

// TestEveryCommandHasExamples: each command's --help shows examples, and
// every example of a pipetrain command uses only flags that command has and
// configs that exist, so the help cannot drift from the code.
func TestEveryCommandHasExamples(t *testing.T) {
	root := newRoot()
	byName := map[string]*cobra.Command{"pipetrain": root}
	for _, c := range root.Commands() {
		byName[c.Name()] = c
	}
	flag := regexp.MustCompile(`(?:^|\s)--([a-z][a-z-]*)`)
	config := regexp.MustCompile(`configs/[\w.-]+\.yaml`)
	for _, c := range append([]*cobra.Command{root}, root.Commands()...) {
		if c.Name() == "help" || c.Name() == "completion" || c.Hidden {
			continue // cobra's own
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no examples in its help", c.CommandPath())
			continue
		}
		for _, line := range strings.Split(c.Example, "\n") {
			line, _, _ = strings.Cut(line, "#")
			fields := strings.Fields(line)
			i := slices.Index(fields, "pipetrain")
			if i < 0 || i+1 >= len(fields) {
				continue
			}
			cmd := byName[fields[i+1]]
			if cmd == nil {
				t.Errorf("%s example %q: no command %q", c.CommandPath(), line, fields[i+1])
				continue
			}
			for _, m := range flag.FindAllStringSubmatch(line, -1) {
				if cmd.Flags().Lookup(m[1]) == nil && cmd.InheritedFlags().Lookup(m[1]) == nil && root.PersistentFlags().Lookup(m[1]) == nil {
					t.Errorf("%s example %q: %s has no flag --%s", c.CommandPath(), line, cmd.CommandPath(), m[1])
				}
			}
			for _, path := range config.FindAllString(line, -1) {
				if _, err := os.Stat(filepath.Join("..", "..", path)); err != nil {
					t.Errorf("%s example %q: %v", c.CommandPath(), line, err)
				}
			}
		}
	}
}

// TestVersionSaysWhatItComputesWith: the version command names the build,
// the BLAS with its kernel set and why, and the float32 kernels this binary
// uses.
func TestVersionSaysWhatItComputesWith(t *testing.T) {
	out, err := runCommand(t, newRoot(), "version")
	if err != nil {
		t.Fatal(err)
	}
	core, why := blas.Kernels()
	products := map[string]string{"openblas": "matrix products: OpenBLAS (" + blas.Library() + "), " + core + " kernels (" + why + ")\n", "gonum": "matrix products: gonum's Go kernels ("}[blas.Name()]
	for _, w := range []string{"pipetrain ", runtime.Version(), products, "float32 kernels: " + models.Kernels() + "\n", fmt.Sprintf("cores: %d\n", runtime.NumCPU())} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q in\n%s", w, out)
		}
	}
}
