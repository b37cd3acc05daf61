package predict

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/affinity"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/schedule"
)

// Sharing is how a config's stages share this machine's cores while they
// compute (docs/profiling.md, "Stages that share cores").
type Sharing struct {
	Groups schedule.CoreGroups // the zero value when no group has more demand than cores
	Note   string              // what is shared, in words; "" when nothing is
}

// coreGroup is one set of cores and the stages here that compute on it.
type coreGroup struct {
	cpus   []int // the CPUs pinned stages list; nil for the unpinned group
	cores  int
	stages []int
}

// StageCores works out which of cfg's stages share cores, for the
// simulator's processor sharing (schedule.CoreGroups). Stages pinned to CPUs
// (cpus) share those CPUs: stages whose lists overlap form one group of the
// CPUs they list between them. The unpinned stages here (every replica's
// process) share the machine's other cores, or, when the pinned stages
// list them all, every core with the pinned stages in one group. A stage
// keeps its threads (cfg.Threads) busy while it computes, times its
// replicas. A stage on another host is in no group: its cores are not
// known here.
func StageCores(cfg *configs.Config) Sharing {
	p := len(cfg.Stages)
	var groups []coreGroup
	var unpinned []int
	pinnedCPUs := map[int]bool{}
	for s := range p {
		if !cfg.CPUsCheckedHere(s) {
			continue
		}
		cpus, err := affinity.Parse(cfg.Stages[s].CPUs)
		if err != nil || len(cpus) == 0 {
			unpinned = append(unpinned, s)
			continue
		}
		g := coreGroup{stages: []int{s}}
		for _, c := range cpus {
			pinnedCPUs[c] = true
		}
		// Merge the groups whose CPUs this stage's list overlaps.
		kept := groups[:0]
		for _, other := range groups {
			if slices.ContainsFunc(cpus, func(c int) bool { return slices.Contains(other.cpus, c) }) {
				g.stages = append(g.stages, other.stages...)
				cpus = append(cpus, other.cpus...)
				continue
			}
			kept = append(kept, other)
		}
		slices.Sort(cpus)
		g.cpus = slices.Compact(cpus)
		g.cores = len(g.cpus)
		slices.Sort(g.stages)
		groups = append(kept, g)
	}
	if len(unpinned) > 0 {
		all := runtime.NumCPU()
		if free := all - len(pinnedCPUs); free > 0 {
			groups = append(groups, coreGroup{cores: free, stages: unpinned})
		} else {
			// Every core is pinned: the unpinned stages run on them too.
			one := coreGroup{cores: all, stages: unpinned}
			for _, g := range groups {
				one.stages = append(one.stages, g.stages...)
			}
			slices.Sort(one.stages)
			groups = []coreGroup{one}
		}
	}
	out := Sharing{Groups: schedule.CoreGroups{Group: make([]int, p), Demand: make([]float64, p)}}
	for s := range p {
		out.Groups.Group[s], out.Groups.Demand[s] = -1, float64(cfg.Threads(s)*cfg.Replicas())
	}
	var shared []string
	for k, g := range groups {
		out.Groups.Cores = append(out.Groups.Cores, float64(g.cores))
		var demand float64
		for _, s := range g.stages {
			out.Groups.Group[s] = k
			demand += out.Groups.Demand[s]
		}
		if demand > float64(g.cores) {
			shared = append(shared, g.describe(cfg, demand))
		}
	}
	if len(shared) == 0 {
		return Sharing{}
	}
	out.Note = strings.Join(shared, "; ")
	return out
}

// describe says which stages share g's cores, with the threads they keep
// busy between them.
func (g coreGroup) describe(cfg *configs.Config, demand float64) string {
	names := make([]string, len(g.stages))
	for k, s := range g.stages {
		names[k] = strconv.Itoa(s)
	}
	where := fmt.Sprintf("this machine's %s", words.Count(g.cores, "core"))
	if g.cpus != nil {
		where = fmt.Sprintf("%s %s", words.Plural(len(g.cpus), "CPU"), cpuList(g.cpus))
	}
	return fmt.Sprintf("%s %s (%s of %s) share %s",
		words.Plural(len(g.stages), "stage"), strings.Join(names, ", "), words.Count(int(demand), "BLAS thread"),
		words.Count(len(g.stages)*cfg.Replicas(), "process"), where)
}

// cpuList writes CPUs as affinity.Parse reads them.
func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for k, c := range cpus {
		s[k] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// PlanCores is how the processes of a plan share this machine's cores.
type PlanCores struct {
	Cores     float64 // what plan.Problem.Cores gets: 0 when not charged
	Threads   int     // BLAS threads each stage runs with, and the layers are timed with
	Processes int
	Why       string // why sharing is not charged, when it is not
}

// SharePlanCores works out the cores the plan's processes share and the threads
// each runs with, as a stage does (configs.Config.CoreShare): the CPUs the
// config pins its stages to when it pins every one, or this machine's.
// Stages on other hosts have cores this machine cannot count, so sharing is charged only when every
// stage runs here.
func SharePlanCores(cfg *configs.Config, processes int) PlanCores {
	c := PlanCores{Processes: processes, Cores: float64(runtime.NumCPU())}
	var pinned []int
	every := true // every stage is pinned
	for i, st := range cfg.Stages {
		if !cfg.CPUsCheckedHere(i) {
			c.Cores, c.Why = 0, fmt.Sprintf("stage %d (%s) runs on another machine", i, cfg.Address(i, 0))
			break
		}
		cpus, err := affinity.Parse(st.CPUs)
		every = every && err == nil && len(cpus) > 0
		if err == nil {
			for _, cpu := range cpus {
				if !slices.Contains(pinned, cpu) {
					pinned = append(pinned, cpu)
				}
			}
		}
	}
	if c.Cores > 0 && every {
		c.Cores = float64(len(pinned)) // the CPUs its stages are pinned to
	}
	share := max(1, runtime.NumCPU()/max(processes, 1))
	if c.Cores > 0 {
		share = max(1, int(c.Cores)/max(processes, 1))
	}
	c.Threads = cmp.Or(cfg.Compute.BLASThreads, share)
	return c
}
