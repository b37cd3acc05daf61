// Command pipetrain trains models split into pipeline stages, one process per stage,
// exchanging activations and gradients over gRPC.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
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

// signalContext is cancelled, with launcher.ErrInterrupted as its cause, on SIGINT or SIGTERM.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		if s, ok := <-ch; ok {
			cancel(fmt.Errorf("%w (%v)", launcher.ErrInterrupted, s))
		}
	}()
	return ctx, func() { signal.Stop(ch); close(ch); cancel(nil) }
}

// newRoot is the pipetrain command with every subcommand.
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "pipetrain",
		Short:         "Pipeline-parallel training: one process per stage, gRPC between them",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(launchCmd(), sampleCmd(), plotCmd(), stageCmd(), gatherCmd(), referenceCmd(), profileCmd(), simulateCmd(), planCmd(), validateCmd(), certsCmd())
	return root
}
