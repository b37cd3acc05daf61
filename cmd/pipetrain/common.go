package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/stages"
)

// runFlags are shared by the commands that train.
type runFlags struct {
	config string
	runDir string
	steps  int
	share  bool // --share-run-dir
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
	registerShare(c, &f.share)
	c.MarkFlagRequired("config")
}

// load reads the config for a training command, applies the command-line
// overrides (flags beat PIPETRAIN_* variables, which beat the file) and checks that
// the data is there before any process starts.
func (f *runFlags) load() (*configs.Config, error) {
	if err := f.checkSteps(); err != nil {
		return nil, err
	}
	c, err := loadShared(f.config, f.share)
	if err != nil {
		return nil, err
	}
	// OpenBLAS fixed its kernels when this process started, before the
	// config was read: a config asking for others restarts the process once
	// with them (their variable set, which launch's stages inherit).
	if err := blas.Reload(c.Compute.BLASKernels); err != nil {
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

func registerShare(c *cobra.Command, share *bool) {
	c.Flags().BoolVar(share, "share-run-dir", false, "let every user read the run directory (run_dir_mode: shared; default: folders 0700, files 0600)")
}

// loadShared loads a config for a command that writes a run directory and
// makes this process write it with the config's run_dir_mode. share
// (--share-run-dir) sets the mode through its variable, which the stages
// launch starts inherit and launch.json records for a resume.
func loadShared(path string, share bool) (*configs.Config, error) {
	if share {
		os.Setenv("PIPETRAIN_RUN_DIR_MODE", runlog.ModeShared)
	}
	c, err := configs.Load(path)
	if err != nil {
		return nil, err
	}
	runlog.ShareRunDirs(c.RunDirMode == runlog.ModeShared)
	return c, nil
}

// runFiles are what launch, its stages and reference write into a run
// directory; --force deletes exactly these, leaving anything else the
// directory holds.
var runFiles = []string{"launch.json", "run.json", "metrics.jsonl", "eval.json", "events", "weights", "checkpoints", "logs"}

// claimRunDir makes dir ready for a new run. A directory holding another
// run is refused, saying what it holds, unless force, which deletes that
// run's files first: writing over it would delete its checkpoints as the
// new run starts and leave its other files (a stage's weights the new split
// has no stage for) to be mixed with the new run's. resume is how the
// refusal says to continue the run instead.
func claimRunDir(dir string, force bool, resume string) error {
	if dir == "" {
		return nil // a new directory is named when the config loads
	}
	held := runHoldings(dir)
	if len(held) == 0 {
		return nil
	}
	if !force {
		return fmt.Errorf("%s holds another run (%s): continue it with %s, or delete it and start again with --force",
			dir, strings.Join(held, "; "), resume)
	}
	for _, name := range runFiles {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("--force: clearing %s: %w", dir, err)
		}
	}
	fmt.Printf("pipetrain: --force: deleted the run in %s (%s)\n", dir, strings.Join(held, "; "))
	return nil
}

// runHoldings describes the run files in dir, one phrase each; none when
// dir is missing, empty or holds no run.
func runHoldings(dir string) []string {
	var held []string
	if steps := checkpointSteps(dir); len(steps) > 0 {
		held = append(held, "checkpoints of steps "+strings.Join(steps, ", "))
	}
	if ws, _ := filepath.Glob(filepath.Join(runlog.WeightsDir(dir), "stage-*.safetensors")); len(ws) > 0 {
		held = append(held, "final weights of "+words.Count(len(ws), "stage"))
	}
	described := map[string]bool{"checkpoints": true, "weights": true}
	if ms, _ := stages.ReadMetrics(filepath.Join(dir, "metrics.jsonl")); len(ms) > 0 {
		held = append(held, fmt.Sprintf("metrics up to step %d", ms[len(ms)-1].Step))
		described["metrics.jsonl"] = true
	}
	var other []string
	for _, name := range runFiles {
		if described[name] {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			other = append(other, name)
		}
	}
	if len(other) > 0 {
		held = append(held, strings.Join(other, ", "))
	}
	return held
}

// checkpointSteps lists the steps of dir's checkpoint folders, committed or
// not, oldest first.
func checkpointSteps(dir string) []string {
	folders, _ := filepath.Glob(filepath.Join(runlog.CheckpointDir(dir), "step-*"))
	var steps []string
	for _, f := range folders {
		if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(f), "step-")); err == nil {
			steps = append(steps, strconv.Itoa(n))
		}
	}
	return steps
}

// warnUnchecked says which weights files were read without a checksum file
// to check them against. Final weights have one since they were first
// checked; a run directory from before has none, and its weights are read
// as they are rather than refused.
func warnUnchecked(w io.Writer, files []string) {
	for _, f := range files {
		fmt.Fprintf(w, "pipetrain: warning: %s has no checksum file %s (written before final weights had one): read unchecked\n", f, filepath.Base(checkpoint.SumPath(f)))
	}
}
