// Package cores knows OpenBLAS's x86-64 core types (the kernel sets a
// DYNAMIC_ARCH build carries, chosen by OPENBLAS_CORETYPE) and what each
// needs of the CPU, and chooses the kernel sets worth trying when the
// library's own detection fell below what the CPU can do: a CPU newer than
// the library is detected as an old SSE core, and its products run at a
// third of their speed. It loads nothing, so configs and tests can use it.
package cores

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/cpu"
)

// CPU is what the choice reads of a processor: its vendor and model for
// messages, and the instruction sets kernels need (each usable: the OS saves
// the registers, as x/sys/cpu checks).
type CPU struct {
	Vendor        string // "GenuineIntel", "AuthenticAMD", ...
	Family, Model int
	SSE3, SSSE3   bool
	SSE41, SSE42  bool
	AVX, AVX2     bool
	FMA           bool
	AVX512        bool // F, BW, VL, DQ and CD: what SkylakeX's kernels use
	AVX512BF16    bool
	AMXBF16       bool
}

// Host is this machine's CPU.
func Host() CPU {
	x := cpu.X86
	c := CPU{
		SSE3: x.HasSSE3, SSSE3: x.HasSSSE3, SSE41: x.HasSSE41, SSE42: x.HasSSE42,
		AVX: x.HasAVX, AVX2: x.HasAVX2, FMA: x.HasFMA,
		AVX512:     x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL && x.HasAVX512DQ && x.HasAVX512CD,
		AVX512BF16: x.HasAVX512BF16, AMXBF16: x.HasAMXBF16,
	}
	c.Vendor, c.Family, c.Model = cpuinfo()
	return c
}

// cpuinfo reads the first processor's vendor, family and model from
// /proc/cpuinfo; they only name the CPU in messages.
func cpuinfo() (vendor string, family, model int) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			if vendor != "" {
				break // the end of the first processor's block
			}
			continue
		}
		switch strings.TrimSpace(k) {
		case "vendor_id":
			vendor = strings.TrimSpace(v)
		case "cpu family":
			family, _ = strconv.Atoi(strings.TrimSpace(v))
		case "model":
			model, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return vendor, family, model
}

func (c CPU) String() string {
	var best string
	switch {
	case c.AMXBF16:
		best = "AMX"
	case c.AVX512BF16:
		best = "AVX-512 with BF16"
	case c.AVX512:
		best = "AVX-512"
	case c.AVX2 && c.FMA:
		best = "AVX2/FMA"
	case c.AVX:
		best = "AVX"
	default:
		best = "SSE"
	}
	return fmt.Sprintf("%s family %d model %d, %s", cmp(c.Vendor, "unknown vendor"), c.Family, c.Model, best)
}

