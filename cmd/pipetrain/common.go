package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
)

// runFlags are shared by the commands that train.
type runFlags struct {
	config string
	runDir string
	steps  int
	// cmd is the command the flags are registered on, to tell a --steps
	// given as 0 from one not given.
	cmd *cobra.Command
}

func (f *runFlags) register(c *cobra.Command, defaultRunDir string) {
	f.cmd = c
	c.Flags().StringVarP(&f.config, "config", "c", "", "run config (YAML); see configs/")
	usage := "directory for events, metrics, logs and weights"
	if defaultRunDir == "" {
		// Cobra shows a non-empty default itself; an empty one means this.
		usage += " (default: runs/NAME-TIME, a new one per run)"
	}
	c.Flags().StringVar(&f.runDir, "run-dir", defaultRunDir, usage)
	c.Flags().IntVar(&f.steps, "steps", 0, "override train.steps")
	c.MarkFlagRequired("config")
}

// load reads the config for a training command, applies the command-line
// overrides (flags beat PIPETRAIN_* variables, which beat the file) and checks that
// the data is there before any process starts.
func (f *runFlags) load() (*configs.Config, error) {
	if err := f.checkSteps(); err != nil {
		return nil, err
	}
	c, err := configs.Load(f.config)
	if err != nil {
		return nil, err
	}
	if err := c.CheckData(); err != nil {
		return nil, err
	}
	if f.steps > 0 {
		c.Train.Steps = f.steps
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	if f.runDir == "" {
		// A new directory per run, so no run overwrites another unless asked to.
		name := c.Name
		if name == "" {
			name = strings.TrimSuffix(filepath.Base(c.Path), filepath.Ext(c.Path))
		}
		f.runDir = filepath.Join("runs", name+"-"+time.Now().Format("20060102-150405"))
	}
	return c, nil
}

// checkSteps refuses a --steps given below 1: 0 would otherwise read as
// "not given" and the config's steps would run without a word.
func (f *runFlags) checkSteps() error {
	if f.cmd != nil && f.cmd.Flags().Changed("steps") && f.steps < 1 {
		return fmt.Errorf("--steps %d: want 1 or more (leave it out to train the config's train.steps)", f.steps)
	}
	return nil
}
