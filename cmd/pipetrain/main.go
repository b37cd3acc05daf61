// Command pipetrain trains models split into pipeline stages, one process per stage,
// exchanging activations and gradients over gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func main() {
	ctx, stop := signalContext()
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "pipetrain:", err)
		switch {
		case errors.Is(err, launcher.ErrInterrupted):
			os.Exit(130)
		case errors.Is(err, stages.ErrDiverged):
			os.Exit(launcher.ExitRepeats)
		}
		os.Exit(1)
	}
}

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
	root.AddCommand(launchCmd(), sampleCmd(), exportCmd(), plotCmd(), stageCmd(), gatherCmd(), referenceCmd(), profileCmd(), simulateCmd(), planCmd(), validateCmd(), schemaCmd(), certsCmd(), versionCmd())
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
