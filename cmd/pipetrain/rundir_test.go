package main

import (
	"strings"
	"testing"
)

// TestStepsBelowOneRefused: a --steps given as 0 or -1 is refused naming the
// flag, rather than read as "not given" and the config's steps trained.
func TestStepsBelowOneRefused(t *testing.T) {
	cfgPath, runDir := fakeRun(t, false)
	for _, args := range [][]string{
		{"launch", "--config", cfgPath, "--steps", "0"},
		{"launch", "--config", cfgPath, "--steps", "-1"},
		{"launch", "--resume", runDir, "--config", cfgPath, "--steps", "0"},
		{"reference", "--config", cfgPath, "--steps", "0"},
		{"stage", "--config", cfgPath, "--stage", "0", "--steps", "-1"},
	} {
		_, err := runCommand(t, newRoot(), args...)
		if err == nil || !strings.Contains(err.Error(), "--steps "+args[len(args)-1]+": want 1 or more") {
			t.Errorf("%v: %v", args, err)
		}
	}
}
