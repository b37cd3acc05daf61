package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func launchCmd() *cobra.Command {
	var f runFlags
	c := &cobra.Command{
		Use:   "launch --config FILE",
		Short: "Run every stage of a config as its own process on this machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.load()
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			var extra []string
			if f.steps > 0 {
				extra = append(extra, "--steps", strconv.Itoa(f.steps))
			}
			fmt.Printf("pipetrain: %d stages of %s, run directory %s\n", len(cfg.Stages), cfg.Path, f.runDir)
			live := launcher.NewLive(f.runDir, len(cfg.Stages), 10)
			stopLive := make(chan struct{})
			go live.Follow(500*time.Millisecond, stopLive)
			defer close(stopLive)
			last := len(cfg.Stages) - 1
			err = launcher.Run(cmd.Context(), launcher.Options{
				Binary: exe, ConfigPath: cfg.Path, Stages: len(cfg.Stages), RunDir: f.runDir,
				ExtraArgs: extra, Out: os.Stdout,
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
			})
			if err != nil {
				return err
			}
			return printSummary(f.runDir)
		},
	}
	f.register(c, "")
	return c
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
		if err := json.Unmarshal(b, &ev); err == nil {
			fmt.Printf("pipetrain: test accuracy %.2f%% on %d test images\n", 100*ev.Accuracy, ev.Examples)
		}
	}
	fmt.Printf("pipetrain: see the bubble with: pipetrain profile %s\n", runDir)
	return nil
}
