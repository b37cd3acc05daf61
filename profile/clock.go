package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Clock is the clock a stage's events are timed on, as the stage process
// records it when it starts, next to its event log (ClockFile): its host name
// and the Linux kernel's boot id (/proc/sys/kernel/random/boot_id). Processes
// under one kernel, containers included, read one wall clock; the kernel draws
// a new boot id at random at every boot, so two hosts never have the same one.
//
//	{"host":"gpu1","boot_id":"1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"}
type Clock struct {
	Host   string `json:"host"`
	BootID string `json:"boot_id"` // "" where the stage could read none
	// Earlier holds, oldest first, the clocks of the stage's earlier
	// processes whose events its log still holds: a resumed run appends to the
	// log. An entry without a boot id stands for events logged before the
	// stage recorded its clock.
	Earlier []Clock `json:"earlier,omitempty"`
}

// ClockFile is the path of stage's clock record inside a run directory:
// events/stage-<i>.clock.json, beside its event log.
func ClockFile(dir string, stage int) string {
	return filepath.Join(dir, "events", fmt.Sprintf("stage-%d.clock.json", stage))
}

// Known reports whether c names the clock of every event in its stage's
// log: it has a boot id, and so has every earlier entry.
func (c *Clock) Known() bool {
	if c.BootID == "" {
		return false
	}
	for i := range c.Earlier {
		if c.Earlier[i].BootID == "" {
			return false
		}
	}
	return true
}

// Shares reports whether two stages' logs were timed on one clock throughout:
// both are Known, with the same boot ids in the same order.
func (c *Clock) Shares(d *Clock) bool {
	return c.Known() && d.Known() && c.key() == d.key()
}

// key is the boot ids of c's processes, oldest first.
func (c *Clock) key() string {
	var ids []string
	for _, e := range c.Earlier {
		ids = append(ids, e.BootID)
	}
	return strings.Join(append(ids, c.BootID), " ")
}

// ReadClocks reads the clock records of a run's stages (ClockFile). A stage
// without one (a run directory from before stages recorded their clocks, or
// logs copied without it) gets the zero Clock, which shares no other's; the
// result is nil when no stage has one. A record that cannot be read or parsed
// is an error naming the file.
func ReadClocks(dir string, stages int) ([]Clock, error) {
	clocks := make([]Clock, stages)
	found := false
	for s := range clocks {
		path := ClockFile(dir, s)
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
		i, ok := at[c.key()]
		if !ok {
			i = len(groups)
			at[c.key()] = i
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
