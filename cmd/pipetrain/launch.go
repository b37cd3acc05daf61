package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/stages"
)

func launchCmd() *cobra.Command {
	var f runFlags
	var resumeDir string
	var force bool
	c := &cobra.Command{
		Use:   "launch --config FILE | --resume RUN_DIR",
		Short: "Run every stage of a config as its own process on this machine, restarting failed runs from their checkpoints",
		Example: `  # every stage of the default config on this machine, one process each
  pipetrain launch --config configs/fmnist-mlp-4stage.yaml --run-dir runs/mlp4

  # continue a stopped run from its newest checkpoint
  pipetrain launch --resume runs/mlp4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if force && resumeDir != "" {
				return errors.New("--force deletes the run that --resume continues: give one of them")
			}
			// Refused before the config is read, deleted (--force) only
			// once it has loaded: a config that fails costs no run.
			claim := func(force bool) error {
				if resumeDir != "" {
					return nil
				}
				return claimRunDir(f.runDir, force, "pipetrain launch --resume "+f.runDir)
			}
			if err := claim(false); !force && err != nil {
				return err
			}
			cfg, info, err := f.loadLaunch(resumeDir)
			if errors.Is(err, errComplete) {
				fmt.Printf("pipetrain: %v\n", err)
				return nil
			}
			if err != nil {
				return err
			}
			if err := claim(force); err != nil {
				return err
			}
			if err := writeLaunchInfo(f.runDir, info); err != nil {
				return err
			}
			if resumeDir == "" {
				// A previous run's logs in the same directory would otherwise be
				// read by the live view before the stages replace them.
				clearRunLogs(f.runDir)
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			var extra []string
			if f.steps > 0 {
				extra = append(extra, "--steps", strconv.Itoa(f.steps))
			}
			grid := words.Count(len(cfg.Stages), "stage")
			if r := cfg.Replicas(); r > 1 {
				grid = fmt.Sprintf("%s × %d replicas (%d processes)", grid, r, cfg.Processes())
			}
			if n := cfg.ParameterServers.Count; n > 0 {
				grid += " and " + words.Count(n, "parameter server")
			}
			fmt.Printf("pipetrain: %s of %s, run directory %s\n", grid, cfg.Path, f.runDir)
			live := launcher.NewLive(f.runDir, len(cfg.Stages), 10)
			stopLive := make(chan struct{})
			go live.Follow(500*time.Millisecond, stopLive)
			defer close(stopLive)
			last := cfg.LossStage() // the stage that logs the steps' losses
			opts := launcher.Options{
				Binary: exe, ConfigPath: cfg.Path, Stages: len(cfg.Stages), Replicas: cfg.Replicas(), RunDir: f.runDir,
				ExtraArgs: extra, Out: os.Stdout, Resume: resumeDir != "",
				Decorate: func(stage int, line string) string {
					if stage != last || !strings.HasPrefix(line, "step ") {
						return line
					}
					live.Poll()
					if b, slowest, ok := live.Bubble(); ok {
						return fmt.Sprintf("%s  bubble %.0f%% (busiest: stage %d)", line, 100*b, slowest)
					}
					return line
				},
			}
			if cfg.PSEnabled() && cfg.ParameterServers.Mode == "async" {
				// Async servers stop waiting for a worker that is gone; replica 0
				// writes the run's metrics, weights and evaluation, so it stays.
				opts.Expendable = func(replica int) bool { return replica != 0 }
				if rejoins(cfg) {
					opts.Rejoins = cfg.Recovery.MaxRestarts
					opts.Rejoin = func(int) (int, error) { return rejoinStep(cfg, f.runDir) }
				}
			}
			if opts.Env, err = localRendezvous(cfg); err != nil {
				return err
			}
			announcePS(cfg, os.Stdout)
			if err := superviseRun(cmd.Context(), cfg, opts); err != nil {
				return err
			}
			return printSummary(f.runDir)
		},
	}
	f.register(c, "")
	c.Flags().Lookup("config").Annotations = nil // not required with --resume
	c.Flags().StringVar(&resumeDir, "resume", "", "continue the run in RUN_DIR from its newest complete checkpoint (its config is found in RUN_DIR/launch.json)")
	c.Flags().BoolVar(&force, "force", false, "start afresh in a --run-dir that holds another run, deleting its checkpoints, weights, logs, events and metrics first")
	return c
}

// localRendezvous gives a launch whose processes meet at a rendezvous what
// its stages need in their environment. Unless the config sets a token or
// TLS, that is a token made for this launch alone: rank 0 serves the
// rendezvous (and through it checkpoint commits and the gather of every
// rank's files) on a TCP port any local user could otherwise reach. The
// token goes in the stages' environment only, never on their command line
// (readable by every user) nor in launch.json: a resume or a restart of
// every process needs no old one. The same token then guards the links and
// the metrics. When nothing names the rendezvous, stage 0 serves it on a
// free loopback port, which every stage learns from MASTER_ADDR/MASTER_PORT.
func localRendezvous(cfg *configs.Config) ([]string, error) {
	if !cfg.UsesRendezvous() {
		return nil, nil
	}
	var env []string
	if !cfg.Authenticated() {
		env = append(env, configs.TokenVariable+"="+configs.NewToken())
	}
	if cfg.Rendezvous != "" || os.Getenv("MASTER_ADDR") != "" {
		return env, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("choosing a rendezvous port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return append(env, "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port)), nil
}

// loadLaunch loads the config of a new run, or of the run in resumeDir with
// the settings it was launched with, refusing a resume that could not continue
// it. It returns what launch.json is to hold.
func (f *runFlags) loadLaunch(resumeDir string) (*configs.Config, launchInfo, error) {
	// Before resumeFrom, which takes a --steps of 0 for one not given.
	if err := f.checkSteps(); err != nil {
		return nil, launchInfo{}, err
	}
	if resumeDir == "" {
		if f.config == "" {
			return nil, launchInfo{}, errors.New(`required flag "config" not set (or give --resume RUN_DIR)`)
		}
		cfg, err := f.load()
		if err != nil {
			return nil, launchInfo{}, err
		}
		info, err := newLaunchInfo(*f, cfg)
		return cfg, info, err
	}
	was, overrides, err := f.resumeFrom(resumeDir)
	if err != nil {
		return nil, launchInfo{}, err
	}
	cfg, err := f.load()
	if err != nil {
		return nil, launchInfo{}, err
	}
	from, err := checkResumable(resumeDir, was, cfg)
	if err != nil {
		return nil, launchInfo{}, err
	}
	if err := checkUnfinished(resumeDir, from, cfg); err != nil {
		return nil, launchInfo{}, err
	}
	for _, o := range overrides {
		fmt.Printf("pipetrain: resuming with %s\n", o)
	}
	fmt.Printf("pipetrain: resuming %s from the checkpoint of step %d\n", resumeDir, from)
	// The checkpoint resumed from was checked against these settings, so
	// they are the run's even where an older launch.json did not record them.
	info, err := newLaunchInfo(*f, cfg)
	return cfg, info, err
}

// superviseRun runs the job and, when a stage fails, restarts every stage from
// the newest complete checkpoint, up to recovery.max_restarts times, saying
// what was lost. It gives up at once on an interrupt, when the failed stage
// said a restart would fail the same way (saying why), or when an attempt
// failed before completing a step (the fault would only repeat).
func superviseRun(ctx context.Context, cfg *configs.Config, opts launcher.Options) error {
	root := runlog.CheckpointDir(opts.RunDir)
	startedAt := resumePoint(root, cfg)
	if !opts.Resume {
		startedAt = 0
	}
	for restarts := 0; ; restarts++ {
		opts.Attempt = restarts
		err := runAttempt(ctx, cfg, opts)
		var failed *launcher.StageError
		if err == nil || !errors.As(err, &failed) || ctx.Err() != nil {
			return err
		}
		reached := lastLoggedStep(opts.RunDir)
		from := resumePoint(root, cfg)
		if failed.Repeats() {
			return fmt.Errorf("%w\npipetrain: not restarting: %s", err, whyNoRestart(failed))
		}
		if restarts >= cfg.Recovery.MaxRestarts {
			return fmt.Errorf("%w\npipetrain: not restarting: recovery.max_restarts is %d; resume by hand with: pipetrain launch --resume %s", err, cfg.Recovery.MaxRestarts, opts.RunDir)
		}
		if reached <= startedAt {
			return fmt.Errorf("%w\npipetrain: not restarting: the run failed again before completing a step past %d", err, startedAt)
		}
		fmt.Fprintf(opts.Out, "pipetrain: %v\n", err)
		fmt.Fprintf(opts.Out, "pipetrain: %s failed after step %d; restarting from %s, restart %d of %d\n",
			failed.Process(), reached, restartPoint(from, reached-from), restarts+1, cfg.Recovery.MaxRestarts)
		opts.Resume, startedAt = true, from
	}
}

// runAttempt runs the job once: the stage processes and, beside them, the
// parameter servers, started afresh for each attempt and resuming with the
// stages from the same checkpoint.
func runAttempt(ctx context.Context, cfg *configs.Config, opts launcher.Options) error {
	servers, err := startPSServers(cfg, opts)
	if err != nil {
		return err
	}
	if err := launcher.Run(ctx, opts); err != nil {
		servers.kill(opts.Out)
		return err
	}
	return servers.stop()
}

// rejoinStep is the step a worker's restarted processes rejoin an async
// run at: the step replica 0 has logged, which they train from, each
// reading that step's share of the batch on.
func rejoinStep(cfg *configs.Config, runDir string) (int, error) {
	step := lastLoggedStep(runDir)
	if step >= cfg.Train.Steps {
		return 0, fmt.Errorf("replica 0 has trained all %d steps", cfg.Train.Steps)
	}
	return step, nil
}

// whyNoRestart says why a failure that a restart would repeat is not
// restarted, in the stage's words where it gave them.
func whyNoRestart(failed *launcher.StageError) string {
	if failed.RepeatsWhy == "" {
		return fmt.Sprintf("%s failed in a way a restart from a checkpoint would repeat", failed.Process())
	}
	return fmt.Sprintf("%s %s; a restart would fail the same way", failed.Process(), failed.RepeatsWhy)
}

// restartPoint says where a restart resumes from and what it loses.
func restartPoint(from, lost int) string {
	if from == 0 {
		return fmt.Sprintf("the start (no checkpoint yet; %s lost)", words.Count(lost, "step"))
	}
	return fmt.Sprintf("the checkpoint of step %d (%s lost)", from, words.Count(lost, "step"))
}

// resumePoint is the step of the run's newest complete checkpoint, 0 if none.
func resumePoint(root string, cfg *configs.Config) int {
	m, _, err := checkpoint.Latest(root, cfg.TrainingDigest())
	if err != nil || m == nil {
		return 0
	}
	return m.Step
}

// lastLoggedStep is the last step in the run's metrics.jsonl (0 if none).
// The file may be read while replica 0 writes it (a worker rejoining), so
// a last line cut short is not counted, nor is anything after it.
func lastLoggedStep(runDir string) int {
	b, _ := os.ReadFile(filepath.Join(runDir, "metrics.jsonl"))
	step := 0
	for _, line := range strings.Split(string(b), "\n") {
		var m stages.Metric
		if json.Unmarshal([]byte(line), &m) != nil {
			break
		}
		step = m.Step
	}
	return step
}

// printSummary reports the run's final loss and test accuracy from its files.
func printSummary(runDir string) error {
	var last stages.Metric
	mf, err := os.Open(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		return err
	}
	defer mf.Close()
	s := bufio.NewScanner(mf)
	for s.Scan() {
		if err := json.Unmarshal(s.Bytes(), &last); err != nil {
			return fmt.Errorf("%s: %w", mf.Name(), err)
		}
	}
	fmt.Printf("pipetrain: done: %d steps, final loss %.4f, %.1fs\n", last.Step, last.Loss, last.ElapsedSec)
	if b, err := os.ReadFile(filepath.Join(runDir, "eval.json")); err == nil {
		var ev stages.EvalResult
		if err := json.Unmarshal(b, &ev); err == nil && ev.Perplexity > 0 {
			fmt.Printf("pipetrain: validation loss %.4f, perplexity %.2f on %d tokens\n", ev.Loss, ev.Perplexity, ev.Examples)
		} else if err == nil {
			fmt.Printf("pipetrain: test accuracy %.2f%% on %d test images\n", 100*ev.Accuracy, ev.Examples)
		}
	}
	printNext(os.Stdout, runDir)
	return nil
}

// printNext says where a finished run's files are and the commands that
// read them: the profile, the loss curve, the export and, when the run kept
// a checkpoint, training on from it.
func printNext(w io.Writer, runDir string) {
	fmt.Fprintf(w, "pipetrain: files in %s: metrics.jsonl (a line per step), eval.json, events/ (each stage's actions), weights/ (each stage's final weights)\n", runDir)
	fmt.Fprintf(w, "pipetrain: see the bubble with: pipetrain profile %s\n", runDir)
	fmt.Fprintf(w, "pipetrain: draw the loss with:  pipetrain plot %s\n", runDir)
	fmt.Fprintf(w, "pipetrain: export weights with: pipetrain export %s --out %s\n", runDir, filepath.Join(runDir, "model.safetensors"))
	if steps, _ := filepath.Glob(filepath.Join(runlog.CheckpointDir(runDir), "step-*")); len(steps) > 0 {
		fmt.Fprintf(w, "pipetrain: train on with:       pipetrain launch --resume %s --steps N\n", runDir)
	}
}

// clearRunLogs removes a previous run's event logs and metrics from runDir.
func clearRunLogs(runDir string) {
	old, _ := filepath.Glob(filepath.Join(runDir, "events", "stage-*.jsonl"))
	for _, p := range append(old, filepath.Join(runDir, "metrics.jsonl")) {
		os.Remove(p)
	}
}
