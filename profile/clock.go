package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/pipetrain/pipetrain/runlog"
)

// Clock is the clock a stage's events are timed on (see runlog.Clock).
type Clock = runlog.Clock

// ClockFile is the path of stage's clock record inside a run directory.
func ClockFile(dir string, stage int) string { return runlog.ClockFile(dir, stage) }

// ReadClocks reads the clock records of a run's stages (ClockFile). A stage
// without one (a run directory from before stages recorded their clocks, or
// logs copied without it) gets the zero Clock, which shares no other's; the
// result is nil when no stage has one. A record that cannot be read or parsed
// is an error naming the file.
func ReadClocks(dir string, stages int) ([]Clock, error) {
	return ReadReplicaClocks(dir, stages, 0)
}

// ReadReplicaClocks is ReadClocks for the stages of one replica: each
// process records its own clock beside its log (runlog.ReplicaClockFile), and
// replica 0's are ReadClocks'.
func ReadReplicaClocks(dir string, stages, replica int) ([]Clock, error) {
	clocks := make([]Clock, stages)
	found := false
	for s := range clocks {
		path := runlog.ReplicaClockFile(dir, s, replica)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		if err := json.Unmarshal(b, &clocks[s]); err != nil {
			return nil, fmt.Errorf("profile: %s: %w", path, err)
		}
		found = true
	}
	if !found {
		return nil, nil
	}
	return clocks, nil
}

// clockAt returns stage s's clock, the zero Clock when clocks has none for it.
func clockAt(clocks []Clock, s int) *Clock {
	if s < len(clocks) {
		return &clocks[s]
	}
	return &Clock{}
}

// clockGroup is a set of stages on one known clock, or (known false) the
// stages whose clock is not known.
type clockGroup struct {
	stages []int
	clock  *Clock // the first stage's
	known  bool
}

// clockGroups groups a run's stages by shared clock, in the order of their
// first stage, with the stages of unknown clock last (one group); nil when no
// stage recorded a clock.
func clockGroups(clocks []Clock) []clockGroup {
	if clocks == nil {
		return nil
	}
	var groups []clockGroup
	var unknown []int
	at := map[string]int{} // key -> index in groups
	for s := range clocks {
		c := &clocks[s]
		if !c.Known() {
			unknown = append(unknown, s)
			continue
		}
		i, ok := at[c.Key()]
		if !ok {
			i = len(groups)
			at[c.Key()] = i
			groups = append(groups, clockGroup{clock: c, known: true})
		}
		groups[i].stages = append(groups[i].stages, s)
	}
	if len(unknown) > 0 {
		groups = append(groups, clockGroup{stages: unknown})
	}
	return groups
}

// describe says which stages g holds and which clock: "stages 0-3 share one
// clock (boot id 1a2b3c4d…, host gpu1)".
func (g clockGroup) describe(clocks []Clock) string {
	if !g.known {
		if len(g.stages) == 1 {
			return fmt.Sprintf("clock of stage %s unknown", stageList(g.stages))
		}
		return fmt.Sprintf("clocks of stages %s unknown", stageList(g.stages))
	}
	var hosts []string
	for _, s := range g.stages {
		if h := clocks[s].Host; h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	id := g.clock.BootID
	if r := []rune(id); len(r) > 8 {
		id = string(r[:8]) + "…"
	}
	what := "boot id " + id
	switch len(hosts) {
	case 0:
	case 1:
		what += ", host " + hosts[0]
	default:
		what += ", hosts " + strings.Join(hosts, ", ")
	}
	if len(g.stages) == 1 {
		return fmt.Sprintf("stage %s on a clock of its own (%s)", stageList(g.stages), what)
	}
	switch n := len(g.clock.Earlier); n {
	case 0:
	case 1:
		what += "; shared one before the resume too"
	default:
		what += fmt.Sprintf("; shared one before each of the %d resumes too", n)
	}
	return fmt.Sprintf("stages %s share one clock (%s)", stageList(g.stages), what)
}

// stageList writes ascending stage numbers with runs as ranges: "0-3",
// "0, 2", "0-1, 4".
func stageList(stages []int) string {
	var parts []string
	for i := 0; i < len(stages); {
		j := i
		for j+1 < len(stages) && stages[j+1] == stages[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(stages[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", stages[i], stages[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}
