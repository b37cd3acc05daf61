package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/blas/cores"
)

// zen3 is an AMD EPYC of family 25 as cores.Host reads it: AVX2 and FMA, no AVX-512.
var zen3 = cores.CPU{Vendor: "AuthenticAMD", Family: 25, Model: 1, SSE3: true, SSSE3: true, SSE41: true, SSE42: true, AVX: true, AVX2: true, FMA: true}

// debian0321 are core types of Debian's DYNAMIC_ARCH OpenBLAS 0.3.21.
var debian0321 = []string{"Prescott", "Core2", "Nehalem", "Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake", "Excavator", "Bulldozer"}

func TestKernelPoliciesAreTheLibraryAndTheSetsAutoMayChooseThatTheCPURuns(t *testing.T) {
	got := kernelPolicies(zen3, debian0321)
	want := []string{"library", "Sandybridge", "Haswell", "Zen"}
	if !slices.Equal(got, want) {
		t.Fatalf("kernelPolicies on Zen 3 = %v, want %v (no AVX-512 sets, no FMA4 ones, no SSE ones)", got, want)
	}
	emerald := zen3
	emerald.Vendor, emerald.Family, emerald.Model = "GenuineIntel", 6, 207
	emerald.AVX512, emerald.AVX512BF16 = true, true
	got = kernelPolicies(emerald, debian0321)
	want = []string{"library", "Sandybridge", "Haswell", "SkylakeX", "Cooperlake"}
	if !slices.Equal(got, want) {
		t.Fatalf("kernelPolicies on an Emerald Rapids Xeon = %v, want %v (Zen is AMD's)", got, want)
	}
	if got := kernelPolicies(zen3, nil); !slices.Equal(got, []string{"library"}) {
		t.Fatalf("a build without kernel sets: %v, want only the library's own", got)
	}
}

// set is a kernelSet with one micro-batch and the given seconds per pass.
func set(policy, kernels, err string, sec ...float64) *kernelSet {
	return &kernelSet{policy: policy, kernels: kernels, err: err, sec: [][]float64{sec}}
}

func TestFastestTakesTheLowestMedianAmongSetsThatPassed(t *testing.T) {
	sets := []*kernelSet{
		set("library", "OpenBLAS Prescott", "", 4, 4, 4),
		set("Haswell", "OpenBLAS Haswell", "", 1.0, 9, 1.1), // median 1.1: one slow round does not count
		set("Zen", "OpenBLAS Zen", "", 1.2, 1.2, 1.2),
		set("Cooperlake", "Cooperlake", "self-test: sgemm NT m=7 n=7 k=7: C[0][0] is 3, the Go kernels give 2", 0.1),
	}
	if got := fastest(sets, 0); got != 1 {
		t.Fatalf("fastest = %d, want 1 (Haswell; Cooperlake was refused however fast)", got)
	}
	if got := fastest(sets[3:], 0); got != -1 {
		t.Fatalf("fastest of refused sets only = %d, want -1", got)
	}
}

func TestLimitIsTheFastestSetAndTheLibrarysBeside(t *testing.T) {
	const flops = 6e9 // 6 GFLOP a pass
	sets := []*kernelSet{
		set("library", "OpenBLAS Prescott", "", 0.3),
		set("Zen", "OpenBLAS Zen", "", 0.1),
	}
	r := &computeRow{flops: flops, stageGF: 45, sgemmGF: 20}
	r.limit(sets, 0)
	if r.bestGF != 60 || r.bestSet != "Zen" || r.libGF != 20 || r.libSet != "Prescott" || r.ratio != 0.75 {
		t.Fatalf("limit: best %v (%s), library %v (%s), ratio %v; want 60 (Zen), 20 (Prescott), 0.75", r.bestGF, r.bestSet, r.libGF, r.libSet, r.ratio)
	}
	// Without kernel sets (gonum) the limit is this process's own sgemm.
	r = &computeRow{flops: flops, stageGF: 15, sgemmGF: 20}
	r.limit(nil, 0)
	if r.bestGF != 20 || r.bestSet != "" || r.libGF != 0 || r.ratio != 0.75 {
		t.Fatalf("limit without sets: best %v (%q), library %v, ratio %v; want 20, \"\", 0, 0.75", r.bestGF, r.bestSet, r.libGF, r.ratio)
	}
	if got := gfCell(r.bestGF, r.bestSet); got != "20.0" {
		t.Fatalf("gfCell without a set = %q", got)
	}
	if got := gfCell(60, "Zen"); got != "60.0 (Zen)" {
		t.Fatalf("gfCell = %q", got)
	}
	if got := gfCell(0, ""); got != "–" {
		t.Fatalf("gfCell of nothing measured = %q", got)
	}
}

func TestLibraryGapSaysWhenTheLibraryFellBack(t *testing.T) {
	rows := []*computeRow{
		{bestGF: 60, bestSet: "Zen", libGF: 15, libSet: "Prescott"},
		{bestGF: 80, bestSet: "Haswell", libGF: 16, libSet: "Prescott"},
	}
	got := libraryGap(rows)
	for _, want := range []string{"Prescott", "20%–25%", "Zen, Haswell", "fell back"} {
		if !strings.Contains(got, want) {
			t.Errorf("libraryGap = %q, want it to contain %q", got, want)
		}
	}
	rows = []*computeRow{{bestGF: 60, bestSet: "Zen", libGF: 60, libSet: "Zen"}}
	if got := libraryGap(rows); !strings.Contains(got, "100%–100%") || !strings.Contains(got, "is the fastest set here") {
		t.Errorf("libraryGap where the library's choice is fastest = %q", got)
	}
	rows = []*computeRow{{bestGF: 60, bestSet: "Haswell", libGF: 57, libSet: "Zen"}}
	if got := libraryGap(rows); strings.Contains(got, "fell back") || !strings.Contains(got, "Haswell faster") {
		t.Errorf("libraryGap within 5%% = %q: noise between sets is no fallback", got)
	}
	if got := libraryGap([]*computeRow{{bestGF: 20}}); got != "" {
		t.Errorf("libraryGap without sets = %q, want nothing", got)
	}
}

func TestKeptNotesAreTheNotesSectionAtTheEnd(t *testing.T) {
	notes := "\n## Notes\n\nForced Prescott against auto: 3 rounds each, medians.\n"
	report := "# Benchmarks\n\n## Compute\n\nThe stage reaches 96%.\n" + notes
	if got := keptNotes(report); got != notes {
		t.Fatalf("keptNotes = %q, want %q", got, notes)
	}
	if got := keptNotes("# Benchmarks\n\n## Compute\n\nNo notes; a line reading ## Notes inside a paragraph is none.\n"); got != "" {
		t.Fatalf("keptNotes of a report without notes = %q", got)
	}
}
