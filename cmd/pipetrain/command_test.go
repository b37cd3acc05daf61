package main

import (
	"bytes"
	"testing"

	"github.com/spf13/cobra"
)

// runCommand runs a subcommand as the command line would, returning what it
// printed and its error (main exits 1 on an error).
func runCommand(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}
