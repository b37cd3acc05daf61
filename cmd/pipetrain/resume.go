package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/stages"
)

// launchInfo is what a run directory keeps of how its run was launched, so
// that launch --resume and sample continue it with exactly its settings: the
// file, the flags and the PIPETRAIN_* overrides.
type launchInfo struct {
	Config string `json:"config"`
	Steps  int    `json:"steps,omitempty"`
	// Env holds the PIPETRAIN_* variables the run was launched with; a resume
	// sets those it is not given again.
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv names the secret variables that were set. Their values are
	// never written to disk, so a resume needs them set again.
	SecretEnv []string `json:"secret_env,omitempty"`
	// Training holds the settings the run's checkpoints depend on
	// (configs.TrainingSettings), so a resume can name any that changed.
	Training map[string]string `json:"training,omitempty"`
}

const launchFile = "launch.json"

// pipetrainEnv returns the PIPETRAIN_* variables of this process.
func pipetrainEnv() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PIPETRAIN_") {
			env[k] = v
		}
	}
	return env
}

// newLaunchInfo describes the run about to start from its flags, this
// process's environment and its loaded config.
func newLaunchInfo(f runFlags, cfg *configs.Config) (launchInfo, error) {
	abs, err := filepath.Abs(f.config)
	if err != nil {
		return launchInfo{}, err
	}
	info := launchInfo{Config: abs, Steps: f.steps, Env: pipetrainEnv(), Training: cfg.TrainingSettings()}
	for _, k := range configs.SecretVariables() {
		if _, ok := info.Env[k]; ok {
			delete(info.Env, k)
			info.SecretEnv = append(info.SecretEnv, k)
		}
	}
	return info, nil
}

func writeLaunchInfo(runDir string, info launchInfo) error {
	if err := runlog.MkdirAll(runDir); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(info, "", "  ")
	return checkpoint.WriteAtomic(filepath.Join(runDir, launchFile), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// readLaunchInfo reads RUN_DIR/launch.json; a missing file is os.ErrNotExist.
func readLaunchInfo(runDir string) (*launchInfo, error) {
	path := filepath.Join(runDir, launchFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var info launchInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &info, nil
}

// resumeFrom points the flags at the run in dir: its directory and, unless
// given, the config and step count it was launched with; it sets again each
// PIPETRAIN_* variable the run had and this process lacks, so the config loads
// as it did then. It returns the run's launch info (nil when dir has no
// launch.json and the config was given) and a line for each variable given now
// with another value than the run's.
func (f *runFlags) resumeFrom(dir string) (info *launchInfo, overrides []string, err error) {
	f.runDir = dir
	info, err = readLaunchInfo(dir)
	if errors.Is(err, os.ErrNotExist) && f.config != "" {
		return nil, nil, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s: no %s: not a run directory written by pipetrain launch (give --config too)", dir, launchFile)
	}
	if err != nil {
		return nil, nil, err
	}
	if f.config == "" {
		f.config = info.Config
	}
	if f.steps == 0 {
		f.steps = info.Steps
	}
	keys := make([]string, 0, len(info.Env))
	for k := range info.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		was := info.Env[k]
		now, set := os.LookupEnv(k)
		switch {
		case !set:
			os.Setenv(k, was)
		case now != was:
			overrides = append(overrides, fmt.Sprintf("%s=%s (the run had %s)", k, now, was))
		}
	}
	for _, k := range info.SecretEnv {
		if _, set := os.LookupEnv(k); !set {
			return nil, nil, fmt.Errorf("%s: the run was launched with %s set; set it again to continue it (its value is never written to the run directory)", dir, k)
		}
	}
	return info, overrides, nil
}

// checkResumable refuses, before any stage starts, a resume that could not
// continue the run: settings its checkpoints depend on changed (each is named,
// with the variable that changed it), or no complete checkpoint of this
// config is there. It returns the step the run continues from.
func checkResumable(runDir string, info *launchInfo, cfg *configs.Config) (int, error) {
	if info != nil && info.Training != nil {
		if changes := configs.DiffSettings(info.Training, cfg.TrainingSettings()); len(changes) > 0 {
			lines := make([]string, len(changes))
			for i, c := range changes {
				lines[i] = c.String() + settingSource(c.Key, cfg)
			}
			return 0, fmt.Errorf("cannot resume %s: its checkpoints depend on settings that changed since it started:\n  %s\nput them back, or start a new run with --run-dir",
				runDir, strings.Join(lines, "\n  "))
		}
	}
	root := runlog.CheckpointDir(runDir)
	m, skipped, err := checkpoint.Latest(root, cfg.TrainingDigest())
	if err != nil {
		return 0, err
	}
	reasons := make([]string, len(skipped))
	for i, s := range skipped {
		reasons[i] = s.Error()
	}
	if m != nil {
		// The stages print the same, each for itself; said here once,
		// before any starts, it is what a resume falling back reads first.
		for _, r := range reasons {
			fmt.Printf("pipetrain: skipping checkpoint: %s\n", r)
		}
		return m.Step, nil
	}
	if len(checkpoint.Unusable(skipped)) > 0 {
		return 0, fmt.Errorf("cannot resume %s: no usable checkpoint:\n  %s", runDir, strings.Join(reasons, "\n  "))
	}
	none := fmt.Sprintf("cannot resume %s: it has no complete checkpoint (checkpoint.every is %d)", runDir, cfg.Checkpoint.Every)
	if len(reasons) > 0 {
		none += ":\n  " + strings.Join(reasons, "\n  ") + "\n"
	} else {
		none += "; "
	}
	return 0, fmt.Errorf("%sstart it again with --config %s --run-dir %s --force", none, cfg.Path, runDir)
}

// settingSource says where a setting's current value comes from, when that is
// a PIPETRAIN_* variable rather than the file.
func settingSource(key string, cfg *configs.Config) string {
	name := configs.EnvName(key)
	if v, ok := os.LookupEnv(name); ok {
		return fmt.Sprintf(" (from %s=%s)", name, v)
	}
	return fmt.Sprintf(" (from %s)", cfg.Path)
}

// errComplete says a resumed run has nothing left to train.
var errComplete = errors.New("is complete")

// checkUnfinished refuses a resume from the checkpoint of step from that
// would train nothing: one past the steps to train, whose weights would be
// saved as those of the earlier step, and, with errComplete, a run that
// trained every step and saved its weights (a run stopped after its last
// checkpoint but before its weights resumes, to evaluate and save them).
func checkUnfinished(runDir string, from int, cfg *configs.Config) error {
	steps := cfg.Train.Steps
	switch {
	case from > steps:
		return fmt.Errorf("cannot resume %s: its checkpoint is of step %d, past the %d steps to train; give --steps %d or more", runDir, from, steps, from+1)
	case from == steps && stages.Finished(cfg, runDir):
		return fmt.Errorf("%s %w: it trained all %d steps and saved its weights; give --steps N (more than %d) to train on", runDir, errComplete, steps, steps)
	}
	return nil
}
