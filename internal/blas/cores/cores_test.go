package cores

import (
	"runtime"
	"slices"
	"strings"
	"testing"
)

// debian0321 are the core types of Debian's libopenblas0 0.3.21 (x86-64),
// read from its gotoblas_* symbols.
var debian0321 = []string{"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
	"Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Sandybridge", "Bobcat",
	"Bulldozer", "Piledriver", "Haswell", "Steamroller", "Excavator", "Zen", "SkylakeX", "Cooperlake"}

var (
	sseCPU    = CPU{SSE3: true, SSSE3: true, SSE41: true, SSE42: true}
	avx2CPU   = CPU{SSE3: true, SSSE3: true, SSE41: true, SSE42: true, AVX: true, AVX2: true, FMA: true}
	avx512CPU = CPU{SSE3: true, SSSE3: true, SSE41: true, SSE42: true, AVX: true, AVX2: true, FMA: true, AVX512: true}
)

func with(c CPU, vendor string, family, model int, edit func(*CPU)) CPU {
	c.Vendor, c.Family, c.Model = vendor, family, model
	if edit != nil {
		edit(&c)
	}
	return c
}

// TestCandidatesOnRecordedCPUs: what the choice tries for CPUs and library
// choices seen on real machines.
func TestCandidatesOnRecordedCPUs(t *testing.T) {
	emerald := with(avx512CPU, "GenuineIntel", 6, 207, func(c *CPU) { c.AVX512BF16 = true })
	for _, tc := range []struct {
		name      string
		cpu       CPU
		available []string
		library   string
		want      []string
	}{
		// The Xeon: Emerald Rapids (model 207, AVX-512 with BF16
		// and FP16) is unknown to 0.3.21, which falls back to Prescott.
		{"emerald rapids, 0.3.21 says Prescott", emerald, debian0321, "Prescott", []string{"Cooperlake", "SkylakeX", "Haswell", "Sandybridge"}},
		// The same CPU with a build that knows it.
		{"emerald rapids, library says Cooperlake", emerald, debian0321, "Cooperlake", nil},
		// A build with SapphireRapids gets it on an AMX CPU.
		{"amx, newer build", with(emerald, "GenuineIntel", 6, 207, func(c *CPU) { c.AMXBF16 = true }), append(slices.Clone(debian0321), "SapphireRapids"), "Prescott", []string{"SapphireRapids", "Cooperlake", "SkylakeX", "Haswell", "Sandybridge"}},
		// This AMD EPYC (Zen 3, AVX2): 0.3.21 says Zen, nothing better.
		{"epyc zen3, library says Zen", with(avx2CPU, "AuthenticAMD", 25, 1, nil), debian0321, "Zen", nil},
		// The same with OPENBLAS_CORETYPE=Prescott forced: AMD's own set first.
		{"epyc zen3, Prescott forced", with(avx2CPU, "AuthenticAMD", 25, 1, nil), debian0321, "Prescott", []string{"Zen", "Haswell", "Sandybridge"}},
		// Skylake-SP detected as Haswell (an OS without AVX-512 state would too,
		// but then AVX512 is false): SkylakeX only.
		{"skylake-sp, library says Haswell", with(avx512CPU, "GenuineIntel", 6, 85, nil), debian0321, "Haswell", []string{"SkylakeX"}},
		// An old SSE-only Xeon: nothing above Nehalem it can run.
		{"westmere, library says Nehalem", with(sseCPU, "GenuineIntel", 6, 44, nil), debian0321, "Nehalem", nil},
		// A build without DYNAMIC_ARCH exports no kernel tables.
		{"single-target build", emerald, nil, "Prescott", nil},
		// A name the table does not know (another architecture): left alone.
		{"unknown library core", emerald, debian0321, "NEOVERSEN1", nil},
	} {
		if got := Candidates(tc.cpu, tc.available, tc.library); !slices.Equal(got, tc.want) {
			t.Errorf("%s: candidates %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMissingNamesWhatTheCPULacks(t *testing.T) {
	zen3 := with(avx2CPU, "AuthenticAMD", 25, 1, nil)
	if m := Missing(zen3, "skylakex"); !strings.Contains(m, "AVX-512") || !strings.Contains(m, "family 25 model 1") {
		t.Errorf("SkylakeX on Zen 3: %q", m)
	}
	if m := Missing(zen3, "Haswell"); m != "" {
		t.Errorf("Haswell on Zen 3: %q", m)
	}
	if m := Missing(with(avx2CPU, "GenuineIntel", 6, 63, nil), "Zen"); !strings.Contains(m, "AuthenticAMD") {
		t.Errorf("Zen on Intel: %q", m)
	}
	if m := Missing(zen3, "Pentium4"); !strings.Contains(m, "no OpenBLAS core type") {
		t.Errorf("unknown name: %q", m)
	}
	if c, ok := Lookup("cooperlake"); !ok || c.Name != "Cooperlake" {
		t.Errorf("Lookup is case-blind as OPENBLAS_CORETYPE: %v %v", c, ok)
	}
}

// TestPickTakesTheFirstPassingFaster: a set that failed is passed over for
// the next; one that passed but is no faster than the library's is not
// taken.
func TestPickTakesTheFirstPassingFaster(t *testing.T) {
	tried := []Result{{Core: "Cooperlake", Err: "self-test: sgemm NT ..."}, {Core: "SkylakeX", GFLOPS: 20}, {Core: "Haswell", GFLOPS: 70}}
	if r, ok := Pick(tried, 26); !ok || r.Core != "Haswell" {
		t.Errorf("pick %v %v, want Haswell", r, ok)
	}
	if r, ok := Pick(tried[:2], 26); ok {
		t.Errorf("pick %v, want the library's own (SkylakeX slower, Cooperlake failed)", r)
	}
}

// TestHostReadsThisCPU: the features read here agree with /proc/cpuinfo's
// flags.
func TestHostReadsThisCPU(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("CPUID and its /proc/cpuinfo flags are x86-64's; this is " + runtime.GOARCH)
	}
	c := Host()
	if c.Vendor == "" {
		t.Fatal("Host read no CPU vendor on an x86-64 machine")
	}
	flags := cpuFlags(t)
	if c.AVX2 != flags["avx2"] || c.FMA != flags["fma"] || (c.AVX512 && !flags["avx512f"]) || c.AVX512BF16 != flags["avx512_bf16"] {
		t.Errorf("Host %#v disagrees with /proc/cpuinfo's flags", c)
	}
}
