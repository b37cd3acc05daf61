package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
)

// version is stamped by release builds (-ldflags "-X main.version=v1.2.3");
// otherwise the module's version or the source revision stands in.
var version = ""

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Say which pipetrain this is and what it computes with: BLAS, vector kernels, cores",
		Example: "  pipetrain version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			writeVersion(cmd.OutOrStdout())
			return nil
		},
	}
}

func writeVersion(w io.Writer) {
	fmt.Fprintf(w, "pipetrain %s, %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "%s\n", blas.Describe(0))
	if b := blas.Build(); b != "" {
		fmt.Fprintf(w, "%s\n", b)
	}
	fmt.Fprintf(w, "float32 kernels: %s\n", models.Kernels())
	fmt.Fprintf(w, "cores: %d\n", runtime.NumCPU())
}

// buildVersion is the stamped version, else the module version and the
// source revision the binary was built from.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown build)"
	}
	v := info.Main.Version
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (%.12s%s)", rev, modified)
	}
	return v
}
