package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/launcher"
	"github.com/pipetrain/pipetrain/stages"
)

func psServerCmd() *cobra.Command {
	var f runFlags
	var index int
	var resume bool
	c := &cobra.Command{
		Use:   "ps-server --config FILE --index I",
		Short: "Run one parameter server of a config with parameter_servers (launch runs these for you)",
		Example: `  # server 0 of a run whose replicas are workers of parameter servers
  pipetrain ps-server --config run.yaml --index 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.load()
			if err != nil {
				return refusedConfig{err}
			}
			return stages.ServePS(cmd.Context(), cfg, index, f.runDir, resume, os.Stdout)
		},
	}
	f.register(c, "runs/latest")
	c.Flags().IntVar(&index, "index", 0, "which server: 0 to parameter_servers.count-1")
	c.Flags().BoolVar(&resume, "resume", false, "start from this server's part of the newest complete checkpoint in the run directory")
	return c
}

// psServers are the parameter-server processes of a launch.
type psServers struct {
	cmds []*exec.Cmd
	wg   sync.WaitGroup
	mu   sync.Mutex // guards errs while the servers run
	errs []error
}

// announcePS says, once per launch, what becomes of an async run whose
// worker fails: restarted, it rejoins (recovery.max_restarts times per
// worker), or the run goes on without it.
func announcePS(cfg *configs.Config, out io.Writer) {
	if !cfg.PSEnabled() || cfg.ParameterServers.Mode != "async" || cfg.Replicas() < 2 {
		return
	}
	if rejoins(cfg) {
		fmt.Fprintf(out, "pipetrain: async parameter servers: a worker (replica 1-%d) whose process dies is restarted and rejoins the run\n", cfg.Replicas()-1)
		return
	}
	fmt.Fprintf(out, "pipetrain: async parameter servers: the run goes on without a worker (replica 1-%d) whose process dies\n", cfg.Replicas()-1)
}

// rejoins reports whether launch restarts an async worker whose process
// dies, to rejoin the run: its restarted processes find each other at
// their fixed addresses (a rendezvous hands its table out once), and the
// servers take it back unless max_staleness is 0 (see ps.Machine.Rejoin).
func rejoins(cfg *configs.Config) bool {
	p := cfg.ParameterServers
	return cfg.PSEnabled() && p.Mode == "async" && p.MaxStaleness > 0 && cfg.Replicas() > 1 && !cfg.UsesRendezvous() && cfg.Recovery.MaxRestarts > 0
}

// startPSServers starts the config's parameter servers for one attempt of
// the job, one process each, with the stages' binary, environment, extra
// arguments and run directory, resuming when the stages do, their output
// prefixed "[ps i] ". Without parameter_servers it starts nothing.
func startPSServers(cfg *configs.Config, o launcher.Options) (*psServers, error) {
	s := &psServers{}
	if !cfg.PSEnabled() {
		return s, nil
	}
	var mu sync.Mutex
	s.errs = make([]error, cfg.ParameterServers.Count)
	for i := range cfg.ParameterServers.Count {
		args := append([]string{"ps-server", "--config", cfg.Path, "--index", strconv.Itoa(i), "--run-dir", o.RunDir}, o.ExtraArgs...)
		if o.Resume {
			args = append(args, "--resume")
		}
		cmd := exec.Command(o.Binary, args...)
		cmd.Env = append(os.Environ(), o.Env...)
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		if err := cmd.Start(); err != nil {
			s.kill(io.Discard)
			return nil, fmt.Errorf("starting %s: %w", configs.PSName(i), err)
		}
		s.cmds = append(s.cmds, cmd)
		s.wg.Go(func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				mu.Lock()
				fmt.Fprintf(o.Out, "[ps %d] %s\n", i, sc.Text())
				mu.Unlock()
			}
		})
		s.wg.Go(func() {
			err := cmd.Wait()
			s.mu.Lock()
			s.errs[i] = err
			s.mu.Unlock()
			pw.Close()
		})
	}
	return s, nil
}

// kill ends the servers of a failed attempt at once: their workers are
// gone, so they would never finish. It says which servers had failed
// before, the likely cause of the stages' failure, which name only the
// server's address.
func (s *psServers) kill(out io.Writer) {
	s.mu.Lock()
	for i, err := range s.errs {
		if err != nil {
			fmt.Fprintf(out, "pipetrain: %s had failed (%v) before the stages did\n", configs.PSName(i), err)
		}
	}
	s.mu.Unlock()
	for _, c := range s.cmds {
		if c.Process != nil {
			c.Process.Kill()
		}
	}
	s.wg.Wait()
}

// stop waits a moment for the servers to finish on their own (they do
// once every worker has left), then kills those still running.
func (s *psServers) stop() error {
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		for _, c := range s.cmds {
			if c.Process != nil {
				c.Process.Kill()
			}
		}
		<-done
	}
	for i, err := range s.errs {
		if err != nil {
			return fmt.Errorf("%s: %w", configs.PSName(i), err)
		}
	}
	return nil
}

// printPS lists a config's parameter servers: where each listens and
// which stages' tensors it holds, the replicas then being their workers.
func printPS(out io.Writer, cfg *configs.Config) {
	if !cfg.PSEnabled() {
		return
	}
	shares, err := stages.PSShares(cfg)
	if err != nil {
		fmt.Fprintf(out, "  parameter servers: %v\n", err)
		return
	}
	ps := cfg.ParameterServers
	how := "sync"
	switch {
	case ps.Mode == "async":
		how = fmt.Sprintf("async, max_staleness %d", ps.MaxStaleness)
	case ps.Aggregate > 0 && ps.Aggregate < cfg.Replicas():
		how = fmt.Sprintf("sync, the first %d of %d workers' pushes each step", ps.Aggregate, cfg.Replicas())
	}
	fmt.Fprintf(out, "  parameter servers: %d (%s); the replicas are their workers, with no all-reduce ring\n", ps.Count, how)
	fmt.Fprintf(out, "    %-7s %-21s %-8s %s\n", "server", "address", "stages", "holds")
	for i, sh := range shares {
		st := fmt.Sprint(sh.Stages)
		fmt.Fprintf(out, "    %-7d %-21s %-8s %s, %s\n", i, psPlace(cfg, i), st[1:len(st)-1], words.Count(sh.Tensors, "tensor"), fmt.Sprintf("%.2f MB", float64(sh.Bytes)/1e6))
	}
}

// psPlace is where server i listens, or, for a server the rendezvous
// places, its rank.
func psPlace(cfg *configs.Config, i int) string {
	if cfg.PSRanks() {
		return fmt.Sprintf("rank %d (auto)", cfg.PSRank(i))
	}
	return cfg.PSAddress(i)
}
