package main

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// selection is the part of the sweep the flags ask for; its zero value (but
// for recompute, which flag sets true) is the whole sweep.
type selection struct {
	setups, schedules, micros string
	recompute                 bool
}

// partial reports whether the selection leaves out any of the sweep.
func (s selection) partial() bool {
	return s.setups != "" || s.schedules != "" || s.micros != "" || !s.recompute
}

// choose returns the setups and rows to measure. 1f1b's plain row is kept
// whatever is chosen: the throughput column is relative to it.
func (s selection) choose(setups []setup, rows []row) ([]setup, []row, error) {
	var keys, names []string
	for _, su := range setups {
		keys = append(keys, su.key)
	}
	for _, r := range rows {
		if !slices.Contains(names, r.name) {
			names = append(names, r.name)
		}
	}
	wantSetups, err := list("-setups", s.setups, keys)
	if err != nil {
		return nil, nil, err
	}
	wantNames, err := list("-schedules", s.schedules, names)
	if err != nil {
		return nil, nil, err
	}
	var micros []int
	for _, f := range fields(s.micros) {
		m, err := strconv.Atoi(f)
		if err != nil || m < 1 {
			return nil, nil, fmt.Errorf("-micro-batches: %q is not a positive count", f)
		}
		micros = append(micros, m)
	}
	var outSetups []setup
	for _, su := range setups {
		if wantSetups == nil || slices.Contains(wantSetups, su.key) {
			if micros != nil {
				su.micros = micros
			}
			outSetups = append(outSetups, su)
		}
	}
	var outRows []row
	for _, r := range rows {
		baseline := r == row{"1f1b", false}
		chosen := wantNames == nil || slices.Contains(wantNames, r.name)
		if baseline || chosen && (s.recompute || !r.recompute) {
			outRows = append(outRows, r)
		}
	}
	return outSetups, outRows, nil
}

// list splits a comma-separated flag value and checks every item against
// known; an empty value is nil (everything).
func list(flagName, value string, known []string) ([]string, error) {
	items := fields(value)
	for _, it := range items {
		if !slices.Contains(known, it) {
			return nil, fmt.Errorf("%s: unknown %q (known: %s)", flagName, it, strings.Join(known, ", "))
		}
	}
	return items, nil
}

func fields(value string) []string {
	var out []string
	for _, f := range strings.Split(value, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// explicit reports whether the named flag was given on the command line.
func explicit(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
