// Command pipetrain trains models split into pipeline stages, one process per stage,
// exchanging activations and gradients over gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func main() {
	// A stage answers the launcher's status queries (SIGUSR1) while it
	// trains; one that comes as it exits must not kill it (SIGUSR1's default)
	// before it has printed its error.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGUSR1)
	ctx, stop := signalContext()
	defer stop()
	if cmd, err := newRoot().ExecuteContextC(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pipetrain:", err)
		os.Exit(exitStatus(cmd, err, os.Stderr))
	}
}

// exitStatus is the exit status of a command that failed with err: 130 for
// an interrupt, launcher.ExitRepeats for a failure that a restart from a
// checkpoint would repeat, 1 otherwise. A stage says why it would repeat on
// a line of its own (to stderr), for the launcher to repeat.
func exitStatus(cmd *cobra.Command, err error, stderr io.Writer) int {
	if errors.Is(err, launcher.ErrInterrupted) {
		return 130
	}
	var failed *launcher.StageError
	if errors.As(err, &failed) && failed.Repeats() {
		return launcher.ExitRepeats // a launch that gave up on such a stage
	}
	why := repeatCause(err)
	if why == "" {
		return 1
	}
	if cmd != nil && cmd.Name() == "stage" {
		fmt.Fprintln(stderr, launcher.FormatRepeats(why))
	}
	return launcher.ExitRepeats
}

// repeatCause says why err, which stopped a stage, would stop it again if
// the run restarted from its checkpoint, completing "stage 0 ...": a full
// disk, bad data, a NaN or infinite loss or gradient, a refused config,
// diverged replicas. It is "" for a failure a restart may cure (a lost
// neighbour, a killed process, a timeout).
func repeatCause(err error) string {
	var refused refusedConfig
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return "ran out of disk space" + where(err)
	case errors.Is(err, syscall.EDQUOT):
		return "ran out of its disk quota" + where(err)
	case errors.Is(err, stages.ErrNonFinite):
		return "computed a NaN or infinite value (training diverged)"
	case errors.Is(err, data.ErrBadData):
		return "found data the model cannot train on"
	case errors.Is(err, stages.ErrDiverged):
		return "found its replicas diverged"
	case errors.As(err, new(*configs.Problems)), errors.As(err, &refused):
		return "refused its config"
	}
	return ""
}

// where names the folder of the file a failed write was to, if err says:
// " in DIR" (the file itself may be a temporary one).
func where(err error) string {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) && pathErr.Path != "" {
		return " in " + filepath.Dir(pathErr.Path)
	}
	return ""
}

// refusedConfig is the error of a config that could not be loaded (read,
// parsed or validated): the same file refuses a restart the same way.
type refusedConfig struct{ err error }

func (e refusedConfig) Error() string { return e.err.Error() }
func (e refusedConfig) Unwrap() error { return e.err }

// signalContext is cancelled, with launcher.ErrInterrupted as its cause, on
// SIGINT or SIGTERM. A second such signal closes the context's second-interrupt
// channel (launcher.WithSecondInterrupt): launch stops its stages at a step
// boundary after the first, and at once after the second.
func signalContext() (context.Context, func()) {
	base, cancel := context.WithCancelCause(context.Background())
	again := make(chan struct{})
	ctx := launcher.WithSecondInterrupt(base, again)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s, ok := <-ch
		if !ok {
			return
		}
		cancel(fmt.Errorf("%w (%v)", launcher.ErrInterrupted, s))
		if _, ok := <-ch; ok {
			close(again)
		}
	}()
	return ctx, func() { signal.Stop(ch); close(ch); cancel(nil) }
}

// newRoot is the pipetrain command with every subcommand.
func newRoot() *cobra.Command {
	var cpuProfile string
	var stopProfile func()
	root := &cobra.Command{
		Use:   "pipetrain",
		Short: "Pipeline-parallel training: one process per stage, gRPC between them",
		Example: `  pipetrain validate --config configs/fmnist-mlp-4stage.yaml    # check a config, see its grid
  pipetrain plan --config configs/fmnist-mlp-unbalanced.yaml    # propose a balanced split
  pipetrain launch --config configs/fmnist-mlp-4stage.yaml --run-dir runs/mlp4
  pipetrain profile runs/mlp4                                   # bubble per stage, measured and predicted
  pipetrain completion bash > /etc/bash_completion.d/pipetrain  # or zsh, fish`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if cpuProfile == "" {
				return nil
			}
			var err error
			stopProfile, err = startCPUProfile(cpuProfile)
			return err
		},
		PersistentPostRun: func(*cobra.Command, []string) {
			if stopProfile != nil {
				stopProfile()
			}
		},
	}
	root.PersistentFlags().StringVar(&cpuProfile, "cpuprofile", "", "write a Go CPU profile of this process to `FILE` (go tool pprof FILE)")
	root.AddCommand(launchCmd(), sampleCmd(), exportCmd(), evaluateCmd(), plotCmd(), stageCmd(), gatherCmd(), referenceCmd(), profileCmd(), simulateCmd(), planCmd(), validateCmd(), schemaCmd(), certsCmd(), versionCmd(), dataCmd(), psServerCmd())
	// Cobra adds completion when the command runs; adding it here lets the
	// tests that read every command see it too.
	root.InitDefaultCompletionCmd()
	return root
}

// startCPUProfile profiles this process into path until the returned stop.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
