package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/profile"
)

func profileCmd() *cobra.Command {
	var skip int
	c := &cobra.Command{
		Use:   "profile RUN_DIR",
		Short: "Per-stage busy, idle and bubble time of a run, beside the schedule's theoretical bubble",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			info, events, err := profile.ReadRun(args[0])
			if err != nil {
				return err
			}
			r, err := profile.Analyse(info, events, skip)
			if err != nil {
				return err
			}
			return r.Write(os.Stdout)
		},
	}
	c.Flags().IntVar(&skip, "skip", 1, "leave out the first steps (warm-up)")
	return c
}