func cmp(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// Core is one of OpenBLAS's x86-64 kernel sets.
type Core struct {
	Name string // as openblas_get_corename spells it, and OPENBLAS_CORETYPE takes it
	// Tier orders kernel sets by the instructions they use: 1 SSE, 2 AVX,
	// 3 AVX2/FMA, 4 AVX-512, 5 AVX-512 BF16, 6 AMX.
	Tier int
	// Vendor is the vendor the set is tuned for; the choice prefers it on
	// that vendor's CPUs, and tries a set tuned for another vendor only
	// after it ("" is tuned for Intel's and works anywhere).
	Vendor string
	// Candidate says the choice may try the set; the AMD sets with FMA4
	// (which x/sys/cpu cannot see) and the pre-x86-64 ones are only taken
	// when named.
	Candidate bool
	needs     func(CPU) bool
	needsText string
}

const amd = "AuthenticAMD"

func sse(c CPU) bool  { return true } // every x86-64 CPU has SSE2
func sse3(c CPU) bool { return c.SSE3 }
func avx(c CPU) bool  { return c.AVX }
func fma(c CPU) bool  { return c.AVX && c.FMA }
func avx2(c CPU) bool { return c.AVX2 && c.FMA }
func a512(c CPU) bool { return avx2(c) && c.AVX512 }
func bf16(c CPU) bool { return a512(c) && c.AVX512BF16 }
func amx(c CPU) bool  { return bf16(c) && c.AMXBF16 }

// Known are the core types of OpenBLAS's x86-64 DYNAMIC_ARCH builds
// (driver/others/dynamic.c's corename list, 0.3.21, and SapphireRapids
// from 0.3.22). A build carries some of them: Available lists which.
var Known = []Core{
	{Name: "Katmai", Tier: 1, needs: sse, needsText: "SSE"},
	{Name: "Coppermine", Tier: 1, needs: sse, needsText: "SSE"},
	{Name: "Northwood", Tier: 1, needs: sse, needsText: "SSE2"},
	{Name: "Prescott", Tier: 1, needs: sse3, needsText: "SSE3"},
	{Name: "Banias", Tier: 1, needs: sse, needsText: "SSE2"},
	{Name: "Atom", Tier: 1, needs: func(c CPU) bool { return c.SSSE3 }, needsText: "SSSE3"},
	{Name: "Core2", Tier: 1, needs: func(c CPU) bool { return c.SSSE3 }, needsText: "SSSE3"},
	{Name: "Penryn", Tier: 1, needs: func(c CPU) bool { return c.SSE41 }, needsText: "SSE4.1"},
	{Name: "Dunnington", Tier: 1, needs: func(c CPU) bool { return c.SSE41 }, needsText: "SSE4.1"},
	{Name: "Nehalem", Tier: 1, needs: func(c CPU) bool { return c.SSE42 }, needsText: "SSE4.2"},
	{Name: "Athlon", Tier: 1, Vendor: amd, needs: sse, needsText: "SSE"},
	{Name: "Opteron", Tier: 1, Vendor: amd, needs: sse, needsText: "SSE2"},
	{Name: "Opteron_SSE3", Tier: 1, Vendor: amd, needs: sse3, needsText: "SSE3"},
	{Name: "Barcelona", Tier: 1, Vendor: amd, needs: sse3, needsText: "SSE4a"},
	{Name: "Nano", Tier: 1, needs: sse3, needsText: "SSE3"},
	{Name: "Sandybridge", Tier: 2, Candidate: true, needs: avx, needsText: "AVX"},
	{Name: "Bobcat", Tier: 1, Vendor: amd, needs: sse3, needsText: "SSE4a"},
	{Name: "Bulldozer", Tier: 2, Vendor: amd, needs: avx, needsText: "AVX and FMA4"},
	{Name: "Piledriver", Tier: 2, Vendor: amd, needs: fma, needsText: "AVX, FMA and FMA4"},
	{Name: "Haswell", Tier: 3, Candidate: true, needs: avx2, needsText: "AVX2 and FMA"},
	{Name: "Steamroller", Tier: 2, Vendor: amd, needs: fma, needsText: "AVX, FMA and FMA4"},
	{Name: "Excavator", Tier: 3, Vendor: amd, needs: avx2, needsText: "AVX2, FMA and FMA4"},
	{Name: "Zen", Tier: 3, Vendor: amd, Candidate: true, needs: avx2, needsText: "AVX2 and FMA"},
	{Name: "SkylakeX", Tier: 4, Candidate: true, needs: a512, needsText: "AVX-512 F/BW/VL/DQ/CD"},
	{Name: "Cooperlake", Tier: 5, Candidate: true, needs: bf16, needsText: "AVX-512 with AVX512_BF16"},
	{Name: "SapphireRapids", Tier: 6, Candidate: true, needs: amx, needsText: "AVX-512 with BF16 and AMX"},
}

// Lookup finds a core type by name, in any case, as OPENBLAS_CORETYPE does.
func Lookup(name string) (Core, bool) {
	for _, c := range Known {
		if strings.EqualFold(c.Name, strings.TrimSpace(name)) {
			return c, true
		}
	}
	return Core{}, false
}

// Names are the known core types' names, for messages and validation.
func Names() []string {
	out := make([]string, len(Known))
	for i, c := range Known {
		out[i] = c.Name
	}
	return out
}

// Missing says what core type name needs that cpu lacks ("" when it has it
// all). Kernels for an instruction set the CPU lacks stop the process with
// SIGILL, and OpenBLAS loads them when told to without checking.
func Missing(cpu CPU, name string) string {
	c, ok := Lookup(name)
	if !ok {
		return fmt.Sprintf("%q is no OpenBLAS core type (known: %s)", name, strings.Join(Names(), ", "))
	}
	if !c.needs(cpu) {
		return fmt.Sprintf("%s's kernels need %s, which this CPU (%s) lacks", c.Name, c.needsText, cpu)
	}
	if c.Vendor != "" && cpu.Vendor != "" && c.Vendor != cpu.Vendor {
		return fmt.Sprintf("%s's kernels are for %s CPUs, and this is %s", c.Name, c.Vendor, cpu.Vendor)
	}
	return ""
}

// Candidates are the kernel sets of available (the build's core types)
// worth trying in place of library, the one the library chose, best first:
// those the CPU can run on a higher tier than library's, the CPU's vendor's
// own before the others within a tier. None when library is at the best
// tier the build offers this CPU, or is a type this package does not know
// (another architecture, a newer build): the library's choice then stands.
func Candidates(cpu CPU, available []string, library string) []string {
	lib, ok := Lookup(library)
	if !ok {
		return nil
	}
	var out []Core
	for _, name := range available {
		c, ok := Lookup(name)
		if !ok || !c.Candidate || c.Tier <= lib.Tier || Missing(cpu, c.Name) != "" {
			continue
		}
		out = append(out, c)
	}
	own := func(c Core) int {
		if c.Vendor == cpu.Vendor && c.Vendor != "" {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(out, func(a, b Core) int {
		if a.Tier != b.Tier {
			return b.Tier - a.Tier
		}
		return own(a) - own(b)
	})
	names := make([]string, len(out))
	for i, c := range out {
		names[i] = c.Name
	}
	return names
}

// Result is what a self-test of one kernel set found.
type Result struct {
	Core   string  `json:"core"`             // the set asked for
	Loaded string  `json:"loaded,omitempty"` // openblas_get_corename after loading it
	Err    string  `json:"error,omitempty"`  // why it was refused ("" when it passed)
	GFLOPS float64 `json:"gflops,omitempty"` // single-thread sgemm speed
}

// Pick chooses among tried, the candidates' self-tests in Candidates'
// order, against the library's own kernels measured at library GFLOP/s:
// the first that passed and is faster. ok is false when none is, and the
// library's choice stands.
func Pick(tried []Result, library float64) (best Result, ok bool) {
	for _, r := range tried {
		if r.Err == "" && r.GFLOPS > library {
			return r, true
		}
	}
	return Result{}, false
}
